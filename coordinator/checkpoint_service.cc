#include "coordinator/checkpoint_service.h"

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "common/status_macros.h"
#include "checkpoint/wire.h"
#include "common/crc32c.h"
#include "glog/logging.h"

namespace chorus {
namespace {

// One Upload call: the first chunk names job, step, generation and rank;
// the scheduler must grant it; every chunk goes to the store; the end of the
// stream commits.
class UploadReactor : public grpc::ServerReadReactor<v1::CheckpointChunk> {
 public:
  UploadReactor(CheckpointServiceImpl& service, CheckpointStore& store, Scheduler& scheduler,
                v1::UploadCheckpointResponse* response)
      : service_(service), store_(store), scheduler_(scheduler), response_(response) {
    StartRead(&chunks_[0]);
  }

  void OnReadDone(bool ok) override {
    // Reactions run one at a time under mu_; the next chunk is read while
    // this one is checked and written (the read is started before the work).
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!ok) {  // the client finished sending
      if (upload_ == nullptr) {
        FinishLocked(absl::InvalidArgumentError("checkpoint upload with no chunks"));
        return;
      }
      absl::StatusOr<v1::UploadCheckpointResponse> done = service_.Complete(grant_, step_, rank_, std::move(upload_));
      if (done.ok()) *response_ = *std::move(done);
      FinishLocked(done.status());
      return;
    }
    const v1::CheckpointChunk& chunk = chunks_[reading_];
    if (upload_ == nullptr) {
      absl::StatusOr<Scheduler::UploadGrant> grant =
          scheduler_.GrantUpload(chunk.job_id(), chunk.generation(), chunk.rank());
      if (!grant.ok()) {
        FinishLocked(grant.status());
        return;
      }
      grant_ = *std::move(grant);
      absl::StatusOr<std::unique_ptr<CheckpointStore::Upload>> upload =
          store_.BeginUpload(chunk.job_id(), chunk.step());
      if (!upload.ok()) {
        FinishLocked(upload.status());
        return;
      }
      upload_ = *std::move(upload);
      step_ = chunk.step();
      rank_ = chunk.rank();
    }
    reading_ ^= 1;
    StartRead(&chunks_[reading_]);
    if (absl::Status s = upload_->AddChunk(chunk); !s.ok()) FinishLocked(s);
  }

  void OnDone() override { delete this; }

 private:
  CheckpointServiceImpl& service_;
  CheckpointStore& store_;
  Scheduler& scheduler_;
  v1::UploadCheckpointResponse* response_;
  int64_t step_ = 0;
  int rank_ = 0;
  void FinishLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finished_ = true;
    Finish(ToGrpcStatus(status));
  }

  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Chunks are read into these two in turn: the next one arrives while this
  // one is checked and written, and each keeps its 4 MB data buffer from
  // chunk to chunk (a fresh buffer per chunk cost a page fault per 4 KB).
  v1::CheckpointChunk chunks_[2];
  int reading_ ABSL_GUARDED_BY(mu_) = 0;
  Scheduler::UploadGrant grant_;
  std::unique_ptr<CheckpointStore::Upload> upload_;
};

