#include "worker/checkpoint/grpc_checkpoint_sink.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "worker/checkpoint/download.h"

namespace chorus {

GrpcCheckpointSink::GrpcCheckpointSink(std::shared_ptr<grpc::Channel> channel, std::string job_id,
                                       int64_t generation, int rank, absl::Duration timeout)
    : stub_(v1::CheckpointService::NewStub(channel)),
      job_id_(std::move(job_id)),
      generation_(generation),
      rank_(rank),
      timeout_(timeout) {}

absl::Status GrpcCheckpointSink::Store(int64_t step, const std::vector<CheckpointFileData>& files) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  v1::UploadCheckpointResponse response;
  auto writer = stub_->Upload(&context, &response);
  bool first = true;
  bool ok = true;
  for (const CheckpointFileData& file : files) {
    // The receiver checks each chunk's and the whole file's CRC-32C, and
    // records the file's SHA-256 itself; hashing here would only cost time.
    uint32_t file_crc = 0;
    size_t offset = 0;
    do {
      const size_t n = std::min(kChunkBytes, file.bytes.size() - offset);
      v1::CheckpointChunk chunk;
      if (first) {
        chunk.set_job_id(job_id_);
        chunk.set_step(step);
        chunk.set_generation(generation_);
        chunk.set_rank(rank_);
        first = false;
      }
      chunk.set_file_name(file.name);
      chunk.set_offset(static_cast<int64_t>(offset));
      chunk.set_data(file.bytes.data() + offset, n);
      chunk.set_chunk_crc32c(Crc32c(chunk.data()));
      file_crc = Crc32cExtend(file_crc, chunk.data());
      offset += n;
      if (offset >= file.bytes.size()) {
        chunk.set_last(true);
        chunk.set_file_size(static_cast<int64_t>(file.bytes.size()));
        chunk.set_file_crc32c(file_crc);
      }
      ok = writer->Write(chunk);
    } while (ok && offset < file.bytes.size());
    if (!ok) break;
  }
  if (ok) writer->WritesDone();
  absl::Status s = FromGrpcStatus(writer->Finish());
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("uploading checkpoint step ", step, ": ", s.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CheckpointFileData>> GrpcCheckpointSink::Load(const v1::CheckpointManifest& manifest) {
  std::vector<CheckpointFileData> files;
  for (const v1::CheckpointFile& f : manifest.files()) {
    absl::StatusOr<std::string> bytes = DownloadCheckpointFile(*stub_, manifest.job_id(), manifest.step(), f.name(), timeout_);
    if (!bytes.ok()) return bytes.status();
    files.push_back({f.name(), *std::move(bytes)});
  }
  return files;
}

}  // namespace chorus
