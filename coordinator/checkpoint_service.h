// CheckpointService: the gRPC adapter of checkpoint storage. Rank 0 (every
// rank with checkpoint.per_rank) streams a checkpoint in (Upload), or opens
// an upload whose bytes then come over the checkpoint data port
// (OpenUpload, CheckpointDataServer), or with checkpoint.storage SHARED_DIR
// writes it into the shared directory itself and asks for the commit
// (Commit); ranks and the CLI stream files out (Download). Grants, staging,
// per-rank parts and commits are CheckpointUploads' (checkpoint_uploads.h);
// this class maps calls and statuses.
//
// Thread-safety: safe for concurrent calls; the store, uploads and
// authorizer must outlive the service.
//
// Example:
//   CheckpointServiceImpl service(store, uploads, auth);
//   builder.RegisterService(&service);
#ifndef CHORUS_COORDINATOR_CHECKPOINT_SERVICE_H_
#define CHORUS_COORDINATOR_CHECKPOINT_SERVICE_H_

#include <string>

#include "chorus/v1/coordinator.grpc.pb.h"
#include "coordinator/auth_guard.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/checkpoint_uploads.h"

namespace chorus {

class CheckpointServiceImpl final : public v1::CheckpointService::CallbackService {
 public:
  // Bytes per Download chunk.
  static constexpr size_t kChunkBytes = 4 << 20;

  // Calls need a worker (or admin) token when `auth` is enabled.
  CheckpointServiceImpl(CheckpointStore& store, CheckpointUploads& uploads,
                        const TokenAuthorizer& auth = AllowAll())
      : store_(store), uploads_(uploads), auth_(auth) {}

  grpc::ServerReadReactor<v1::CheckpointChunk>* Upload(
      grpc::CallbackServerContext* context, v1::UploadCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* OpenUpload(grpc::CallbackServerContext* context,
                                       const v1::OpenUploadRequest* request,
                                       v1::OpenUploadResponse* response) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* context,
                                   const v1::CommitCheckpointRequest* request,
                                   v1::UploadCheckpointResponse* response) override;
  grpc::ServerWriteReactor<v1::CheckpointChunk>* Download(
      grpc::CallbackServerContext* context, const v1::DownloadCheckpointRequest* request) override;

 private:
  CheckpointStore& store_;
  CheckpointUploads& uploads_;
  const TokenAuthorizer& auth_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_CHECKPOINT_SERVICE_H_
