// SharedDirCheckpointStorage: checkpoint.storage SHARED_DIR. Store writes the
// checkpoint's files straight into the job's shared directory — into
// <shared_dir>/<job>/.staging-<step>-r<rank>-<pid>-<n>/, each file fsynced,
// then the directory — and asks the coordinator to commit them (Commit RPC:
// it checks every file's size and CRC-32C, renames the directory to
// <shared_dir>/<job>/<step> and records the manifest). No checkpoint byte
// crosses the network to the coordinator. Load reads a committed
// checkpoint from its directory when this host sees it (checking sizes and
// checksums), else downloads it from the coordinator.
//
// Thread-safety: Store and Load may be called from any thread, one Store at
// a time (the rank's CheckpointWriter guarantees that).
//
// Example:
//   ASSIGN_OR_RETURN(auto storage, SharedDirCheckpointStorage::Create(
//       channel, "/mnt/ckpt", "job-000001", /*generation=*/1, /*rank=*/0));
//   TrainOptions options;
//   options.checkpoints = storage.get();
#ifndef CHORUS_CHECKPOINT_SHARED_DIR_STORAGE_H_
#define CHORUS_CHECKPOINT_SHARED_DIR_STORAGE_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "checkpoint/coordinator_storage.h"
#include "checkpoint/storage.h"
#include "chorus/v1/coordinator.grpc.pb.h"

namespace chorus {

class SharedDirCheckpointStorage : public CheckpointStorage {
 public:
  // Creates <shared_dir>/<space>/<job_id>/ if needed (space: the spec's
  // shared_dir_namespace, the coordinator's cluster id; none when empty);
  // FAILED_PRECONDITION naming checkpoint.shared_dir when that is impossible
  // (shared_dir not mounted here, not writable), so a misconfigured job
  // fails at start, not at its first checkpoint.
  static absl::StatusOr<std::unique_ptr<SharedDirCheckpointStorage>> Create(
      std::shared_ptr<grpc::Channel> channel, const std::string& shared_dir,
      const std::string& space, std::string job_id, int64_t generation, int rank,
      absl::Duration timeout = absl::Minutes(10));

  absl::Status Store(int64_t step, const std::vector<CheckpointFileSource>& files) override;
  absl::StatusOr<std::vector<CheckpointFileData>> Load(
      const v1::CheckpointManifest& manifest) override;

 private:
  SharedDirCheckpointStorage(std::shared_ptr<grpc::Channel> channel, std::string job_dir,
                             std::string job_id, int64_t generation, int rank,
                             absl::Duration timeout);

  std::unique_ptr<v1::CheckpointService::Stub> stub_;
  CoordinatorCheckpointStorage download_;  // Load when the directory is not visible here
  const std::string job_dir_;
  const std::string job_id_;
  const int64_t generation_;
  const int rank_;
  const absl::Duration timeout_;
  std::atomic<int64_t> next_staging_{0};
  std::unique_ptr<char[]> bounce_;  // Store's write buffer (one Store at a time)
};

}  // namespace chorus

#endif  // CHORUS_CHECKPOINT_SHARED_DIR_STORAGE_H_
