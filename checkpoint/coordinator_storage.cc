#include "checkpoint/coordinator_storage.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "checkpoint/download.h"
#include "checkpoint/wire.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"

namespace chorus {
namespace {

// Cuts checkpoint files into chunks of at most `chunk_bytes` on one Upload
// stream. Each chunk carries its CRC-32C and a file's last chunk the file's
// size and CRC-32C (the receiver checks both and records the file's
// checksum itself); only the first chunk of the stream names the job. One
// chunk message is reused: its data buffer keeps its capacity, so it is not
// faulted in afresh for every chunk.
class ChunkUploader {
 public:
  // `writer` must outlive this.
  ChunkUploader(grpc::ClientWriterInterface<v1::CheckpointChunk>& writer, size_t chunk_bytes,
                const std::string& job_id, int64_t step, int64_t generation, int rank)
      : writer_(writer), chunk_bytes_(chunk_bytes), data_(chunk_.mutable_data()) {
    chunk_.set_job_id(job_id);
    chunk_.set_step(step);
    chunk_.set_generation(generation);
    chunk_.set_rank(rank);
    data_->reserve(chunk_bytes_);
  }

  void BeginFile(const std::string& name) {
    file_crc_ = 0;
    offset_ = 0;
    chunk_.set_file_name(name);
    chunk_.set_offset(0);
    data_->clear();
  }

  // Appends `piece` to the file, sending each chunk as it fills; UNAVAILABLE
  // if the stream broke.
  absl::Status Append(absl::string_view piece) {
    while (!piece.empty()) {
      if (data_->size() == chunk_bytes_ && !Send(/*last=*/false)) {
        return absl::UnavailableError("the upload stream broke");
      }
      const size_t n = std::min(piece.size(), chunk_bytes_ - data_->size());
      data_->append(piece.data(), n);
      piece.remove_prefix(n);
    }
    return absl::OkStatus();
  }

  // Sends the file's last chunk; false if the stream broke.
  bool EndFile() { return Send(/*last=*/true); }

  // False once the stream broke.
  bool sent() const { return sent_; }
  int64_t bytes() const { return bytes_; }
  // Time blocked in sending chunks.
  absl::Duration in_write() const { return in_write_; }

 private:
  bool Send(bool last) {
    const uint32_t crc = Crc32c(*data_);
    chunk_.set_chunk_crc32c(crc);
    file_crc_ = Crc32cCombine(file_crc_, crc, data_->size());
    offset_ += static_cast<int64_t>(data_->size());
    bytes_ += static_cast<int64_t>(data_->size());
    if (last) {
      chunk_.set_last(true);
      chunk_.set_file_size(offset_);
      chunk_.set_file_crc32c(file_crc_);
    }
    const absl::Time t = absl::Now();
    sent_ = writer_.Write(chunk_);
    in_write_ += absl::Now() - t;
    chunk_.clear_job_id();
    chunk_.clear_step();
    chunk_.clear_generation();
    chunk_.clear_rank();
    chunk_.clear_last();
    chunk_.clear_file_size();
    chunk_.clear_file_crc32c();
    chunk_.set_offset(offset_);
    data_->clear();
    return sent_;
  }

