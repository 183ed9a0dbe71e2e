#include "common/device.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

#ifdef CHORUS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace chorus {

bool BuiltWithCuda() {
#ifdef CHORUS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<int> CudaDeviceCount() {
#ifdef CHORUS_WITH_CUDA
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA reports no usable GPU: ", cudaGetErrorString(err)));
  }
  return count;
#else
  return absl::FailedPreconditionError(
      "this binary was built without CUDA; rebuild with `bazel build --config=cuda`");
#endif
}

absl::Status CheckDevice(v1::ResourceSpec::Device device, int slots) {
  if (device != v1::ResourceSpec::CUDA) return absl::OkStatus();
  ASSIGN_OR_RETURN(int count, CudaDeviceCount());
  if (count < slots) {
    return absl::FailedPreconditionError(absl::StrCat("--device cuda with --slots ", slots,
                                                      " needs ", slots, " GPUs, but CUDA sees ",
                                                      count, " on this machine"));
  }
  return absl::OkStatus();
}

}  // namespace chorus
