// CheckpointService: rank 0 streams a checkpoint in (Upload) or, with
// checkpoint.storage SHARED_DIR, writes it into the shared directory itself
// and asks for the commit (Commit); ranks and the CLI stream files out
// (Download). The logic is in CheckpointStore; the
// Scheduler says who may upload. With checkpoint.per_rank every rank uploads
// its own part; the parts wait here (staged, each file fsynced) and the
// upload that brings the last one commits them as one checkpoint. Parts of
// a step are dropped (deleted) when a part of a later step or another
// generation of the job arrives: that checkpoint can no longer complete.
//
// OpenUpload starts an upload whose bytes then arrive over the checkpoint
// data port (CheckpointDataServer, checkpoint/wire.h) instead of the
// Upload stream: the same checks, store and commit, fewer copies.
//
// Thread-safety: safe for concurrent calls; the store, scheduler and
// authorizer must outlive the service.
#ifndef CHORUS_COORDINATOR_CHECKPOINT_SERVICE_H_
#define CHORUS_COORDINATOR_CHECKPOINT_SERVICE_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "coordinator/auth_guard.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/scheduler.h"

namespace chorus {

class CheckpointServiceImpl final : public v1::CheckpointService::CallbackService {
 public:
  // Bytes per Download chunk.
  static constexpr size_t kChunkBytes = 4 << 20;

  // Calls need a worker (or admin) token when `auth` is enabled.
  CheckpointServiceImpl(CheckpointStore& store, Scheduler& scheduler, const TokenAuthorizer& auth = AllowAll())
      : store_(store), scheduler_(scheduler), auth_(auth) {}

  grpc::ServerReadReactor<v1::CheckpointChunk>* Upload(grpc::CallbackServerContext* context,
                                                       v1::UploadCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* OpenUpload(grpc::CallbackServerContext* context, const v1::OpenUploadRequest* request,
                                       v1::OpenUploadResponse* response) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* context, const v1::CommitCheckpointRequest* request,
                                   v1::UploadCheckpointResponse* response) override;
  grpc::ServerWriteReactor<v1::CheckpointChunk>* Download(grpc::CallbackServerContext* context,
                                                          const v1::DownloadCheckpointRequest* request) override;

  // Per-rank checkpoints: files `part` of `rank` for `grant`'s job and
  // step. Returns the ranks still missing, or, when `part` was the last,
  // commits and returns the manifest (ranks_missing 0).
  absl::StatusOr<v1::UploadCheckpointResponse> AddPart(const Scheduler::UploadGrant& grant, int64_t step, int rank,
                                                       std::unique_ptr<CheckpointStore::Upload> part);

  // An upload OpenUpload granted, waiting for the data connection that
  // presents its token.
  struct OpenedUpload {
    Scheduler::UploadGrant grant;
    int64_t step = 0;
    int rank = 0;
    std::unique_ptr<CheckpointStore::Upload> upload;
    absl::Time expires;
  };
  // How long a token stays valid unused.
  static constexpr absl::Duration kOpenedUploadTtl = absl::Minutes(1);
  // At most this many opened uploads wait at once.
  static constexpr size_t kMaxOpenedUploads = 64;
  // The port OpenUpload hands out; 0 (the default) = no data port, OpenUpload
  // answers UNIMPLEMENTED.
  void set_data_port(int port);
  // The upload `token` opened, taken (a token works once). PERMISSION_DENIED
  // for an unknown or expired token.
  absl::StatusOr<OpenedUpload> TakeOpened(absl::string_view token);
  // All files of an upload are in: commits it, or for per-rank checkpoints
  // adds it as `rank`'s part (AddPart).
  absl::StatusOr<v1::UploadCheckpointResponse> Complete(const Scheduler::UploadGrant& grant, int64_t step, int rank,
                                                        std::unique_ptr<CheckpointStore::Upload> upload);

 private:
  absl::StatusOr<v1::UploadCheckpointResponse> CommitStaged(const v1::CommitCheckpointRequest& request);

  struct Parts {
    int64_t generation = 0;
    // By rank; null where the part has not arrived.
    std::vector<std::unique_ptr<CheckpointStore::Upload>> by_rank;
  };

  absl::Mutex opened_mu_;
  int data_port_ ABSL_GUARDED_BY(opened_mu_) = 0;
  std::map<std::string, OpenedUpload> opened_ ABSL_GUARDED_BY(opened_mu_);  // by token
  // Drops opened uploads past their expiry (their staging is deleted).
  void ExpireOpenedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(opened_mu_);

  absl::Mutex parts_mu_;
  std::map<std::pair<std::string, int64_t>, Parts> parts_ ABSL_GUARDED_BY(parts_mu_);  // by (job, step)
  CheckpointStore& store_;
  Scheduler& scheduler_;
  const TokenAuthorizer& auth_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_CHECKPOINT_SERVICE_H_
