// Downloading one file of a committed checkpoint from the coordinator's
// CheckpointService, checking every chunk's CRC-32C and the whole file's
// size and SHA-256 (CRC-32C for files in a shared directory, which the
// coordinator records with CRC-32C only). The chorus CLI uses it for
// `chorus export`, ranks to resume.
//
// Thread-safety: a free function; `stub` may be shared between threads.
//
// Example:
//   auto stub = v1::CheckpointService::NewStub(channel);
//   ASSIGN_OR_RETURN(std::string bytes, DownloadCheckpointFile(*stub, "job-000001", /*step=*/0,
//                                                              ModelFileName(0),
//                                                              absl::Minutes(1)));
#ifndef CHORUS_CHECKPOINT_DOWNLOAD_H_
#define CHORUS_CHECKPOINT_DOWNLOAD_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"

namespace chorus {

// `file` of checkpoint `step` of `job_id` (step 0 = the newest usable one).
// DATA_LOSS if it arrives damaged; the coordinator's NOT_FOUND if there is
// no such checkpoint or file.
absl::StatusOr<std::string> DownloadCheckpointFile(v1::CheckpointService::Stub& stub,
                                                   const std::string& job_id, int64_t step,
                                                   const std::string& file, absl::Duration timeout);

}  // namespace chorus

#endif  // CHORUS_CHECKPOINT_DOWNLOAD_H_
