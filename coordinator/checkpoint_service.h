// CheckpointService: rank 0 streams a checkpoint in (Upload), ranks and the
// CLI stream files out (Download). The logic is in CheckpointStore; the
// Scheduler says who may upload.
//
// Thread-safety: safe for concurrent calls; the store, scheduler and
// authorizer must outlive the service.
#ifndef CHORUS_COORDINATOR_CHECKPOINT_SERVICE_H_
#define CHORUS_COORDINATOR_CHECKPOINT_SERVICE_H_

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
  grpc::ServerWriteReactor<v1::CheckpointChunk>* Download(grpc::CallbackServerContext* context,
                                                          const v1::DownloadCheckpointRequest* request) override;

 private:
  CheckpointStore& store_;
  Scheduler& scheduler_;
  const TokenAuthorizer& auth_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_CHECKPOINT_SERVICE_H_
