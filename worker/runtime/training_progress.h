// What the training loop is doing, for heartbeats: its step, epoch and
// phase, recent step times, and the checkpoint requests counted from
// outside.
//
// It lives in worker/runtime, beside the heartbeat composition that reads
// it, rather than in worker/train: the built-in trainer keeps one, and so
// does an SDK program's ProgressReporter (sdk/progress.h), and neither the
// SDK nor the runtime depends on the trainer.
//
// Thread-safety: every field is atomic; the training thread writes, any
// other thread (heartbeats, a signal handler counting requests) reads or
// counts.
//
// Example:
//   TrainingProgress progress;
//   progress.Enter(v1::FORWARD);
//   heartbeat.set_phase(static_cast<v1::Phase>(progress.phase.load()));
#ifndef CHORUS_WORKER_RUNTIME_TRAINING_PROGRESS_H_
#define CHORUS_WORKER_RUNTIME_TRAINING_PROGRESS_H_

#include <atomic>
#include <cstdint>

#include "chorus/v1/coordinator.pb.h"

namespace chorus {

struct TrainingProgress {
  std::atomic<int64_t> step{0};
  std::atomic<int64_t> epoch{0};
  std::atomic<int> phase{v1::SETUP};
  std::atomic<int64_t> phase_since_us{0};
  std::atomic<double> step_seconds{0};
  // Step time minus the wait for gradient synchronization.
  std::atomic<double> compute_seconds{0};
  // Per step: the wait for the other ranks in gradient synchronization
  // (from arriving at it to its end), the straggler attribution's input.
  std::atomic<double> comm_wait_seconds{0};
  // Over the last report window: mean loss per step and this rank's own
  // samples per second.
  std::atomic<double> loss{0};
  std::atomic<double> samples_per_second{0};
  // Counted from outside (`chorus checkpoint`: the agent signals the rank):
  // checkpoint requests so far. The trainer checkpoints once per new
  // count: DDP at the end of the current step (rank 0 stores);
  // decentralized at the next step that is a multiple of
  // kCheckpointRequestCheckSteps (worker/train/training_strategy.h), where
  // the ranks agree on it.
  std::atomic<int64_t> checkpoint_request{0};
  // The coordinator's CHECKPOINT_AND_HOLD (a preemption that re-queues the
  // job): set before checkpoint_request is raised, so the step that takes
  // the requested checkpoint sees it and the rank trains no further.
  std::atomic<bool> hold_after_checkpoint{false};
  // Elastic jobs: the newest generation the coordinator asked this rank to
  // re-form into at its next step boundary (REFORM_AT_STEP_BOUNDARY; a drain
  // or a growth) and the world size planned for it, packed
  // (PackReformRequest in worker/train/step_boundary.h). The ranks agree on
  // the boundary with one small all-reduce at the start of every step (Note
  // [Step boundary] in worker/train/trainer.cc).
  std::atomic<int64_t> reform_request{0};

  // Sets `phase` and stamps when it began (wall clock).
  void Enter(v1::Phase p);
};

}  // namespace chorus

#endif  // CHORUS_WORKER_RUNTIME_TRAINING_PROGRESS_H_
