// The NCCL backend of Communicator: CUDA tensors, one GPU per rank.
//
// Rank 0 publishes the NCCL unique id through the Store. Each communicator
// owns a CUDA stream; an op waits (with a CUDA event recorded at issue time)
// for the caller's stream, runs on its own stream, and finishes when its
// completion event fires. The op thread only enqueues; a watcher thread
// finishes ops as their events fire and polls ncclCommGetAsyncError; on an
// error, the op timeout or Abort() it calls ncclCommAbort and fails every op
// in flight, so no op can hang the process (Note [Deferred completion] in
// op_queue.h). Work::WaitOnDevice orders the caller's stream after an op
// without waiting on the host.
//
// Built only with --config=cuda; in other builds CreateNcclCommunicator
// returns FAILED_PRECONDITION saying so.
//
// Thread-safety: as Communicator.
//
// Example:
//   NcclOptions options;
//   options.rank = rank;
//   options.size = world;
//   options.device = local_rank;
//   ASSIGN_OR_RETURN(auto comm, CreateNcclCommunicator(options, store));
#ifndef CHORUS_WORKER_COMM_NCCL_COMMUNICATOR_H_
#define CHORUS_WORKER_COMM_NCCL_COMMUNICATOR_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/communicator.h"
#include "common/clock.h"
#include "worker/comm/flight_recorder.h"
#include "worker/comm/store.h"

namespace chorus {

struct NcclOptions {
  int rank = 0;
  int size = 1;
  // CUDA device index of this rank.
  int device = 0;
  absl::Duration connect_timeout = absl::Seconds(60);
  absl::Duration op_timeout = absl::Minutes(5);
  size_t flight_recorder_capacity = FlightRecorder::kDefaultCapacity;
  Clock* clock = nullptr;
  // The caller's CUDA stream (a cudaStream_t) at the time an op is issued;
  // the op starts after the work already queued there. Null function = the
  // legacy default stream. With a CUDA LibTorch, pass
  //   [] { return static_cast<void*>(at::cuda::getCurrentCUDAStream().stream()); }
  std::function<void*()> caller_stream;
};

// True when this build has the NCCL backend.
bool NcclAvailable();

// Builds a communicator of options.size ranks (one per GPU); blocks until NCCL
// is initialised on every rank or connect_timeout passes. `store` must be
// namespaced to this group and outlive the communicator.
absl::StatusOr<std::shared_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options,
                                                                     Store& store);

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_NCCL_COMMUNICATOR_H_
