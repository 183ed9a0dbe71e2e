#include "coordinator/checkpoint/checkpoint_uploads.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/wire.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace chorus {

CheckpointUploads::CheckpointUploads(CheckpointStore& store, Granter grant, Clock* clock)
    : store_(store), grant_(std::move(grant)), clock_(clock ? clock : &real_clock_) {}

absl::StatusOr<CheckpointUploads::Started> CheckpointUploads::Begin(const std::string& job_id,
                                                                    int64_t generation, int rank,
                                                                    int64_t step) {
  Started started;
  ASSIGN_OR_RETURN(started.grant, grant_(job_id, generation, rank));
  ASSIGN_OR_RETURN(started.upload, store_.BeginUpload(job_id, step));
  started.step = step;
  started.rank = rank;
  return started;
}

absl::StatusOr<v1::UploadCheckpointResponse> CheckpointUploads::Complete(Started started) {
  if (started.grant.manifest.per_rank()) return AddPart(std::move(started));
  v1::UploadCheckpointResponse response;
  ASSIGN_OR_RETURN(*response.mutable_manifest(),
                   started.upload->Commit(started.grant.manifest, started.grant.keep_last));
  LOG(INFO) << "checkpoint " << response.manifest().job_id() << " step "
            << response.manifest().step() << " committed (" << response.manifest().files_size()
            << " file(s))" << (response.manifest().directory().empty() ? "" : " in ")
            << response.manifest().directory();
  return response;
}

absl::StatusOr<v1::UploadCheckpointResponse> CheckpointUploads::CommitStaged(
    const v1::CommitCheckpointRequest& request) {
  Started started;
  ASSIGN_OR_RETURN(started.grant, grant_(request.job_id(), request.generation(), request.rank()));
  if (started.grant.shared_dir.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", request.job_id(),
                     " stores its checkpoints on the coordinator (checkpoint.storage "
                     "COORDINATOR): upload them; Commit is for storage SHARED_DIR"));
  }
  std::vector<v1::CheckpointFile> files(request.files().begin(), request.files().end());
  ASSIGN_OR_RETURN(started.upload,
                   store_.AdoptStaged(started.grant.shared_dir, request.job_id(), request.step(),
                                      request.staging_dir(), files));
  started.step = request.step();
  started.rank = request.rank();
  return Complete(std::move(started));
}

absl::StatusOr<v1::UploadCheckpointResponse> CheckpointUploads::AddPart(Started part) {
  const std::string& job = part.grant.manifest.job_id();
  const int64_t step = part.step;
  const int rank = part.rank;
  const int world = part.grant.manifest.world_size();
  std::vector<std::unique_ptr<CheckpointStore::Upload>> complete;
  v1::UploadCheckpointResponse response;
  {
    absl::MutexLock lock(&parts_mu_);
    // Parts that can no longer be completed: earlier steps, or another
    // generation (its ranks are gone or renumbered).
    for (auto it = parts_.lower_bound({job, 0}); it != parts_.end() && it->first.first == job;) {
      if (it->first.second < step || it->second.generation != part.grant.manifest.generation()) {
        LOG(WARNING) << "checkpoint " << job << " step " << it->first.second
                     << ": dropping the per-rank parts received so far (superseded before every "
                        "rank uploaded)";
        it = parts_.erase(it);
      } else {
        ++it;
      }
    }
    if (rank < 0 || rank >= world)
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: bad rank ", rank));
    Parts& parts = parts_[{job, step}];
    parts.generation = part.grant.manifest.generation();
    parts.by_rank.resize(world);
    if (parts.by_rank[rank] != nullptr) {
      return absl::AlreadyExistsError(absl::StrCat("checkpoint ", job, " step ", step, ": rank ",
                                                   rank, " already uploaded its part"));
    }
    parts.by_rank[rank] = std::move(part.upload);
    int missing = 0;
    for (const auto& p : parts.by_rank) missing += p == nullptr ? 1 : 0;
    response.set_ranks_missing(missing);
    if (missing > 0) return response;
    complete = std::move(parts.by_rank);
    parts_.erase({job, step});
  }
  // Every part is here: rank 0's upload takes in the others' files and
  // commits them all.
  for (size_t r = 1; r < complete.size(); ++r) RETURN_IF_ERROR(complete[0]->Absorb(*complete[r]));
  ASSIGN_OR_RETURN(*response.mutable_manifest(),
                   complete[0]->Commit(part.grant.manifest, part.grant.keep_last));
  LOG(INFO) << "checkpoint " << job << " step " << step << " committed (" << world
            << " per-rank parts)";
  return response;
}

void CheckpointUploads::set_data_port(int port) {
  absl::MutexLock lock(&opened_mu_);
  data_port_ = port;
}

absl::StatusOr<v1::OpenUploadResponse> CheckpointUploads::Open(
    const v1::OpenUploadRequest& request) {
  {
    absl::MutexLock lock(&opened_mu_);
    if (data_port_ == 0) {
      return absl::UnimplementedError(
          "this coordinator has no checkpoint data port (it serves TLS, or runs with "
          "--checkpoint_data_port -1): "
          "upload with CheckpointService.Upload");
    }
  }
  ASSIGN_OR_RETURN(Started started,
                   Begin(request.job_id(), request.generation(), request.rank(), request.step()));
  ASSIGN_OR_RETURN(std::string token, NewUploadToken());
  absl::MutexLock lock(&opened_mu_);
  ExpireOpenedLocked();
  if (opened_.size() >= kMaxOpenedUploads) {
    return absl::ResourceExhaustedError(
        absl::StrCat("checkpoint: ", kMaxOpenedUploads,
                     " uploads are waiting for their data connection; try again later"));
  }
  opened_[token] = Opened{std::move(started), clock_->Now() + kOpenedUploadTtl};
  v1::OpenUploadResponse response;
  response.set_port(data_port_);
  response.set_token(token);
  return response;
}

void CheckpointUploads::ExpireOpenedLocked() {
  const absl::Time now = clock_->Now();
  for (auto it = opened_.begin(); it != opened_.end();) {
    if (it->second.expires <= now) {
      const Started& started = it->second.started;
      LOG(WARNING) << "checkpoint " << started.grant.manifest.job_id() << " step " << started.step
                   << ": rank " << started.rank
                   << " opened an upload but never connected to the data port";
      it = opened_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<CheckpointUploads::Started> CheckpointUploads::TakeOpened(absl::string_view token) {
  absl::MutexLock lock(&opened_mu_);
  ExpireOpenedLocked();
  auto it = opened_.find(std::string(token));
  if (it == opened_.end()) {
    return absl::PermissionDeniedError(
        "checkpoint data connection: unknown or expired upload token (open the upload with "
        "OpenUpload first; "
        "a token works once, within a minute)");
  }
  Started started = std::move(it->second.started);
  opened_.erase(it);
  return started;
}

}  // namespace chorus
