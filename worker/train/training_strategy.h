// How the ranks of a job keep their models in step: the part of the
// training loop that differs between synchronous data parallelism (DDP:
// gradients averaged every step, one optimizer) and decentralized training
// (gossip: per-bucket optimizers stepped inside backward, parameters mixed
// with a few peers, the global average for evaluation and checkpoints).
// The training loop (trainer.cc) is written against this interface only.
//
// One step, as the loop drives it:
//   strategy->BeginStep();
//   for (int m = 0; m < strategy->accumulation_steps(); ++m) {
//     RETURN_IF_ERROR(strategy->BeforeForward());
//     at::Tensor loss = ...forward... / strategy->accumulation_steps();
//     ASSIGN_OR_RETURN(double waited, strategy->Backward(loss, m + 1 ==
//     strategy->accumulation_steps()));
//   }
//   RETURN_IF_ERROR(strategy->Step(step));
//
// Thread-safety: one training thread drives a strategy; its collectives
// must be called in the same order on every rank.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<TrainingStrategy> strategy,
//                    CreateTrainingStrategy(spec, *model, comm, progress));
//   strategy->set_total_steps(total_steps);
#ifndef CHORUS_WORKER_TRAIN_TRAINING_STRATEGY_H_
#define CHORUS_WORKER_TRAIN_TRAINING_STRATEGY_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chorus/communicator.h"
#include "chorus/v1/coordinator.pb.h"
#include "chorus/v1/job.pb.h"
#include "worker/runtime/training_progress.h"
#include "worker/train/checkpoint.h"
#include "worker/train/metrics_window.h"
#include "worker/train/model.h"

namespace torch::optim {
class Optimizer;
}

namespace chorus {

// How often decentralized ranks check (with one small all-reduce) whether
// any of them was asked to checkpoint.
inline constexpr int64_t kCheckpointRequestCheckSteps = 10;

// What each rank contributes to a checkpoint.
struct CheckpointParts {
  // Every rank stores its own model and optimizer state (decentralized
  // training with checkpoint.per_rank); otherwise rank 0 stores the one
  // model of all ranks.
  bool per_rank = false;
  // Ranks that store nothing still take part in every checkpoint (it is
  // taken of the global average, a collective).
  bool every_rank_joins = false;
};

class TrainingStrategy {
 public:
  virtual ~TrainingStrategy() = default;

  // Micro-batches whose gradients make one step (gradient accumulation).
  virtual int accumulation_steps() const = 0;
  // The run's length for the learning-rate schedule, known once the
  // starting point is. REQUIRES: called before the first Step().
  virtual void set_total_steps(int64_t total_steps) = 0;
  // The optimizers whose state a checkpoint holds, in a fixed order.
  virtual std::vector<torch::optim::Optimizer*> optimizers() const = 0;
  // Continues a restored run at `step`; `exchange` is what this rank had
  // received and not mixed in yet (empty when it is not the same rank's
  // own part of a per-rank checkpoint).
  virtual absl::Status Resume(int64_t step, ExchangeState exchange) = 0;

  // Before a step's first micro-batch.
  virtual void BeginStep() = 0;
  // Before each forward.
  virtual absl::Status BeforeForward() = 0;
  // Backward of one micro-batch's loss. The last micro-batch of a step
  // also synchronizes: DDP waits for the averaged gradients; decentralized
  // buckets mix, step their optimizers and launch their exchanges. Returns
  // the seconds spent waiting for communication.
  virtual absl::StatusOr<double> Backward(const at::Tensor& loss, bool last_micro_batch) = 0;
  // Ends step `step` (0-based): DDP clips the gradients and steps its
  // optimizer at the scheduled learning rate; decentralized training keeps
  // the global average every global_average_every_steps steps.
  virtual absl::Status Step(int64_t step) = 0;

  // Runs `body` (evaluation, a checkpoint of the one model) on the model
  // every rank agrees on: for decentralized training the global average,
  // after which each rank's own model comes back.
  virtual absl::Status WithGlobalAverage(const std::function<absl::Status()>& body) = 0;
  // After the last step: makes the agreed model the final one (kept).
  virtual absl::Status Finish() = 0;

  // The count of checkpoint requests this rank acts on after `step` steps,
  // given the `seen` requests this rank has counted; nullopt when this rank
  // does not check at this step. DDP: rank 0 alone stores, so it checks
  // every step on its own; decentralized ranks must agree, so every
  // kCheckpointRequestCheckSteps steps they all-reduce the highest count.
  virtual absl::StatusOr<std::optional<int64_t>> AgreedCheckpointRequests(int64_t step,
                                                                          int64_t seen) = 0;
  virtual CheckpointParts checkpoint_parts() const = 0;
  // What this rank's own part of a per-rank checkpoint holds besides the
  // model and the optimizers (Note [Exchange in checkpoints] in
  // sdk/decentralized_data_parallel.h).
  virtual absl::StatusOr<ExchangeState> TakeExchangeForCheckpoint() = 0;

  // Whether the ranks' models are the same after every step (DDP) or each
  // rank's own (decentralized). After a re-formed generation of an elastic
  // job shares the newest state, members of a strategy whose replicas
  // differ start from the mean of the models the survivors held (Note
  // [Re-formed gossip] in state_sync.h).
  virtual bool replicas_identical() const = 0;

  // A hot spare's (TrainingRanks in common/job_spec.h) step in place of BeginStep..Backward: takes
  // part in what the step does across all ranks, trains nothing. REQUIRES: a spare.
  virtual absl::Status SpareStep() = 0;

  // Adds the strategy's own figures for a report window to `metrics`.
  virtual void AddMetrics(const MetricsWindow::Summary& window, v1::Metrics& metrics) const = 0;
};

// The strategy spec.strategy names (DDP unless decentralized) over
// `model`'s parameters, with the optimizer spec.optimizer names; rank 0's
// parameters are broadcast so that every rank starts from the same model.
// Errors name the field at fault (INVALID_ARGUMENT) or the failed
// collective. `model`, `comm` and `progress` must outlive the strategy.
absl::StatusOr<std::unique_ptr<TrainingStrategy>> CreateTrainingStrategy(
    const v1::JobSpec& spec, Model& model, Communicator& comm, TrainingProgress& progress);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_TRAINING_STRATEGY_H_
