// Communicator: how ranks move tensors between each other.
//
// One Communicator joins `size()` ranks of one generation. Every op is
// asynchronous and returns a Work handle; ops start in the order they were
// issued on this rank (one ordered queue), so the same program order on every
// rank gives the same collective order. Each op gets a sequence number and a
// fingerprint in the flight recorder (docs/hang-detection.md).
//
// Failure model (see Note [Communicator failures]):
//   - a peer that dies makes the running op and every later op fail with
//     UNAVAILABLE; a peer that never issues an op makes Wait(deadline) return
//     DEADLINE_EXCEEDED while the op stays "started" in the flight recorder;
//   - Abort() fails everything pending and tears the transport down so that a
//     new Communicator (next generation) can be built in the same process.
//
// Tensors must stay alive and untouched until their Work is done; the
// communicator holds a reference to each tensor it was given.
//
// Thread-safety: ops may be issued from any thread, but the order in which
// concurrent callers issue them is the order they run in, so a program that
// issues from several threads must order them itself. Work::Wait may be called
// from any thread, any number of times.
//
// Example:
//   ASSIGN_OR_RETURN(auto comm, CreateGlooCommunicator(options, store));
//   at::Tensor grad = ...;
//   auto work = comm->AllReduce(grad, ReduceOp::kAvg, "ddp:model/bucket0");
//   RETURN_IF_ERROR(work->Wait(absl::Now() + absl::Seconds(30)));
//
// Part of the SDK's interface ("chorus/communicator.h"): a program calls its
// collectives itself (Session::communicator()). The backends (gloo, NCCL),
// the store they rendezvous through and the flight recorder stay internal
// to Chorus: this header only names FlightRecorder, and the sub-group cache
// the backends share is in worker/comm/group_cache.h.
#ifndef CHORUS_SDK_COMMUNICATOR_H_
#define CHORUS_SDK_COMMUNICATOR_H_

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace chorus {

// Internal to Chorus and not installed with the SDK: a program reads the
// recorder only through the SDK (ProgressReporter, chorus/progress.h).
class FlightRecorder;

// kBand, kBor, kBxor: bitwise and, or and xor of integer and bool tensors,
// on the Gloo backend (NCCL has none).
enum class ReduceOp { kSum, kAvg, kMin, kMax, kBand, kBor, kBxor };
const char* ReduceOpName(ReduceOp op);

// The dtype as fingerprints name it: float32, float64, float16, bfloat16,
// int32, int64, ...
std::string DtypeName(at::ScalarType dtype);

// Checks a NewGroup rank list against a communicator of `size` ranks (sorted,
// unique, in range) and returns the position of `rank` in it: NOT_FOUND if
// `rank` is not a member, INVALID_ARGUMENT for a bad list.
absl::StatusOr<int> GroupIndexOf(const std::vector<int>& ranks, int size, int rank);

// `ranks` of a communicator whose own ranks map to `parent_group` (empty for
// the world) expressed as ranks of the world.
std::vector<int> WorldRanks(const std::vector<int>& ranks, const std::vector<int>& parent_group);

// The handle of one issued op.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the op finished or `deadline`. The op's status, or
  // DEADLINE_EXCEEDED naming the op if it is still running at `deadline`
  // (it keeps running; Wait again or Abort the communicator).
  virtual absl::Status Wait(absl::Time deadline) = 0;
  // Orders the caller's later device work after this op without waiting for
  // the op itself: for a device backend (NCCL) the caller's CUDA stream waits
  // for the op on the GPU, and this returns once that is arranged (the op is
  // enqueued) or with the op's error if it failed before. Work queued on that
  // stream afterwards (copying the result out, say) sees the result. For host
  // backends it is Wait(deadline).
  virtual absl::Status WaitOnDevice(absl::Time deadline) { return Wait(deadline); }
  // True once the op finished (successfully or not).
  virtual bool Done() const = 0;
  // Calls `callback` with the op's status once it finished: at once, on
  // the caller's thread, if it has; otherwise on the thread that finishes
  // it, which must not be blocked for long (hand the work to a thread of
  // your own). Ops finish in any order (point-to-point ops before earlier
  // collectives), so this is how to act on each as it ends. The default
  // suits a Work that is finished when it is returned: it waits, then calls.
  virtual void WhenDone(std::function<void(const absl::Status&)> callback);
  // The op's sequence number in this communicator's flight recorder.
  virtual int64_t seq() const = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Ranks of the parent world that form this communicator, in rank order;
  // empty for a world communicator.
  virtual const std::vector<int>& group() const = 0;

  // Reduces `tensor` across ranks in place. Float dtypes support kSum,
  // kAvg, kMin and kMax; integer dtypes (int64, int32, int8, uint8) and bool
  // all but kAvg, and the bitwise ops on Gloo (kSum of bools is their or).
  // Empty tensors complete at once.
  virtual std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op,
                                          absl::string_view tag) = 0;
  // Copies `root`'s `tensor` into every rank's `tensor`.
  virtual std::shared_ptr<Work> Broadcast(at::Tensor tensor, int root, absl::string_view tag) = 0;
  // Gathers every rank's `input` into `output`, rank r's at the r-th slice of
  // its first dimension. REQUIRES output.numel() == size() * input.numel()
  // and equal dtypes.
  virtual std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output,
                                          absl::string_view tag) = 0;
  // Reduces every rank's `input` and leaves this rank's share in `output`:
  // rank r gets the reduction of the r-th slice (output.numel() elements)
  // of everyone's input, as the first half of an all-reduce, at half its
  // traffic. `input` is left as it was. REQUIRES input.numel() == size() *
  // output.numel() and equal dtypes. Reductions and dtypes as AllReduce.
  // The default fails with UNIMPLEMENTED.
  virtual std::shared_ptr<Work> ReduceScatter(at::Tensor input, at::Tensor output, ReduceOp op,
                                              absl::string_view tag);
  // Returns once every rank reached it.
  virtual std::shared_ptr<Work> Barrier(absl::string_view tag) = 0;
  // Point-to-point. Matching is per pair of ranks, in issue order: the k-th
  // Send from a to b meets the k-th Recv on b from a. On the Gloo backend a
  // Send or Recv holds the queue only while it is posted: it then finishes on
  // its own once the peer posted the matching op, while later ops (other
  // sends and receives, collectives) go on, so a ring where every rank sends
  // to its right and then receives from its left completes, as pipeline and
  // halo exchanges need (Note [Point-to-point progress] in
  // worker/comm/p2p_lanes.h). The NCCL backend runs them in issue order on
  // its stream: there such a ring must use SendRecv.
  virtual std::shared_ptr<Work> Send(at::Tensor tensor, int dst, absl::string_view tag) = 0;
  virtual std::shared_ptr<Work> Recv(at::Tensor tensor, int src, absl::string_view tag) = 0;
  // Sends `send` to `dst` and receives `recv` from `src` as one op (the
  // neighbour exchange of gossip averaging); safe in rings.
  virtual std::shared_ptr<Work> SendRecv(at::Tensor send, int dst, at::Tensor recv, int src,
                                         absl::string_view tag) = 0;

  // A communicator over `ranks` (ranks of this communicator, sorted, unique),
  // cached by rank list. Only members call it, all of them, in the same order
  // relative to their other NewGroup calls. NOT_FOUND if this rank is not in
  // `ranks`; INVALID_ARGUMENT for a bad list.
  virtual absl::StatusOr<std::shared_ptr<Communicator>> NewGroup(std::vector<int> ranks) = 0;

  // A new contiguous 1-D tensor of `numel` elements (contents unspecified)
  // that this communicator reduces fastest: the Gloo backend places it in
  // shared memory when all ranks share a host, so AllReduce need not copy it
  // (DDP allocates its buckets here). Default: at::empty.
  virtual at::Tensor NewBuffer(int64_t numel, const at::TensorOptions& options);

  // Where this communicator's tensors live: the CPU for the Gloo backend,
  // this rank's GPU for NCCL. Engines make the small tensors they exchange
  // (counts, hashes, bucket orders) here. Default: the CPU.
  virtual c10::Device device() const;

  // Fails every pending op with ABORTED (or the status that broke the
  // communicator) and closes the transport. Later ops fail at once. Blocks
  // until the op in progress has returned. Idempotent.
  virtual void Abort(absl::string_view reason) = 0;

  virtual const FlightRecorder& flight_recorder() const = 0;
};

// Note [Communicator failures]
// A transport error (peer closed the connection, process killed) fails the
// op that saw it with UNAVAILABLE and marks the communicator broken: the
// collective schedule of the ranks can no longer be trusted, so every later
// op fails with the same status instead of talking to a half-dead group.
// Recovery is a new generation: Abort() this communicator and build another
// among the survivors. An op that exceeds the communicator's op timeout fails
// with DEADLINE_EXCEEDED and breaks it the same way.

}  // namespace chorus

#endif  // CHORUS_SDK_COMMUNICATOR_H_
