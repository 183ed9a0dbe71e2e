// The TrainingStrategy of synchronous data parallelism: DDP
// (sdk/distributed_data_parallel.h) averages the gradients, one
// optimizer steps every rank's replica identically, rank 0 stores
// checkpoints.
//
// Thread-safety: as TrainingStrategy.
//
// Example:
//   ASSIGN_OR_RETURN(auto strategy, CreateDdpStrategy(spec, *model, comm, progress));
#ifndef CHORUS_WORKER_TRAIN_DDP_STRATEGY_H_
#define CHORUS_WORKER_TRAIN_DDP_STRATEGY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/train/training_strategy.h"

namespace chorus {

// From spec.strategy.ddp (defaults apply to an unset strategy).
// INVALID_ARGUMENT for grad_accum_steps < 1 or what DDP refuses.
absl::StatusOr<std::unique_ptr<TrainingStrategy>> CreateDdpStrategy(const v1::JobSpec& spec,
                                                                    Model& model,
                                                                    Communicator& comm,
                                                                    TrainingProgress& progress);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_DDP_STRATEGY_H_
