#include "worker/checkpoint/download.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/crc32c.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"

namespace chorus {

absl::StatusOr<std::string> DownloadCheckpointFile(v1::CheckpointService::Stub& stub, const std::string& job_id,
                                                   int64_t step, const std::string& file, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::DownloadCheckpointRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  request.set_file_name(file);
  auto reader = stub.Download(&context, request);
  std::string bytes;
  Sha256 whole;
  v1::CheckpointChunk chunk;
  bool complete = false;
  while (reader->Read(&chunk)) {
    if (chunk.offset() != static_cast<int64_t>(bytes.size()) || Crc32c(chunk.data()) != chunk.chunk_crc32c()) {
      context.TryCancel();
      (void)reader->Finish();
      return absl::DataLossError(absl::StrCat("checkpoint ", job_id, " ", file, ": a chunk arrived damaged"));
    }
    whole.Update(chunk.data());
    bytes += chunk.data();
    if (chunk.last()) {
      complete = chunk.file_size() == static_cast<int64_t>(bytes.size()) && chunk.file_sha256() == whole.HexDigest();
      if (!complete) {
        context.TryCancel();
        (void)reader->Finish();
        return absl::DataLossError(absl::StrCat("checkpoint ", job_id, " ", file,
                                                " does not match its recorded size and SHA-256"));
      }
    }
  }
  RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  if (!complete) return absl::DataLossError(absl::StrCat("checkpoint ", job_id, " ", file, " ended early"));
  return bytes;
}

}  // namespace chorus
