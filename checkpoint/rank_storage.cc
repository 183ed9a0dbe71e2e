#include "checkpoint/rank_storage.h"

#include <utility>

#include "checkpoint/coordinator_storage.h"
#include "checkpoint/shared_dir_storage.h"
#include "common/host_port.h"
#include "common/status_macros.h"

namespace chorus {

absl::StatusOr<std::unique_ptr<CheckpointStorage>> MakeRankCheckpointStorage(
    const std::shared_ptr<grpc::Channel>& channel, const v1::CheckpointSpec& spec,
    const std::string& coordinator, const std::string& job_id, int64_t generation, int rank) {
  if (spec.storage() == v1::CheckpointSpec::SHARED_DIR) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<SharedDirCheckpointStorage> storage,
        SharedDirCheckpointStorage::Create(channel, spec.shared_dir(), spec.shared_dir_namespace(),
                                           job_id, generation, rank));
    return std::unique_ptr<CheckpointStorage>(std::move(storage));
  }
  // Several coordinators: the data port of the one that leads, found when
  // it grants each upload.
  std::string host = CoordinatorCheckpointStorage::kHostThatAnswers;
  if (coordinator.find(',') == std::string::npos) {
    absl::StatusOr<HostPort> address = ParseHostPort(coordinator);
    host = address.ok() ? address->host : "";
  }
  return std::unique_ptr<CheckpointStorage>(
      std::make_unique<CoordinatorCheckpointStorage>(channel, job_id, generation, rank, host));
}

}  // namespace chorus
