// CheckpointService: the gRPC adapter of checkpoint storage. Rank 0 (every
// rank with checkpoint.per_rank) streams a checkpoint in (Upload), or opens
// an upload whose bytes then come over the checkpoint data port
// (OpenUpload, CheckpointDataServer), or with checkpoint.storage SHARED_DIR
// writes it into the shared directory itself and asks for the commit
// (Commit); ranks and the CLI stream files out (Download). Grants, staging,
// per-rank parts and commits are CheckpointUploads' (checkpoint_uploads.h);
// this class maps calls and statuses.
//
// Authorization: a worker or admin token may do everything here; a job's
// credential (Note [Job credentials] in common/job_credentials.h) may upload,
// commit and download its own job's checkpoints, and download the
// checkpoint its job resumes from (Note [Reading the checkpoint a job
// resumes from]).
//
// Thread-safety: safe for concurrent calls; the store, uploads and
// authorizer must outlive the service.
//
// Example:
//   CheckpointServiceImpl service(store, uploads, auth);
//   builder.RegisterService(&service);
#ifndef CHORUS_COORDINATOR_SERVICE_CHECKPOINT_SERVICE_H_
#define CHORUS_COORDINATOR_SERVICE_CHECKPOINT_SERVICE_H_

#include <functional>
#include <string>
#include <utility>

#include "chorus/v1/coordinator.grpc.pb.h"
#include "coordinator/checkpoint/checkpoint_store.h"
#include "coordinator/checkpoint/checkpoint_uploads.h"
#include "coordinator/service/auth_guard.h"

namespace chorus {

class CheckpointServiceImpl final : public v1::CheckpointService::CallbackService {
 public:
  // Bytes per Download chunk.
  static constexpr size_t kChunkBytes = 4 << 20;

  // A job's resume_from ("SOURCE" or "SOURCE:STEP"; empty: none, or an
  // unknown job).
  using ResumeFromOf = std::function<std::string(const std::string& job_id)>;

  // A job's owner (Job.owner); NOT_FOUND for an unknown job.
  using OwnerOf = std::function<absl::StatusOr<std::string>(const std::string& job_id)>;

  // Calls need an agent or admin token, or the credential of the job they
  // name, when `auth` is enabled; downloads also take a user token for the
  // user's own jobs (Note [Roles and owners] in common/auth.h), and not an
  // agent's. `resume_from_of` (may be null: job credentials then read
  // their own job's checkpoints only) tells which other job's checkpoint a
  // job's credential may read; `owner_of` (may be null: users download
  // nothing) whose jobs a user's are.
  CheckpointServiceImpl(CheckpointStore& store, CheckpointUploads& uploads,
                        const TokenAuthorizer& auth = AllowAll(),
                        ResumeFromOf resume_from_of = nullptr, OwnerOf owner_of = nullptr)
      : store_(store),
        uploads_(uploads),
        auth_(auth),
        resume_from_of_(std::move(resume_from_of)),
        owner_of_(std::move(owner_of)) {}

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
  // OK if `caller` may download what `request` names.
  absl::Status MayDownload(const Caller& caller,
                           const v1::DownloadCheckpointRequest& request) const;

  CheckpointStore& store_;
  CheckpointUploads& uploads_;
  const TokenAuthorizer& auth_;
  const ResumeFromOf resume_from_of_;
  const OwnerOf owner_of_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SERVICE_CHECKPOINT_SERVICE_H_
