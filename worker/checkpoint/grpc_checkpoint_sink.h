// GrpcCheckpointSink: a CheckpointSink over the coordinator's
// CheckpointService — Store uploads a checkpoint's files in 4 MB chunks as
// they are serialized, each chunk with its CRC-32C (and each file's size and
// CRC-32C with its last chunk); Load downloads the files of a committed
// checkpoint and checks them against the manifest.
//
// Thread-safety: calls may come from any thread; the channel is shared.
//
// Example:
//   GrpcCheckpointSink sink(channel, "job-000001", /*generation=*/1, /*rank=*/0);
//   TrainOptions options;
//   options.checkpoints = &sink;
#ifndef CHORUS_WORKER_CHECKPOINT_GRPC_CHECKPOINT_SINK_H_
#define CHORUS_WORKER_CHECKPOINT_GRPC_CHECKPOINT_SINK_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "worker/train/checkpoint.h"

namespace chorus {

class GrpcCheckpointSink : public CheckpointSink {
 public:
  static constexpr size_t kChunkBytes = 4 << 20;

  GrpcCheckpointSink(std::shared_ptr<grpc::Channel> channel, std::string job_id, int64_t generation, int rank,
                     absl::Duration timeout = absl::Minutes(10));

  absl::Status Store(int64_t step, const std::vector<CheckpointFileSource>& files) override;
  absl::StatusOr<std::vector<CheckpointFileData>> Load(const v1::CheckpointManifest& manifest) override;

 private:
  std::unique_ptr<v1::CheckpointService::Stub> stub_;
  const std::string job_id_;
  const int64_t generation_;
  const int rank_;
  const absl::Duration timeout_;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_CHECKPOINT_GRPC_CHECKPOINT_SINK_H_
