#include "worker/comm/gloo_algorithms.h"

#include <algorithm>
#include <string>

#include "gloo/common/error.h"

namespace chorus {

// ---------------------------------------------------------------- aborting

void AbortHandle::Register(gloo::transport::UnboundBuffer* buffer) {
  absl::MutexLock lock(&mu_);
  if (aborted_) throw gloo::IoException("communicator aborted");
  buffers_.insert(buffer);
}

void AbortHandle::Unregister(gloo::transport::UnboundBuffer* buffer) {
  absl::MutexLock lock(&mu_);
  buffers_.erase(buffer);
}

void AbortHandle::Abort() {
  absl::MutexLock lock(&mu_);
  aborted_ = true;
  for (gloo::transport::UnboundBuffer* b : buffers_) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
}

bool AbortHandle::aborted() const {
  absl::MutexLock lock(&mu_);
  return aborted_;
}

AbortableBuffer::AbortableBuffer(gloo::Context& context, AbortHandle& abort, void* ptr,
                                 size_t bytes)
    : abort_(abort), buffer_(context.createUnboundBuffer(ptr, bytes)) {
  abort_.Register(buffer_.get());
}

AbortableBuffer::~AbortableBuffer() { abort_.Unregister(buffer_.get()); }

void AbortableBuffer::Send(int dst, uint64_t slot, size_t offset, size_t bytes) {
  buffer_->send(dst, slot, offset, bytes);
}

void AbortableBuffer::Recv(int src, uint64_t slot, size_t offset, size_t bytes) {
  buffer_->recv(src, slot, offset, bytes);
}

void AbortableBuffer::WaitSend(std::chrono::milliseconds timeout) {
  // gloo throws on timeout and returns false when the wait was aborted.
  if (!buffer_->waitSend(timeout)) throw gloo::IoException("send aborted: communicator aborted");
}

void AbortableBuffer::WaitRecv(std::chrono::milliseconds timeout) {
  if (!buffer_->waitRecv(timeout)) throw gloo::IoException("recv aborted: communicator aborted");
}

// ---------------------------------------------------------------- all-reduce

namespace {

// [begin, end) of chunk `c` when `count` elements are cut into `n` chunks.
size_t ChunkBegin(size_t count, int n, int c) { return count * c / n; }

// Byte ranges of the segments of one chunk, in order.
struct Segment {
  size_t offset;  // bytes from the start of the data
  size_t bytes;
};

std::vector<Segment> Segments(size_t begin_bytes, size_t end_bytes, size_t segment_bytes,
                              size_t element_size) {
  // Whole elements per segment, at least one.
  const size_t step = std::max(element_size, segment_bytes / element_size * element_size);
  std::vector<Segment> out;
  for (size_t off = begin_bytes; off < end_bytes; off += step) {
    out.push_back({off, std::min(step, end_bytes - off)});
  }
  return out;
}

}  // namespace

// Ring all-reduce over n ranks. The data is cut into n chunks; chunk c starts
// at element ChunkBegin(count, n, c), and chunks are cut into segments.
//
// Reduce-scatter, steps s = 0 .. n-2: rank r sends chunk (r - s) to its right
// neighbour and receives chunk (r - s - 1) from its left neighbour into
// scratch, reducing it into its own copy segment by segment as segments
// arrive. After the last step rank r holds the full reduction of chunk r + 1.
//
// All-gather, steps s = 0 .. n-2: rank r sends chunk (r + 1 - s), which is
// final, to the right and receives chunk (r - s) from the left straight into
// place.
//
// The last reduce-scatter step and the first all-gather step are fused: each
// segment of chunk r + 1 is finalized (e.g. averaged) and sent on as soon as
// it is reduced, so the all-gather starts while the reduce-scatter is still
// receiving.
//
// Every message between a pair of ranks uses the same slot; gloo matches them
// in posting order, which both sides share because they walk the same steps
// with the same segments.
void RingAllreduce(const AllreduceOptions& o) {
  gloo::Context& ctx = *o.context;
  const int n = ctx.size;
  const int rank = ctx.rank;
  if (n == 1 || o.count == 0) return;
  const int right = (rank + 1) % n;
  const int left = (rank + n - 1) % n;
  const size_t esz = o.element_size;
  auto chunk = [&](int c) {
    c = ((c % n) + n) % n;
    return Segment{ChunkBegin(o.count, n, c) * esz,
                   (ChunkBegin(o.count, n, c + 1) - ChunkBegin(o.count, n, c)) * esz};
  };
  auto segments = [&](int c) {
    Segment whole = chunk(c);
    return Segments(whole.offset, whole.offset + whole.bytes, o.segment_bytes, esz);
  };
  size_t max_chunk = 0;
  for (int c = 0; c < n; ++c) max_chunk = std::max(max_chunk, chunk(c).bytes);
  if (o.scratch->size() < max_chunk) o.scratch->resize(max_chunk);

  char* data = static_cast<char*>(o.data);
  char* scratch = o.scratch->data();
  AbortableBuffer out(ctx, *o.abort, data, o.count * esz);
  AbortableBuffer tmp(ctx, *o.abort, scratch, std::max<size_t>(max_chunk, 1));

  for (int s = 0; s < n - 1; ++s) {
    const bool last = s == n - 2;
    const std::vector<Segment> sends = segments(rank - s);
    const std::vector<Segment> recvs = segments(rank - s - 1);
    const size_t recv_base = chunk(rank - s - 1).offset;
    // On the last step chunk r + 1 becomes final; the left neighbour's final
    // chunk r arrives as the first all-gather step.
    const std::vector<Segment> gather_recvs = last ? segments(rank) : std::vector<Segment>();
    for (const Segment& seg : recvs) tmp.Recv(left, o.slot, seg.offset - recv_base, seg.bytes);
    for (const Segment& seg : gather_recvs) out.Recv(left, o.slot, seg.offset, seg.bytes);
    for (const Segment& seg : sends) out.Send(right, o.slot, seg.offset, seg.bytes);
    for (const Segment& seg : recvs) {
      tmp.WaitRecv(o.timeout);
      char* mine = data + seg.offset;
      o.reduce(mine, mine, scratch + (seg.offset - recv_base), seg.bytes / esz);
      if (last) {
        if (o.finalize) o.finalize(mine, seg.bytes / esz);
        out.Send(right, o.slot, seg.offset, seg.bytes);
      }
    }
    const size_t send_count = sends.size() + (last ? recvs.size() : 0);
    for (size_t i = 0; i < send_count; ++i) out.WaitSend(o.timeout);
    for (size_t i = 0; i < gather_recvs.size(); ++i) out.WaitRecv(o.timeout);
  }

  // The remaining all-gather steps pass whole chunks.
  for (int s = 1; s < n - 1; ++s) {
    const Segment send = chunk(rank + 1 - s);
    const Segment recv = chunk(rank - s);
    if (recv.bytes > 0) out.Recv(left, o.slot, recv.offset, recv.bytes);
    if (send.bytes > 0) out.Send(right, o.slot, send.offset, send.bytes);
    if (recv.bytes > 0) out.WaitRecv(o.timeout);
    if (send.bytes > 0) out.WaitSend(o.timeout);
  }
}

// ---------------------------------------------------------- reduce-scatter

// Step s = 0 .. n-2: rank r sends block (r - s - 1), which holds the sum of
// s + 1 ranks' contributions, to the right, and receives block (r - s - 2)
// from the left into scratch, adding its own. The block received last,
// (r - n), is r's own, summed over every rank. Messages of a pair share the
// slot; gloo matches them in posting order, the same on both sides.
void RingReduceScatter(const ReduceScatterOptions& o) {
  gloo::Context& ctx = *o.context;
  const int n = ctx.size;
  const size_t block_bytes = o.block_count * o.element_size;
  if (n == 1 || block_bytes == 0) return;
  const int right = (ctx.rank + 1) % n;
  const int left = (ctx.rank + n - 1) % n;
  if (o.scratch->size() < block_bytes) o.scratch->resize(block_bytes);
  char* data = static_cast<char*>(o.data);
  AbortableBuffer out(ctx, *o.abort, data, block_bytes * n);
  AbortableBuffer in(ctx, *o.abort, o.scratch->data(), block_bytes);
  auto block = [&](int b) { return static_cast<size_t>(((b % n) + n) % n) * block_bytes; };
  for (int s = 0; s < n - 1; ++s) {
    const size_t send_at = block(ctx.rank - s - 1);
    const size_t recv_at = block(ctx.rank - s - 2);
    in.Recv(left, o.slot, 0, block_bytes);
    out.Send(right, o.slot, send_at, block_bytes);
    in.WaitRecv(o.timeout);
    o.reduce(data + recv_at, data + recv_at, o.scratch->data(), o.block_count);
    out.WaitSend(o.timeout);
  }
}

// ---------------------------------------------------------------- broadcast

void DirectBroadcast(const BroadcastOptions& o) {
  gloo::Context& ctx = *o.context;
  if (ctx.size == 1 || o.bytes == 0) return;
  AbortableBuffer buf(ctx, *o.abort, o.data, o.bytes);
  if (ctx.rank == o.root) {
    for (int r = 0; r < ctx.size; ++r) {
      if (r != o.root) buf.Send(r, o.slot, 0, o.bytes);
    }
    for (int r = 0; r < ctx.size - 1; ++r) buf.WaitSend(o.timeout);
  } else {
    buf.Recv(o.root, o.slot, 0, o.bytes);
    buf.WaitRecv(o.timeout);
  }
}

// ---------------------------------------------------------------- all-gather

// Step s: send block (r - s) right, receive block (r - s - 1) from the left.
// After n-1 steps every block has gone all the way round.
void RingAllgather(const AllgatherOptions& o) {
  gloo::Context& ctx = *o.context;
  const int n = ctx.size;
  if (n == 1 || o.block_bytes == 0) return;
  const int right = (ctx.rank + 1) % n;
  const int left = (ctx.rank + n - 1) % n;
  AbortableBuffer out(ctx, *o.abort, o.output, o.block_bytes * n);
  for (int s = 0; s < n - 1; ++s) {
    const int send_block = ((ctx.rank - s) % n + n) % n;
    const int recv_block = ((ctx.rank - s - 1) % n + n) % n;
    out.Recv(left, o.slot, recv_block * o.block_bytes, o.block_bytes);
    out.Send(right, o.slot, send_block * o.block_bytes, o.block_bytes);
    out.WaitRecv(o.timeout);
    out.WaitSend(o.timeout);
  }
}

// ---------------------------------------------------------------- barrier

// Round k (distance d = 2^k): send a byte to r + d, receive one from r - d.
// After ceil(log2 n) rounds every rank has heard, transitively, from all.
void DisseminationBarrier(const BarrierOptions& o) {
  gloo::Context& ctx = *o.context;
  const int n = ctx.size;
  if (n == 1) return;
  char send_byte = 1;
  char recv_byte = 0;
  AbortableBuffer out(ctx, *o.abort, &send_byte, 1);
  AbortableBuffer in(ctx, *o.abort, &recv_byte, 1);
  for (int d = 1; d < n; d *= 2) {
    in.Recv((ctx.rank + n - d) % n, o.slot, 0, 1);
    out.Send((ctx.rank + d) % n, o.slot, 0, 1);
    in.WaitRecv(o.timeout);
    out.WaitSend(o.timeout);
  }
}

}  // namespace chorus
