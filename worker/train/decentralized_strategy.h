// The TrainingStrategy of decentralized training: the gossip engine
// (sdk/decentralized_data_parallel.h) owns one optimizer
// per bucket and steps it inside backward, each rank mixes its parameters
// with its peers', and evaluation and checkpoints see the exact global
// average (or, with checkpoint.per_rank, every rank stores its own model).
//
// Thread-safety: as TrainingStrategy.
//
// Example:
//   ASSIGN_OR_RETURN(auto strategy, CreateDecentralizedStrategy(spec, *model, comm, progress));
#ifndef CHORUS_WORKER_TRAIN_DECENTRALIZED_STRATEGY_H_
#define CHORUS_WORKER_TRAIN_DECENTRALIZED_STRATEGY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/train/training_strategy.h"

namespace chorus {

// From spec.strategy.decentralized. INVALID_ARGUMENT for what the engine
// refuses (a topology that cannot serve comm.size() ranks, a bucket cap
// that is not positive).
absl::StatusOr<std::unique_ptr<TrainingStrategy>> CreateDecentralizedStrategy(
    const v1::JobSpec& spec, Model& model, Communicator& comm, TrainingProgress& progress);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_DECENTRALIZED_STRATEGY_H_