  grpc::ClientWriterInterface<v1::CheckpointChunk>& writer_;
  const size_t chunk_bytes_;
  v1::CheckpointChunk chunk_;
  std::string* const data_;  // chunk_'s
  uint32_t file_crc_ = 0;
  int64_t offset_ = 0;  // in the current file
  bool sent_ = true;
  int64_t bytes_ = 0;
  absl::Duration in_write_;
};

}  // namespace

CoordinatorCheckpointStorage::CoordinatorCheckpointStorage(std::shared_ptr<grpc::Channel> channel,
                                                           std::string job_id, int64_t generation,
                                                           int rank, std::string coordinator_host,
                                                           absl::Duration timeout)
    : stub_(v1::CheckpointService::NewStub(channel)),
      job_id_(std::move(job_id)),
      generation_(generation),
      rank_(rank),
      timeout_(timeout),
      coordinator_host_(std::move(coordinator_host)) {}

absl::Status CoordinatorCheckpointStorage::Store(int64_t step,
                                                 const std::vector<CheckpointFileSource>& files) {
  bool use_data_port = !coordinator_host_.empty();
  {
    absl::MutexLock lock(&mu_);
    use_data_port = use_data_port && absl::Now() >= data_port_off_until_;
  }
  if (use_data_port) {
    Fallback fell_back = Fallback::kNone;
    absl::Status s = StoreOverDataPort(step, files, &fell_back);
    if (fell_back == Fallback::kNone) return s;
    s = StoreOverStream(step, files);
    if (fell_back == Fallback::kUnreachable && absl::IsUnavailable(s)) {
      // The whole coordinator is away (restarting, say), not just its data
      // port: try the port again next time.
      absl::MutexLock lock(&mu_);
      data_port_off_until_ = absl::InfinitePast();
    }
    return s;
  }
  return StoreOverStream(step, files);
}

absl::Status CoordinatorCheckpointStorage::OpenDataUpload(int64_t step,
                                                          v1::OpenUploadResponse* opened,
                                                          std::string* host, Fallback* fell_back) {
  v1::OpenUploadRequest request;
  request.set_job_id(job_id_);
  request.set_step(step);
  request.set_generation(generation_);
  request.set_rank(rank_);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + std::min(timeout_, absl::Minutes(1))));
  grpc::Status s = stub_->OpenUpload(&context, request, opened);
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    LOG(INFO) << "the coordinator takes checkpoints over gRPC only (" << s.error_message() << ")";
    absl::MutexLock lock(&mu_);
    data_port_off_until_ = absl::InfiniteFuture();
    *fell_back = Fallback::kNoDataPort;
    return absl::OkStatus();
  }
  if (!s.ok()) {
    return absl::Status(FromGrpcStatus(s).code(),
                        absl::StrCat("uploading checkpoint step ", step, ": ", s.error_message()));
  }
  // The data port is beside the coordinator that granted the upload.
  *host = coordinator_host_ == kHostThatAnswers ? PeerHost(context.peer()) : coordinator_host_;
  if (host->empty()) {
    LOG(WARNING) << "checkpoint step " << step << ": no address for the data port of "
                 << "the coordinator that granted the upload (" << context.peer()
                 << "); uploading over gRPC";
    *fell_back = Fallback::kUnreachable;
  }
  return absl::OkStatus();
}

absl::Status CoordinatorCheckpointStorage::StoreOverDataPort(
    int64_t step, const std::vector<CheckpointFileSource>& files, Fallback* fell_back) {
  v1::OpenUploadResponse opened;
  std::string host;
  RETURN_IF_ERROR(OpenDataUpload(step, &opened, &host, fell_back));
  if (*fell_back != Fallback::kNone) return absl::OkStatus();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<CheckpointDataUpload>> upload = CheckpointDataUpload::Connect(
      host, opened.port(), opened.token(), std::min(timeout_, kDataPortConnectTimeout), timeout_);
  if (absl::IsUnavailable(upload.status())) {
    // A firewall, say. The coordinator drops the opened upload after a minute.
    LOG(WARNING) << upload.status().message() << "; uploading checkpoints over gRPC for the next "
                 << absl::FormatDuration(kDataPortRetryAfter);
    absl::MutexLock lock(&mu_);
    data_port_off_until_ = absl::Now() + kDataPortRetryAfter;
    *fell_back = Fallback::kUnreachable;
    return absl::OkStatus();
  }
  if (absl::IsResourceExhausted(upload.status())) {
    LOG(INFO) << upload.status().message() << " (checkpoint step " << step << ")";
    *fell_back = Fallback::kBusy;
    return absl::OkStatus();
  }
  if (absl::IsPermissionDenied(upload.status())) {
    // The token was handed out a moment ago: a coordinator that does not know
    // it any more has restarted since (opened uploads live in its memory).
    return absl::UnavailableError(
        absl::StrCat("uploading checkpoint step ", step, ": ", upload.status().message(),
                     " (the coordinator restarted after granting the upload?)"));
  }
  if (!upload.ok()) {
    return absl::Status(upload.status().code(), absl::StrCat("uploading checkpoint step ", step,
                                                             ": ", upload.status().message()));
  }
  absl::Status status;
  for (const CheckpointFileSource& file : files) {
    status = (*upload)->BeginFile(file.name);
    if (status.ok())
      status = file.write([&](absl::string_view piece) { return (*upload)->Write(piece); });
    if (status.ok()) status = (*upload)->EndFile();
    if (!status.ok()) break;
  }
  const absl::Time sent_all = absl::Now();
  if (status.ok()) status = (*upload)->Finish();
  LOG(INFO) << "checkpoint step " << step << ": sent " << (*upload)->bytes_sent()
            << " bytes to the data port in " << absl::ToDoubleSeconds(sent_all - start) << " s ("
            << absl::ToDoubleSeconds((*upload)->send_time())
            << " s of it sending), the coordinator's fsync and commit took "
            << absl::ToDoubleSeconds(absl::Now() - sent_all) << " s";
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("uploading checkpoint step ", step, ": ", status.message()));
  }
  return absl::OkStatus();
}

