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
  // One chunk message, reused: its data buffer keeps its capacity, so it is
  // not faulted in afresh for every chunk.
  v1::CheckpointChunk chunk;
  chunk.set_job_id(job_id_);
  chunk.set_step(step);
  chunk.set_generation(generation_);
  chunk.set_rank(rank_);
  std::string* data = chunk.mutable_data();
  data->reserve(kChunkBytes);
  bool sent = true;  // false once the stream broke
  const absl::Time start = absl::Now();
  absl::Duration in_write;  // blocked sending chunks
  int64_t bytes = 0;
  for (const CheckpointFileSource& file : files) {
    // The receiver checks each chunk's and the whole file's CRC-32C, and
    // records the file's checksum itself.
    uint32_t file_crc = 0;
    int64_t offset = 0;
    chunk.set_file_name(file.name);
    chunk.set_offset(0);
    data->clear();
    auto send = [&](bool last) {
      const uint32_t crc = Crc32c(*data);
      chunk.set_chunk_crc32c(crc);
      file_crc = Crc32cCombine(file_crc, crc, data->size());
      offset += static_cast<int64_t>(data->size());
      bytes += static_cast<int64_t>(data->size());
      if (last) {
        chunk.set_last(true);
        chunk.set_file_size(offset);
        chunk.set_file_crc32c(file_crc);
      }
      const absl::Time t = absl::Now();
      sent = writer->Write(chunk);
      in_write += absl::Now() - t;
      // Only the first chunk of the stream names the job.
      chunk.clear_job_id();
      chunk.clear_step();
      chunk.clear_generation();
      chunk.clear_rank();
      chunk.clear_last();
      chunk.clear_file_size();
      chunk.clear_file_crc32c();
      chunk.set_offset(offset);
      data->clear();
      return sent;
    };
    absl::Status status = file.write([&](absl::string_view piece) -> absl::Status {
      while (!piece.empty()) {
        if (data->size() == kChunkBytes && !send(/*last=*/false)) {
          return absl::UnavailableError("the upload stream broke");
        }
        const size_t n = std::min(piece.size(), kChunkBytes - data->size());
        data->append(piece.data(), n);
        piece.remove_prefix(n);
      }
      return absl::OkStatus();
    });
    if (!sent) break;
    if (!status.ok()) {
      context.TryCancel();
      (void)writer->Finish();
      return absl::Status(status.code(),
                          absl::StrCat("uploading checkpoint step ", step, ": ", status.message()));
    }
    if (!send(/*last=*/true)) break;
  }
  const absl::Time sent_all = absl::Now();
  if (sent) writer->WritesDone();
  absl::Status s = FromGrpcStatus(writer->Finish());
  LOG(INFO) << "checkpoint step " << step << ": sent " << bytes << " bytes in "
            << absl::ToDoubleSeconds(sent_all - start) << " s (" << absl::ToDoubleSeconds(in_write)
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
