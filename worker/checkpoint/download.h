// Downloading one file of a committed checkpoint from the coordinator,
// checking every chunk's SHA-256 and the whole file's size and SHA-256.
// (No LibTorch here: the chorus CLI uses it for `chorus export`.)
#ifndef CHORUS_WORKER_CHECKPOINT_DOWNLOAD_H_
#define CHORUS_WORKER_CHECKPOINT_DOWNLOAD_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"

namespace chorus {

// `file` of checkpoint `step` of `job_id` (step 0 = the newest usable one).
// DATA_LOSS if it arrives damaged; the coordinator's NOT_FOUND if there is
// no such checkpoint or file.
absl::StatusOr<std::string> DownloadCheckpointFile(v1::CheckpointService::Stub& stub, const std::string& job_id,
                                                   int64_t step, const std::string& file, absl::Duration timeout);

}  // namespace chorus

#endif  // CHORUS_WORKER_CHECKPOINT_DOWNLOAD_H_
