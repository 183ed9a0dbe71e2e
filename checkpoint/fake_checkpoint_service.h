// FakeCheckpointService: an in-memory CheckpointService for the checkpoint
// component's tests, served on 127.0.0.1 with port 0. It takes uploads over
// the Upload stream and (when told to have one) over a data port speaking
// checkpoint/wire.h, checking every chunk's and file's CRC-32C as the
// coordinator does; commits shared-directory checkpoints by checking the
// staged files and renaming the staging directory to <job dir>/<step>; and
// serves committed files over Download. What each call did is recorded.
//
// Thread-safety: the service's handlers and the accessors may run on any
// thread; the setters are meant for before the call under test.
//
// Example:
//   FakeCheckpointService coordinator;
//   coordinator.set_data_port(FakeCheckpointService::DataPort::kNone);
//   ASSERT_TRUE(coordinator.Start().ok());
//   CoordinatorCheckpointStorage storage(coordinator.channel(), "job-000001", 1, 0, "127.0.0.1");
#ifndef CHORUS_CHECKPOINT_FAKE_CHECKPOINT_SERVICE_H_
#define CHORUS_CHECKPOINT_FAKE_CHECKPOINT_SERVICE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace chorus {

class FakeCheckpointService : public v1::CheckpointService::Service {
 public:
  enum class DataPort {
    kNone,         // OpenUpload is UNIMPLEMENTED
    kServing,      // uploads over the data port are taken
    kBusy,         // the data port refuses at the hello (RESOURCE_EXHAUSTED)
    kUnreachable,  // OpenUpload names a port nothing listens on
    // OpenUpload answers, but the data port does not know the token (as
    // when the coordinator restarted in between)
    kForgetsUploads,
  };

  // `shared_root`: where shared-directory jobs keep their checkpoints
  // (<shared_root>/<job>/...), for Commit.
  explicit FakeCheckpointService(std::string shared_root = "");
  ~FakeCheckpointService() override;

  void set_data_port(DataPort mode);
  // Every Upload, data-port upload and Commit answers `status` instead.
  void set_store_error(absl::Status status);
  // The next upload (over either path) is cut after `bytes` bytes of file
  // data, as by a coordinator killed in the middle of it: the data port
  // closes the connection without an answer, the stream ends UNAVAILABLE.
  // Nothing of it is recorded; later uploads go through.
  void CutNextUploadAfter(int64_t bytes);
  // Download sends these chunks and then `end` instead of a stored file.
  void set_download_script(std::vector<v1::CheckpointChunk> chunks, grpc::Status end);

  // Starts the gRPC server (and the data port if kServing or kBusy).
  absl::Status Start();
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }

  // A committed file, as the coordinator recorded it.
  struct StoredFile {
    std::string bytes;
    v1::CheckpointFile record;
  };
  std::map<std::string, StoredFile> Files(int64_t step) const;
  // The manifest of committed step `step` (directory set for Commit).
  std::optional<v1::CheckpointManifest> Manifest(int64_t step) const;
  int stream_uploads() const;
  int data_port_uploads() const;
  int open_upload_calls() const;
  std::vector<v1::CommitCheckpointRequest> commits() const;
  // Staged files as they were when Commit looked at them.
  std::vector<std::string> committed_staging_paths() const;

  // CheckpointService.
  grpc::Status Upload(grpc::ServerContext* context, grpc::ServerReader<v1::CheckpointChunk>* reader,
                      v1::UploadCheckpointResponse* response) override;
  grpc::Status OpenUpload(grpc::ServerContext* context, const v1::OpenUploadRequest* request,
                          v1::OpenUploadResponse* response) override;
  grpc::Status Commit(grpc::ServerContext* context, const v1::CommitCheckpointRequest* request,
                      v1::UploadCheckpointResponse* response) override;
  grpc::Status Download(grpc::ServerContext* context, const v1::DownloadCheckpointRequest* request,
                        grpc::ServerWriter<v1::CheckpointChunk>* writer) override;

 private:
  struct Step {
    std::string job_id;
    std::string directory;
    std::map<std::string, StoredFile> files;
  };

  void ServeDataPort();
  // Reads one data-port upload from `fd` and answers it.
  void ReceiveDataUpload(int fd);
  // Whether an upload that has received `bytes` of file data is to be cut
  // now (CutNextUploadAfter); the cut is used up then.
  bool CutNow(int64_t bytes);
  absl::Status Record(const std::string& job_id, int64_t step,
                      std::map<std::string, StoredFile> files, const std::string& directory);

  const std::string shared_root_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  int listen_fd_ = -1;
  int data_port_ = 0;
  std::thread data_thread_;

  mutable absl::Mutex mu_;
  DataPort mode_ ABSL_GUARDED_BY(mu_) = DataPort::kNone;
  absl::Status store_error_ ABSL_GUARDED_BY(mu_);
  int64_t cut_after_bytes_ ABSL_GUARDED_BY(mu_) = -1;  // -1: no cut
  std::optional<std::pair<std::vector<v1::CheckpointChunk>, grpc::Status>> download_script_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::pair<std::string, int64_t>> tokens_
      ABSL_GUARDED_BY(mu_);  // token -> job, step
  std::map<int64_t, Step> steps_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::CommitCheckpointRequest> commits_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> committed_staging_paths_ ABSL_GUARDED_BY(mu_);
  int stream_uploads_ ABSL_GUARDED_BY(mu_) = 0;
  int data_port_uploads_ ABSL_GUARDED_BY(mu_) = 0;
  int open_upload_calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace chorus

#endif  // CHORUS_CHECKPOINT_FAKE_CHECKPOINT_SERVICE_H_
