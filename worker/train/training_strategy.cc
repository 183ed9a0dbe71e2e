#include "worker/train/training_strategy.h"

#include "worker/train/ddp_strategy.h"
#include "worker/train/decentralized_strategy.h"

namespace chorus {

absl::StatusOr<std::unique_ptr<TrainingStrategy>> CreateTrainingStrategy(
    const v1::JobSpec& spec, Model& model, Communicator& comm, TrainingProgress& progress) {
  if (spec.strategy().has_decentralized())
    return CreateDecentralizedStrategy(spec, model, comm, progress);
  return CreateDdpStrategy(spec, model, comm, progress);
}

}  // namespace chorus
