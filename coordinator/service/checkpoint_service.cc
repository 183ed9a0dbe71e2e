#include "coordinator/service/checkpoint_service.h"

#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "glog/logging.h"

namespace chorus {
namespace {

// One Upload call: the first chunk names job, step, generation and rank and
// begins the upload (which checks the grant); every chunk goes to the store;
// the end of the stream completes it.
class UploadReactor : public grpc::ServerReadReactor<v1::CheckpointChunk> {
 public:
  // The upload's job (named by the first chunk) must be one `caller` may act
  // for.
  UploadReactor(CheckpointUploads& uploads, Caller caller, v1::UploadCheckpointResponse* response)
      : uploads_(uploads), caller_(std::move(caller)), response_(response) {
    StartRead(&chunks_[0]);
  }

  void OnReadDone(bool ok) override {
    // Reactions run one at a time under mu_; the next chunk is read while
    // this one is checked and written (the read is started before the work).
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!ok) {  // the client finished sending
      if (started_.upload == nullptr) {
        FinishLocked(absl::InvalidArgumentError("checkpoint upload with no chunks"));
        return;
      }
      absl::StatusOr<v1::UploadCheckpointResponse> done = uploads_.Complete(std::move(started_));
      if (done.ok()) *response_ = *std::move(done);
      FinishLocked(done.status());
      return;
    }
    const v1::CheckpointChunk& chunk = chunks_[reading_];
    if (started_.upload == nullptr) {
      if (absl::Status s = caller_.CheckJob(chunk.job_id(), "upload checkpoints"); !s.ok()) {
        FinishLocked(s);
        return;
      }
      absl::StatusOr<CheckpointUploads::Started> started =
          uploads_.Begin(chunk.job_id(), chunk.generation(), chunk.rank(), chunk.step());
      if (!started.ok()) {
        FinishLocked(started.status());
        return;
      }
      started_ = *std::move(started);
    }
    reading_ ^= 1;
    StartRead(&chunks_[reading_]);
    if (absl::Status s = started_.upload->AddChunk(chunk); !s.ok()) FinishLocked(s);
  }

  void OnDone() override { delete this; }

 private:
  CheckpointUploads& uploads_;
  const Caller caller_;
  v1::UploadCheckpointResponse* response_;
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
  CheckpointUploads::Started started_;  // upload null until the first chunk
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
      manifest = absl::NotFoundError(
          absl::StrCat("job ", request.job_id(), " has no checkpoint at step ", request.step(),
                       "; `chorus checkpoints ", request.job_id(), "` lists them"));
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
                          absl::StrCat("checkpoint ", request.job_id(), " step ", manifest->step(),
                                       " has no file \"", request.file_name(), "\"")));
      return;
    }
    in_.open(store.FilePath(*manifest, file_.name()), std::ios::binary);
    if (!in_) {
      Finish(grpc::Status(grpc::StatusCode::DATA_LOSS,
                          absl::StrCat("checkpoint file ", file_.name(), " is missing")));
      return;
    }
    job_id_ = request.job_id();
    step_ = manifest->step();
    Next();
  }

  void OnWriteDone(bool ok) override {
    if (!ok || done_) {
      Finish(ok ? grpc::Status::OK
                : grpc::Status(grpc::StatusCode::CANCELLED, "download cancelled"));
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
        Finish(grpc::Status(
            grpc::StatusCode::DATA_LOSS,
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

// Note [Reading the checkpoint a job resumes from]
// A job submitted with --resume_from SOURCE[:STEP] starts from SOURCE's
// checkpoint: its ranks download those files with the job's own credential.
// So a job's credential may also download SOURCE's checkpoints, only at STEP
// when the submit named one (a request for "the newest", step 0, is then
// refused: the newest may be another one), and no other job's. The job's
// resume_from is read from its record (JobManager), which survives a
// coordinator restart as the credential does.
absl::Status CheckpointServiceImpl::MayDownload(
    const Caller& caller, const v1::DownloadCheckpointRequest& request) const {
  if (caller.role() == Role::kUser || caller.role() == Role::kAgent) {
    absl::StatusOr<std::string> owner =
        owner_of_ ? owner_of_(request.job_id()) : absl::StatusOr<std::string>("");
    if (!owner.ok()) return owner.status();
    return caller.CheckOwner(request.job_id(), *owner, "download the checkpoints of");
  }
  absl::Status own = caller.CheckJob(request.job_id(), "download checkpoints");
  if (own.ok() || !resume_from_of_) return own;
  const std::string resume_from = resume_from_of_(caller.job_id());
  const size_t colon = resume_from.find(':');
  int64_t step = 0;
  if (colon != std::string::npos && !absl::SimpleAtoi(resume_from.substr(colon + 1), &step)) {
    return own;
  }
  const bool source = !resume_from.empty() && resume_from.substr(0, colon) == request.job_id();
  if (source && (step == 0 || request.step() == step)) return absl::OkStatus();
  return own;
}

grpc::ServerReadReactor<v1::CheckpointChunk>* CheckpointServiceImpl::Upload(
    grpc::CallbackServerContext* context, v1::UploadCheckpointResponse* response) {
  absl::StatusOr<Caller> caller = auth_.Identify(context->client_metadata());
  if (!caller.ok()) return new RejectedReader<v1::CheckpointChunk>(caller.status());
  return new UploadReactor(uploads_, *std::move(caller), response);
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::OpenUpload(grpc::CallbackServerContext* context,
                                                            const v1::OpenUploadRequest* request,
                                                            v1::OpenUploadResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status =
      auth_.CheckJob(context->client_metadata(), request->job_id(), "upload checkpoints");
  if (status.ok()) {
    absl::StatusOr<v1::OpenUploadResponse> opened = uploads_.Open(*request);
    if (opened.ok()) *response = *std::move(opened);
    status = opened.status();
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::Commit(grpc::CallbackServerContext* context,
                                                        const v1::CommitCheckpointRequest* request,
                                                        v1::UploadCheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status =
      auth_.CheckJob(context->client_metadata(), request->job_id(), "commit checkpoints");
  if (status.ok()) {
    absl::StatusOr<v1::UploadCheckpointResponse> done = uploads_.CommitStaged(*request);
    if (done.ok()) *response = *std::move(done);
    status = done.status();
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerWriteReactor<v1::CheckpointChunk>* CheckpointServiceImpl::Download(
    grpc::CallbackServerContext* context, const v1::DownloadCheckpointRequest* request) {
  absl::StatusOr<Caller> caller = auth_.Identify(context->client_metadata());
  absl::Status allowed = caller.ok() ? MayDownload(*caller, *request) : caller.status();
  if (!allowed.ok()) return new RejectedWriter<v1::CheckpointChunk>(allowed);
  return new DownloadReactor(store_, *request);
}

}  // namespace chorus
