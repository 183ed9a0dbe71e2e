// CoordinatorCheckpointStorage: checkpoint.storage COORDINATOR, a
// CheckpointStorage over the coordinator's CheckpointService — Store uploads a checkpoint's files
// in chunks of up to 4 MB as they are serialized, each chunk with its CRC-32C (and each file's size
// and CRC-32C with its last chunk); Load downloads the files of a committed checkpoint and checks
// them against the manifest.
//
// Uploads go over the coordinator's checkpoint data port when it has one
// (OpenUpload, then a TCP connection to that port on `coordinator_host`:
// checkpoint/wire.h), else over the Upload stream: when it has none
// (from then on), when it is busy (RESOURCE_EXHAUSTED: this upload), and
// when the port cannot be reached (for kDataPortRetryAfter, unless the
// stream cannot reach the coordinator either: then it is away altogether).
//
// Every failure to reach the coordinator — a refused or cut connection on
// either path, a data-port token the coordinator no longer knows (it
// restarted after OpenUpload) — is UNAVAILABLE, so that the caller can tell
// it from a refusal and try again later (checkpoint/store_retry.h).
//
// Thread-safety: calls may come from any thread; the channel is shared.
//
// Example:
//   CoordinatorCheckpointStorage storage(channel, "job-000001", /*generation=*/1, /*rank=*/0,
//                                        /*coordinator_host=*/"127.0.0.1");
//   TrainOptions options;
//   options.checkpoints = &storage;
#ifndef CHORUS_CHECKPOINT_COORDINATOR_STORAGE_H_
#define CHORUS_CHECKPOINT_COORDINATOR_STORAGE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "checkpoint/storage.h"
#include "chorus/v1/coordinator.grpc.pb.h"

namespace chorus {

class CoordinatorCheckpointStorage : public CheckpointStorage {
 public:
  static constexpr size_t kChunkBytes = 4 << 20;
  static constexpr absl::Duration kDataPortConnectTimeout = absl::Seconds(5);
  static constexpr absl::Duration kDataPortRetryAfter = absl::Minutes(10);

  // `coordinator_host`: the host of the coordinator's address (as in the
  // channel's target: ParseHostPort's host), where its data port is; empty =
  // upload over the Upload stream only; kHostThatAnswers = the host of
  // whichever coordinator answered OpenUpload (the leader, on a channel over
  // several coordinators).
  static constexpr char kHostThatAnswers[] = "*";
  CoordinatorCheckpointStorage(std::shared_ptr<grpc::Channel> channel, std::string job_id,
                               int64_t generation, int rank, std::string coordinator_host = "",
                               absl::Duration timeout = absl::Minutes(10));

  absl::Status Store(int64_t step, const std::vector<CheckpointFileSource>& files) override;
  absl::StatusOr<std::vector<CheckpointFileData>> Load(
      const v1::CheckpointManifest& manifest) override;

 private:
  std::unique_ptr<v1::CheckpointService::Stub> stub_;
  const std::string job_id_;
  const int64_t generation_;
  const int rank_;
  const absl::Duration timeout_;
  const std::string coordinator_host_;
  absl::Mutex mu_;
  // Uploads use the stream until then (InfiniteFuture: the coordinator has
  // no data port).
  absl::Time data_port_off_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  // Why an upload went over the stream after all.
  enum class Fallback { kNone, kNoDataPort, kBusy, kUnreachable };
  // Over the data port. Sets *fell_back (and returns OK) when the coordinator
  // has no data port, it is busy or it cannot be reached; nothing was
  // uploaded then.
  absl::Status StoreOverDataPort(int64_t step, const std::vector<CheckpointFileSource>& files,
                                 Fallback* fell_back);
  absl::Status StoreOverStream(int64_t step, const std::vector<CheckpointFileSource>& files);
  // Asks for a data port upload: `opened` and the `host` to dial, or
  // *fell_back set (and OK) when the upload must go over the stream.
  absl::Status OpenDataUpload(int64_t step, v1::OpenUploadResponse* opened, std::string* host,
                              Fallback* fell_back);
};

// The host of a gRPC peer as ClientContext::peer() gives it
// ("ipv4:10.0.0.1:29650", "ipv6:[::1]:29650", "ipv6:%5B::1%5D:29650");
// empty when it is not an IP peer.
std::string PeerHost(const std::string& peer);

}  // namespace chorus

#endif  // CHORUS_CHECKPOINT_COORDINATOR_STORAGE_H_
