// Where a rank's checkpoints go, as its job's spec says: the shared
// directory of checkpoint.storage SHARED_DIR (every rank writes its files
// there and the coordinator commits them), else the coordinator itself
// (uploads over its data port, or over gRPC). For chorus-rank and for SDK
// programs.
//
// Thread-safety: a free function.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStorage> storage,
//                    MakeRankCheckpointStorage(channel, spec.checkpoint(), "10.0.0.5:29650",
//                                              "job-000003", /*generation=*/1, /*rank=*/0));
#ifndef CHORUS_CHECKPOINT_RANK_STORAGE_H_
#define CHORUS_CHECKPOINT_RANK_STORAGE_H_

#include <grpcpp/channel.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/storage.h"
#include "chorus/v1/job.pb.h"

namespace chorus {

// `coordinator`: the coordinator's address as given to the rank; its host
// is where the data port is (a target that is not HOST:PORT, such as unix:
// or dns:///, gets none and uploads over gRPC). FAILED_PRECONDITION naming
// checkpoint.shared_dir when that directory cannot be used here.
absl::StatusOr<std::unique_ptr<CheckpointStorage>> MakeRankCheckpointStorage(
    const std::shared_ptr<grpc::Channel>& channel, const v1::CheckpointSpec& spec,
    const std::string& coordinator, const std::string& job_id, int64_t generation, int rank);

}  // namespace chorus

#endif  // CHORUS_CHECKPOINT_RANK_STORAGE_H_
