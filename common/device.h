// Which compute devices this build and this machine can use.
//
// Thread-safe; queries the CUDA runtime on each call in CUDA builds.
//
// Example:
//   absl::Status s = chorus::CheckDevice(chorus::v1::ResourceSpec::CUDA, 8);
//   if (!s.ok()) { LOG(ERROR) << s; return 2; }   // names what is missing
#ifndef CHORUS_COMMON_DEVICE_H_
#define CHORUS_COMMON_DEVICE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chorus/v1/job.pb.h"

namespace chorus {

// True when this binary was built with --config=cuda.
bool BuiltWithCuda();

// Number of CUDA devices visible to this process; FAILED_PRECONDITION naming
// the cause when the build has no CUDA or the driver/runtime reports an error.
absl::StatusOr<int> CudaDeviceCount();

// OK if `slots` ranks can run on `device` here: always for CPU; for CUDA, the
// build must have CUDA and the machine at least `slots` GPUs.
absl::Status CheckDevice(v1::ResourceSpec::Device device, int slots);

}  // namespace chorus

#endif  // CHORUS_COMMON_DEVICE_H_
