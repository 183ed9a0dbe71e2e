#include "checkpoint/download.h"

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"

namespace chorus {

absl::StatusOr<std::string> DownloadCheckpointFile(v1::CheckpointService::Stub& stub,
                                                   const std::string& job_id, int64_t step,
                                                   const std::string& file,
                                                   absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::DownloadCheckpointRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  request.set_file_name(file);
  auto reader = stub.Download(&context, request);
  std::string bytes;
  Sha256 whole;
  uint32_t crc = 0;
  v1::CheckpointChunk chunk;
  bool complete = false;
  while (reader->Read(&chunk)) {
    if (chunk.offset() != static_cast<int64_t>(bytes.size()) ||
        Crc32c(chunk.data()) != chunk.chunk_crc32c()) {
      context.TryCancel();
      (void)reader->Finish();
      return absl::DataLossError(
          absl::StrCat("checkpoint ", job_id, " ", file, ": a chunk arrived damaged"));
    }
    whole.Update(chunk.data());
    crc = Crc32cExtend(crc, chunk.data());
    bytes += chunk.data();
    if (chunk.last()) {
      // Files in a shared directory are recorded with CRC-32C only (the
      // coordinator checked the stored file against it while sending).
      const bool by_sha = !chunk.file_sha256().empty();
      complete = chunk.file_size() == static_cast<int64_t>(bytes.size()) &&
                 (by_sha ? chunk.file_sha256() == whole.HexDigest() : chunk.file_crc32c() == crc);
      if (!complete) {
        context.TryCancel();
        (void)reader->Finish();
        return absl::DataLossError(absl::StrCat("checkpoint ", job_id, " ", file,
                                                " does not match its recorded size and ",
                                                by_sha ? "SHA-256" : "CRC-32C"));
      }
    }
  }
  RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  if (!complete)
    return absl::DataLossError(absl::StrCat("checkpoint ", job_id, " ", file, " ended early"));
  return bytes;
}

}  // namespace chorus