absl::Status CoordinatorCheckpointStorage::StoreOverStream(
    int64_t step, const std::vector<CheckpointFileSource>& files) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  v1::UploadCheckpointResponse response;
  auto writer = stub_->Upload(&context, &response);
  ChunkUploader uploader(*writer, kChunkBytes, job_id_, step, generation_, rank_);
  const absl::Time start = absl::Now();
  for (const CheckpointFileSource& file : files) {
    uploader.BeginFile(file.name);
    absl::Status status =
        file.write([&](absl::string_view piece) { return uploader.Append(piece); });
    if (!uploader.sent()) break;
    if (!status.ok()) {
      context.TryCancel();
      (void)writer->Finish();
      return absl::Status(status.code(),
                          absl::StrCat("uploading checkpoint step ", step, ": ", status.message()));
    }
    if (!uploader.EndFile()) break;
  }
  const absl::Time sent_all = absl::Now();
  if (uploader.sent()) writer->WritesDone();
  absl::Status s = FromGrpcStatus(writer->Finish());
  LOG(INFO) << "checkpoint step " << step << ": sent " << uploader.bytes() << " bytes in "
            << absl::ToDoubleSeconds(sent_all - start) << " s ("
            << absl::ToDoubleSeconds(uploader.in_write())
            << " s of it in Write), the coordinator's fsync and commit took "
            << absl::ToDoubleSeconds(absl::Now() - sent_all) << " s";
  if (!s.ok())
    return absl::Status(s.code(),
                        absl::StrCat("uploading checkpoint step ", step, ": ", s.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CheckpointFileData>> CoordinatorCheckpointStorage::Load(
    const v1::CheckpointManifest& manifest) {
  std::vector<CheckpointFileData> files;
  for (const v1::CheckpointFile& f : manifest.files()) {
    absl::StatusOr<std::string> bytes =
        DownloadCheckpointFile(*stub_, manifest.job_id(), manifest.step(), f.name(), timeout_);
    if (!bytes.ok()) return bytes.status();
    files.push_back({f.name(), *std::move(bytes)});
  }
  return files;
}

std::string PeerHost(const std::string& peer) {
  std::string address;
  if (absl::StartsWith(peer, "ipv4:")) {
    address = peer.substr(5);
  } else if (absl::StartsWith(peer, "ipv6:")) {
    address = absl::StrReplaceAll(peer.substr(5), {{"%5B", "["}, {"%5D", "]"}});
  } else {
    return "";
  }
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  return parsed.ok() ? parsed->host : "";
}

}  // namespace chorus
