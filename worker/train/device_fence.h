// A point in a GPU's queue of work that another thread can wait for.
//
// A checkpoint of a job on a GPU copies its tensors into pinned host memory
// asynchronously, on the training stream (LibTorch's current stream, the
// legacy default stream unless the program changed it): the training thread
// only enqueues the copies and records a fence after them, and the
// checkpoint writer's thread waits for the fence before it reads the memory.
// Training stalls for the copies on the GPU, never on the host.
//
// Without CUDA in the build (or for a CPU job) there is nothing to wait for:
// Record returns FAILED_PRECONDITION and callers copy synchronously.
//
// Thread-safety: Record on the thread that queued the work; Wait from any
// thread, any number of times.
//
// Example:
//   dst.copy_(src_on_gpu, /*non_blocking=*/true);   // dst pinned
//   ASSIGN_OR_RETURN(std::shared_ptr<DeviceFence> f, DeviceFence::Record(0));
//   ... on another thread:  RETURN_IF_ERROR(f->Wait());  then read dst
#ifndef CHORUS_WORKER_TRAIN_DEVICE_FENCE_H_
#define CHORUS_WORKER_TRAIN_DEVICE_FENCE_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace chorus {

class DeviceFence {
 public:
  // A fence after the work queued so far on GPU `device`'s current stream.
  static absl::StatusOr<std::shared_ptr<DeviceFence>> Record(int device);

  // Waits for the fence: memory the fenced copies write must not be freed
  // or reused before they are done.
  ~DeviceFence();
  DeviceFence(const DeviceFence&) = delete;
  DeviceFence& operator=(const DeviceFence&) = delete;

  // Blocks until the GPU has passed the fence; the CUDA error if the device
  // failed meanwhile.
  absl::Status Wait();

 private:
  DeviceFence(int device, void* event) : device_(device), event_(event) {}

  int device_;
  void* event_;  // a cudaEvent_t
};

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_DEVICE_FENCE_H_
