// Collective algorithms over Gloo unbound buffers, written so that every wait
// can be interrupted: Abort() wakes the op in flight instead of leaving it
// blocked until the op timeout (gloo's own algorithms keep their buffers
// private, so nothing outside can wake them).
//
// Each algorithm is an options struct and a free function, as in gloo. They
// run on the communicator's single op thread; AbortHandle::Abort may be called
// from any other thread.
#ifndef CHORUS_WORKER_COMM_GLOO_ALGORITHMS_H_
#define CHORUS_WORKER_COMM_GLOO_ALGORITHMS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"

namespace chorus {

// The unbound buffers of the op in flight. Abort() makes their pending and
// future waits return, so the op throws gloo::IoException("...aborted").
class AbortHandle {
 public:
  // Throws gloo::IoException if already aborted.
  void Register(gloo::transport::UnboundBuffer* buffer);
  void Unregister(gloo::transport::UnboundBuffer* buffer);
  void Abort();
  bool aborted() const;

 private:
  mutable absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::set<gloo::transport::UnboundBuffer*> buffers_ ABSL_GUARDED_BY(mu_);
};

// An unbound buffer over [ptr, ptr + bytes) registered with an AbortHandle
// for its lifetime; waits throw on timeout (gloo) or abort (ours).
class AbortableBuffer {
 public:
  AbortableBuffer(gloo::Context& context, AbortHandle& abort, void* ptr, size_t bytes);
  ~AbortableBuffer();
  AbortableBuffer(const AbortableBuffer&) = delete;
  AbortableBuffer& operator=(const AbortableBuffer&) = delete;

  void Send(int dst, uint64_t slot, size_t offset, size_t bytes);
  void Recv(int src, uint64_t slot, size_t offset, size_t bytes);
  void WaitSend(std::chrono::milliseconds timeout);
  void WaitRecv(std::chrono::milliseconds timeout);

 private:
  AbortHandle& abort_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
};

using ReduceFunction = std::function<void(void*, const void*, const void*, size_t)>;

struct AllreduceOptions {
  gloo::Context* context = nullptr;
  AbortHandle* abort = nullptr;
  void* data = nullptr;  // reduced in place
  size_t count = 0;      // elements
  size_t element_size = 0;
  ReduceFunction reduce;
  // Applied in place to each fully reduced segment before it is passed on
  // (e.g. dividing by the world size for an average); may be empty. Each rank
  // finalizes only the chunk it owns, so this costs 1/size of a pass.
  std::function<void(void*, size_t)> finalize;
  uint64_t slot = 0;
  std::chrono::milliseconds timeout{0};
  // Messages are cut into segments of at most this size so that reducing one
  // segment overlaps receiving the next.
  size_t segment_bytes = size_t{1} << 20;
  // Scratch space the algorithm may grow; reused across calls.
  std::vector<char>* scratch = nullptr;
};

// Ring all-reduce: reduce-scatter then all-gather around the ring.
void RingAllreduce(const AllreduceOptions& options);

struct ReduceScatterOptions {
  gloo::Context* context = nullptr;
  AbortHandle* abort = nullptr;
  // `size` blocks of `block_count` elements, block b destined for rank b;
  // reduced in place: afterwards this rank's block holds the reduction of
  // every rank's (the other blocks hold partial sums).
  void* data = nullptr;
  size_t block_count = 0;
  size_t element_size = 0;
  ReduceFunction reduce;
  uint64_t slot = 0;
  std::chrono::milliseconds timeout{0};
  // Room for one block; grown as needed and reused across calls.
  std::vector<char>* scratch = nullptr;
};

// Ring reduce-scatter: size - 1 steps, each passing one partially reduced
// block to the right neighbour, so every rank sends (size - 1) / size of
// the data (an all-reduce sends twice that).
void RingReduceScatter(const ReduceScatterOptions& options);

struct BroadcastOptions {
  gloo::Context* context = nullptr;
  AbortHandle* abort = nullptr;
  void* data = nullptr;
  size_t bytes = 0;
  int root = 0;
  uint64_t slot = 0;
  std::chrono::milliseconds timeout{0};
};

// The root sends its buffer to every other rank directly.
void DirectBroadcast(const BroadcastOptions& options);

struct AllgatherOptions {
  gloo::Context* context = nullptr;
  AbortHandle* abort = nullptr;
  // `output` holds size blocks of `block_bytes`; this rank's input must
  // already be in its own block.
  void* output = nullptr;
  size_t block_bytes = 0;
  uint64_t slot = 0;
  std::chrono::milliseconds timeout{0};
};

// Ring all-gather: each step passes one block to the right neighbour.
void RingAllgather(const AllgatherOptions& options);

struct BarrierOptions {
  gloo::Context* context = nullptr;
  AbortHandle* abort = nullptr;
  uint64_t slot = 0;
  std::chrono::milliseconds timeout{0};
};

// Dissemination barrier: ceil(log2(size)) rounds of one-byte messages.
void DisseminationBarrier(const BarrierOptions& options);

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_GLOO_ALGORITHMS_H_
