#include "worker/train/device_fence.h"

#include "absl/strings/str_cat.h"

#ifdef CHORUS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace chorus {

#ifdef CHORUS_WITH_CUDA

namespace {

absl::Status CudaError(cudaError_t err, const char* what, int device) {
  return absl::InternalError(absl::StrCat(what, " on GPU ", device, ": ", cudaGetErrorString(err)));
}

// Runs `f` with `device` current on this thread, restoring the previous one.
template <typename F>
cudaError_t OnDevice(int device, F f) {
  int previous = -1;
  cudaError_t err = cudaGetDevice(&previous);
  if (err != cudaSuccess) return err;
  if (previous != device && (err = cudaSetDevice(device)) != cudaSuccess) return err;
  err = f();
  if (previous != device) cudaSetDevice(previous);
  return err;
}

}  // namespace

absl::StatusOr<std::shared_ptr<DeviceFence>> DeviceFence::Record(int device) {
  cudaEvent_t event = nullptr;
  cudaError_t err = OnDevice(device, [&] {
    cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    // Stream 0: the legacy default stream, LibTorch's default current stream.
    if (e == cudaSuccess) e = cudaEventRecord(event, nullptr);
    return e;
  });
  if (err != cudaSuccess) {
    if (event != nullptr) cudaEventDestroy(event);
    return CudaError(err, "recording a fence after the checkpoint's copies", device);
  }
  return std::shared_ptr<DeviceFence>(new DeviceFence(device, event));
}

DeviceFence::~DeviceFence() {
  auto event = static_cast<cudaEvent_t>(event_);
  cudaEventSynchronize(event);
  cudaEventDestroy(event);
}

absl::Status DeviceFence::Wait() {
  const cudaError_t err = cudaEventSynchronize(static_cast<cudaEvent_t>(event_));
  if (err != cudaSuccess) return CudaError(err, "waiting for the checkpoint's copies", device_);
  return absl::OkStatus();
}

#else  // !CHORUS_WITH_CUDA

absl::StatusOr<std::shared_ptr<DeviceFence>> DeviceFence::Record(int device) {
  return absl::FailedPreconditionError(
      absl::StrCat("GPU ", device, ": this build has no CUDA (build with --config=cuda)"));
}

DeviceFence::~DeviceFence() = default;

absl::Status DeviceFence::Wait() { return absl::OkStatus(); }

#endif  // CHORUS_WITH_CUDA

}  // namespace chorus