// One Download call: a committed file, in chunks with their SHA-256; the
// last chunk carries the file's size and SHA-256 from the manifest.
class DownloadReactor : public grpc::ServerWriteReactor<v1::CheckpointChunk> {
 public:
  DownloadReactor(CheckpointStore& store, const v1::DownloadCheckpointRequest& request) {
    std::vector<std::string> skipped;
    absl::StatusOr<v1::CheckpointManifest> manifest;
    if (request.step() == 0) {
      manifest = store.FindLoadable(request.job_id(), 0, &skipped);
    } else {
      absl::StatusOr<std::vector<v1::CheckpointManifest>> all = store.List(request.job_id());
      manifest = absl::NotFoundError(absl::StrCat("job ", request.job_id(), " has no checkpoint at step ",
                                                  request.step(), "; `chorus checkpoints ", request.job_id(),
                                                  "` lists them"));
      if (all.ok()) {
        for (const auto& m : *all) {
          if (m.step() == request.step()) manifest = m;
        }
      }
    }
    if (!manifest.ok()) {
      Finish(ToGrpcStatus(manifest.status()));
      return;
    }
    for (const v1::CheckpointFile& f : manifest->files()) {
      if (f.name() == request.file_name()) file_ = f;
    }
    if (file_.name().empty()) {
      Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("checkpoint ", request.job_id(), " step ", manifest->step(), " has no file \"",
                                       request.file_name(), "\"")));
      return;
    }
    in_.open(store.FilePath(*manifest, file_.name()), std::ios::binary);
    if (!in_) {
      Finish(grpc::Status(grpc::StatusCode::DATA_LOSS, absl::StrCat("checkpoint file ", file_.name(), " is missing")));
      return;
    }
    job_id_ = request.job_id();
    step_ = manifest->step();
    Next();
  }

  void OnWriteDone(bool ok) override {
    if (!ok || done_) {
      Finish(ok ? grpc::Status::OK : grpc::Status(grpc::StatusCode::CANCELLED, "download cancelled"));
      return;
    }
    Next();
  }

  void OnDone() override { delete this; }

 private:
  void Next() {
    std::string buffer(CheckpointServiceImpl::kChunkBytes, '\0');
    in_.read(buffer.data(), buffer.size());
    buffer.resize(static_cast<size_t>(in_.gcount()));
    chunk_.Clear();
    chunk_.set_job_id(job_id_);
    chunk_.set_step(step_);
    chunk_.set_file_name(file_.name());
    chunk_.set_offset(offset_);
    chunk_.set_chunk_crc32c(Crc32c(buffer));
    file_crc_ = Crc32cExtend(file_crc_, buffer);
    offset_ += static_cast<int64_t>(buffer.size());
    *chunk_.mutable_data() = std::move(buffer);
    if (offset_ >= file_.size() || in_.eof()) {
      // Files of shared directories carry no SHA-256 for the receiver to
      // check: compare what was read with the recorded CRC-32C here.
      if (file_.sha256().empty() && (offset_ != file_.size() || file_crc_ != file_.crc32c())) {
        Finish(grpc::Status(grpc::StatusCode::DATA_LOSS,
                            absl::StrCat("checkpoint ", job_id_, " step ", step_, ": stored file ", file_.name(),
                                         " does not match its recorded size and CRC-32C")));
        return;
      }
      chunk_.set_last(true);
      chunk_.set_file_size(file_.size());
      chunk_.set_file_sha256(file_.sha256());
      chunk_.set_file_crc32c(file_crc_);
      done_ = true;
    }
    StartWrite(&chunk_);
  }

  v1::CheckpointFile file_;
  std::ifstream in_;
  std::string job_id_;
  int64_t step_ = 0;
  int64_t offset_ = 0;
  uint32_t file_crc_ = 0;
  bool done_ = false;
  v1::CheckpointChunk chunk_;
};

}  // namespace

grpc::ServerReadReactor<v1::CheckpointChunk>* CheckpointServiceImpl::Upload(grpc::CallbackServerContext* context,
                                                                           v1::UploadCheckpointResponse* response) {
  if (absl::Status s = auth_.Check(context->client_metadata(), Role::kWorker); !s.ok()) {
    return new RejectedReader<v1::CheckpointChunk>(s);
  }
  return new UploadReactor(*this, store_, scheduler_, response);
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::OpenUpload(grpc::CallbackServerContext* context,
                                                            const v1::OpenUploadRequest* request,
                                                            v1::OpenUploadResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = [&]() -> absl::Status {
    RETURN_IF_ERROR(auth_.Check(context->client_metadata(), Role::kWorker));
    {
      absl::MutexLock lock(&opened_mu_);
      if (data_port_ == 0) {
        return absl::UnimplementedError(
            "this coordinator has no checkpoint data port (it serves TLS, or runs with --checkpoint_data_port -1): "
            "upload with CheckpointService.Upload");
      }
    }
    ASSIGN_OR_RETURN(Scheduler::UploadGrant grant,
                     scheduler_.GrantUpload(request->job_id(), request->generation(), request->rank()));
    ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore::Upload> upload,
                     store_.BeginUpload(request->job_id(), request->step()));
    ASSIGN_OR_RETURN(std::string token, NewUploadToken());
    absl::MutexLock lock(&opened_mu_);
    ExpireOpenedLocked();
    if (opened_.size() >= kMaxOpenedUploads) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "checkpoint: ", kMaxOpenedUploads, " uploads are waiting for their data connection; try again later"));
    }
    OpenedUpload& opened = opened_[token];
    opened.grant = std::move(grant);
    opened.step = request->step();
    opened.rank = request->rank();
    opened.upload = std::move(upload);
    opened.expires = absl::Now() + kOpenedUploadTtl;
    response->set_port(data_port_);
    response->set_token(token);
    return absl::OkStatus();
  }();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

void CheckpointServiceImpl::set_data_port(int port) {
  absl::MutexLock lock(&opened_mu_);
  data_port_ = port;
}

