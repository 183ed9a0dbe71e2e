// The training loop a rank process runs for a job: model and data from the
// JobSpec, a TrainingStrategy over the job's communicator (DDP, or
// decentralized gossip averaging), optimizer and LR schedule, periodic and
// requested checkpoints, evaluation on the test split with metrics
// all-reduced so every rank agrees.
//
// Supported today: models mlp, cnn, transformer_lm and torchscript; data
// fashion_mnist, synthetic (classification, regression, tokens) and
// tensor_file; optimizers sgd, adam, adamw, accum_adam(w); schedules
// constant, cosine with warmup, step; losses cross_entropy and mse; gradient
// accumulation (DDP); global-norm clipping; strategies ddp and decentralized
// (topologies complete, ring, one-peer exponential, alternating exponential
// ring, custom; per-rank checkpoints); fault injection EXIT, CRASH, STOP,
// HANG, SLOW, SKIP_COLLECTIVE and MISMATCH_COLLECTIVE. On the CPU with a
// Gloo communicator, or with resources.device CUDA on the communicator's GPU
// (NCCL): model, optimizer state and batches on the device, checkpoints
// copied off it asynchronously (Note [Asynchronous device snapshots] in
// checkpoint.h). A communicator on the other kind of device than the spec's
// is FAILED_PRECONDITION.
//
// Thread-safety: Train runs on the calling thread; `progress` may be read
// by any other thread while it runs.
//
// Example:
//   ASSIGN_OR_RETURN(v1::Metrics final, Train(spec, *comm, [](const v1::Metrics& m) {...}));
#ifndef CHORUS_WORKER_TRAIN_TRAINER_H_
#define CHORUS_WORKER_TRAIN_TRAINER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "chorus/communicator.h"
#include "chorus/v1/coordinator.pb.h"
#include "worker/runtime/training_progress.h"
#include "worker/train/checkpoint.h"

namespace chorus {

using MetricsCallback = std::function<void(const v1::Metrics&)>;

// A generation of an elastic job as this rank joined it (docs/elastic.md).
struct Generation {
  Communicator* comm = nullptr;
  CheckpointStorage* checkpoints = nullptr;  // null = no checkpoints
  int64_t generation = 1;
  // The checkpoint the generation starts from when no member holds training
  // state, as the coordinator told all its members: the job's newest
  // committed checkpoint, else the one the job was submitted to resume
  // from; empty job_id: the seeded initial model (Note [Starting over] in
  // trainer.cc). The first generation always starts from it.
  v1::CheckpointManifest resume;
};

// Called when a collective fails in an elastic job (a member was lost):
// aborts the failed communicator, joins the next generation and returns it.
// An error ends training with it.
using RejoinFunction = std::function<absl::StatusOr<Generation>(const absl::Status& failure)>;

struct TrainOptions {
  // Where rank 0 stores checkpoints (every checkpoint.every_steps and at the
  // end) and where every rank loads `resume` from; null = no checkpoints.
  CheckpointStorage* checkpoints = nullptr;
  // The checkpoint to start from; empty job_id = from scratch.
  v1::CheckpointManifest resume;
  // The generation `comm` belongs to. A rank that starts in a generation
  // after the first (a newcomer to an elastic job) receives the training
  // state from a member that holds it instead of loading `resume` (which it
  // loads only when no member holds any: Note [Starting over] in
  // trainer.cc).
  int64_t generation = 1;
  // Elastic jobs: how this rank carries on after a lost member; null = a
  // failed collective ends training.
  RejoinFunction rejoin;
  // Test mode: a directory for this rank's SampleTrace (sample_trace.h);
  // empty = none.
  std::string sample_trace_dir;
  // Test mode: a file this rank waits for, once it has loaded its data and
  // built its model and before its first collective, so that an end-to-end
  // test can lose a rank while the others have not trained a step; empty =
  // none. Waits at most 10 minutes (then FAILED_PRECONDITION).
  std::string setup_gate;
};

// Trains `spec` (normalized) as rank comm.rank() of comm.size(). When a
// collective fails and options.rejoin is set, the model, optimizer state and
// position stay in memory, the rank joins the next generation, the members
// agree on the newest state (worker/train/state_sync.h) and training goes
// on with the rest of the epoch re-sharded among them; when no member holds
// any, the generation starts over from the job's starting point (Note
// [Starting over] in trainer.cc). Calls
// `report` every training.log_every_steps steps and after each evaluation.
// Returns the final metrics (test loss/accuracy of the final model).
// `progress` may be null.
absl::StatusOr<v1::Metrics> Train(const v1::JobSpec& spec, Communicator& comm,
                                  const MetricsCallback& report,
                                  TrainingProgress* progress = nullptr,
                                  const TrainOptions& options = {});

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_TRAINER_H_
