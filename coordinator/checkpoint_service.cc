#include "coordinator/checkpoint_service.h"

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "common/sha256.h"
#include "glog/logging.h"

namespace chorus {
namespace {

// One Upload call: the first chunk names job, step, generation and rank;
// the scheduler must grant it; every chunk goes to the store; the end of the
// stream commits.
class UploadReactor : public grpc::ServerReadReactor<v1::CheckpointChunk> {
 public:
  UploadReactor(CheckpointStore& store, Scheduler& scheduler, v1::UploadCheckpointResponse* response)
      : store_(store), scheduler_(scheduler), response_(response) {
    StartRead(&chunk_);
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
      absl::StatusOr<v1::CheckpointManifest> committed = upload_->Commit(grant_.manifest, grant_.keep_last);
      if (committed.ok()) {
        LOG(INFO) << "checkpoint " << committed->job_id() << " step " << committed->step() << " committed ("
                  << committed->files_size() << " file(s))";
        *response_->mutable_manifest() = *committed;
      }
      FinishLocked(committed.status());
      return;
    }
    v1::CheckpointChunk chunk = std::move(chunk_);
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
    }
    chunk_.Clear();
    StartRead(&chunk_);
    if (absl::Status s = upload_->AddChunk(chunk); !s.ok()) FinishLocked(s);
  }

  void OnDone() override { delete this; }

 private:
  CheckpointStore& store_;
  Scheduler& scheduler_;
  v1::UploadCheckpointResponse* response_;
  void FinishLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finished_ = true;
    Finish(ToGrpcStatus(status));
  }

  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  v1::CheckpointChunk chunk_;
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
    in_.open(store.FilePath(request.job_id(), manifest->step(), file_.name()), std::ios::binary);
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
    chunk_.set_chunk_sha256(Sha256Hex(buffer));
    offset_ += static_cast<int64_t>(buffer.size());
    *chunk_.mutable_data() = std::move(buffer);
    if (offset_ >= file_.size() || in_.eof()) {
      chunk_.set_last(true);
      chunk_.set_file_size(file_.size());
      chunk_.set_file_sha256(file_.sha256());
      done_ = true;
    }
    StartWrite(&chunk_);
  }

  v1::CheckpointFile file_;
  std::ifstream in_;
  std::string job_id_;
  int64_t step_ = 0;
  int64_t offset_ = 0;
  bool done_ = false;
  v1::CheckpointChunk chunk_;
};

}  // namespace

grpc::ServerReadReactor<v1::CheckpointChunk>* CheckpointServiceImpl::Upload(grpc::CallbackServerContext* context,
                                                                           v1::UploadCheckpointResponse* response) {
  if (absl::Status s = auth_.Check(context->client_metadata(), Role::kWorker); !s.ok()) {
    return new RejectedReader<v1::CheckpointChunk>(s);
  }
  return new UploadReactor(store_, scheduler_, response);
}

grpc::ServerWriteReactor<v1::CheckpointChunk>* CheckpointServiceImpl::Download(
    grpc::CallbackServerContext* context, const v1::DownloadCheckpointRequest* request) {
  if (absl::Status s = auth_.Check(context->client_metadata(), Role::kWorker); !s.ok()) {
    return new RejectedWriter<v1::CheckpointChunk>(s);
  }
  return new DownloadReactor(store_, *request);
}

}  // namespace chorus