void CheckpointServiceImpl::ExpireOpenedLocked() {
  const absl::Time now = absl::Now();
  for (auto it = opened_.begin(); it != opened_.end();) {
    if (it->second.expires <= now) {
      LOG(WARNING) << "checkpoint " << it->second.grant.manifest.job_id() << " step " << it->second.step
                   << ": rank " << it->second.rank << " opened an upload but never connected to the data port";
      it = opened_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<CheckpointServiceImpl::OpenedUpload> CheckpointServiceImpl::TakeOpened(absl::string_view token) {
  absl::MutexLock lock(&opened_mu_);
  ExpireOpenedLocked();
  auto it = opened_.find(std::string(token));
  if (it == opened_.end()) {
    return absl::PermissionDeniedError(
        "checkpoint data connection: unknown or expired upload token (open the upload with OpenUpload first; "
        "a token works once, within a minute)");
  }
  OpenedUpload opened = std::move(it->second);
  opened_.erase(it);
  return opened;
}

absl::StatusOr<v1::UploadCheckpointResponse> CheckpointServiceImpl::Complete(
    const Scheduler::UploadGrant& grant, int64_t step, int rank, std::unique_ptr<CheckpointStore::Upload> upload) {
  if (grant.manifest.per_rank()) return AddPart(grant, step, rank, std::move(upload));
  v1::UploadCheckpointResponse response;
  ASSIGN_OR_RETURN(*response.mutable_manifest(), upload->Commit(grant.manifest, grant.keep_last));
  LOG(INFO) << "checkpoint " << response.manifest().job_id() << " step " << response.manifest().step()
            << " committed (" << response.manifest().files_size() << " file(s))"
            << (response.manifest().directory().empty() ? "" : " in ") << response.manifest().directory();
  return response;
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::Commit(grpc::CallbackServerContext* context,
                                                        const v1::CommitCheckpointRequest* request,
                                                        v1::UploadCheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = auth_.Check(context->client_metadata(), Role::kWorker); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  absl::StatusOr<v1::UploadCheckpointResponse> done = CommitStaged(*request);
  if (done.ok()) *response = *std::move(done);
  reactor->Finish(ToGrpcStatus(done.status()));
  return reactor;
}

absl::StatusOr<v1::UploadCheckpointResponse> CheckpointServiceImpl::CommitStaged(
    const v1::CommitCheckpointRequest& request) {
  ASSIGN_OR_RETURN(Scheduler::UploadGrant grant,
                   scheduler_.GrantUpload(request.job_id(), request.generation(), request.rank()));
  if (grant.shared_dir.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", request.job_id(),
                                                      " stores its checkpoints on the coordinator (checkpoint.storage "
                                                      "COORDINATOR): upload them; Commit is for storage SHARED_DIR"));
  }
  std::vector<v1::CheckpointFile> files(request.files().begin(), request.files().end());
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore::Upload> upload,
                   store_.AdoptStaged(grant.shared_dir, request.job_id(), request.step(), request.staging_dir(), files));
  return Complete(grant, request.step(), request.rank(), std::move(upload));
}

absl::StatusOr<v1::UploadCheckpointResponse> CheckpointServiceImpl::AddPart(
    const Scheduler::UploadGrant& grant, int64_t step, int rank, std::unique_ptr<CheckpointStore::Upload> part) {
  const std::string& job = grant.manifest.job_id();
  const int world = grant.manifest.world_size();
  std::vector<std::unique_ptr<CheckpointStore::Upload>> complete;
  v1::UploadCheckpointResponse response;
  {
    absl::MutexLock lock(&parts_mu_);
    // Parts that can no longer be completed: earlier steps, or another
    // generation (its ranks are gone or renumbered).
    for (auto it = parts_.lower_bound({job, 0}); it != parts_.end() && it->first.first == job;) {
      if (it->first.second < step || it->second.generation != grant.manifest.generation()) {
        LOG(WARNING) << "checkpoint " << job << " step " << it->first.second
                     << ": dropping the per-rank parts received so far (superseded before every rank uploaded)";
        it = parts_.erase(it);
      } else {
        ++it;
      }
    }
    if (rank < 0 || rank >= world) return absl::InvalidArgumentError(absl::StrCat("checkpoint: bad rank ", rank));
    Parts& parts = parts_[{job, step}];
    parts.generation = grant.manifest.generation();
    parts.by_rank.resize(world);
    if (parts.by_rank[rank] != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrCat("checkpoint ", job, " step ", step, ": rank ", rank, " already uploaded its part"));
    }
    parts.by_rank[rank] = std::move(part);
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
  ASSIGN_OR_RETURN(*response.mutable_manifest(), complete[0]->Commit(grant.manifest, grant.keep_last));
  LOG(INFO) << "checkpoint " << job << " step " << step << " committed (" << world << " per-rank parts)";
  return response;
}

grpc::ServerWriteReactor<v1::CheckpointChunk>* CheckpointServiceImpl::Download(
    grpc::CallbackServerContext* context, const v1::DownloadCheckpointRequest* request) {
  if (absl::Status s = auth_.Check(context->client_metadata(), Role::kWorker); !s.ok()) {
    return new RejectedWriter<v1::CheckpointChunk>(s);
  }
  return new DownloadReactor(store_, *request);
}

}  // namespace chorus
