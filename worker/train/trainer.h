// The training loop a rank process runs for a job: model and data from the
// JobSpec, DDP over the job's communicator, optimizer and LR schedule,
// evaluation on the test split with metrics all-reduced so every rank agrees.
//
// Supported today: models mlp, cnn, transformer_lm and torchscript; data
// fashion_mnist, synthetic (classification, regression, tokens) and
// tensor_file; optimizers sgd, adam, adamw; schedules
// constant, cosine with warmup, step; losses cross_entropy and mse; gradient
// accumulation; global-norm clipping; strategy ddp; fault injection EXIT,
// CRASH, HANG and SLOW. Anything else returns
// UNIMPLEMENTED naming the field (CheckRuntimeSupport refuses it at submit).
//
// Example:
//   ASSIGN_OR_RETURN(v1::Metrics final, Train(spec, *comm, [](const v1::Metrics& m) {...}));
#ifndef CHORUS_WORKER_TRAIN_TRAINER_H_
#define CHORUS_WORKER_TRAIN_TRAINER_H_

#include <atomic>
#include <functional>

#include "absl/status/statusor.h"
#include "chorus/v1/coordinator.pb.h"
#include "worker/comm/communicator.h"
#include "worker/train/checkpoint.h"

namespace chorus {

using MetricsCallback = std::function<void(const v1::Metrics&)>;

// What the training loop is doing, for heartbeats; updated by the training
// thread, read by any other.
struct TrainingProgress {
  std::atomic<int64_t> step{0};
  std::atomic<int64_t> epoch{0};
  std::atomic<int> phase{v1::SETUP};
  std::atomic<int64_t> phase_since_us{0};
  std::atomic<double> step_seconds{0};
  // Step time minus the wait for gradient synchronization.
  std::atomic<double> compute_seconds{0};
  // Counted from outside (`chorus checkpoint`: the agent signals the rank):
  // checkpoint requests so far. The trainer checkpoints once per new
  // count: DDP at the end of the current step (rank 0 stores);
  // decentralized at the next step that is a multiple of
  // kCheckpointRequestCheckSteps, where the ranks agree on it.
  std::atomic<int64_t> checkpoint_request{0};

  void Enter(v1::Phase p);
};

// How often decentralized ranks check (with one small all-reduce) whether
// any of them was asked to checkpoint.
inline constexpr int64_t kCheckpointRequestCheckSteps = 10;

struct TrainOptions {
  // Where rank 0 stores checkpoints (every checkpoint.every_steps and at the
  // end) and where every rank loads `resume` from; null = no checkpoints.
  CheckpointStorage* checkpoints = nullptr;
  // The checkpoint to start from; empty job_id = from scratch.
  v1::CheckpointManifest resume;
};

// Trains `spec` (normalized) as rank comm.rank() of comm.size(). Calls
// `report` every training.log_every_steps steps and after each evaluation.
// Returns the final metrics (test loss/accuracy of the final model).
// `progress` may be null.
absl::StatusOr<v1::Metrics> Train(const v1::JobSpec& spec, Communicator& comm,
                                  const MetricsCallback& report,
                                  TrainingProgress* progress = nullptr,
                                  const TrainOptions& options = {});

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_TRAINER_H_
