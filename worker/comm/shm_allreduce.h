// All-reduce through shared memory for the ranks of one communicator that run
// on one host (Note [Shared-memory all-reduce]). The Gloo backend uses it in
// place of its TCP ring when every rank is on the same host; every other op
// stays on TCP.
//
// Thread-safety: Run is called by the communicator's op thread only; Close and
// NewBuffer may be called from any thread. Buffers from NewBuffer stay valid
// after the ShmAllreduce is gone.
//
// Example (inside the Gloo backend):
//   ASSIGN_OR_RETURN(std::unique_ptr<ShmAllreduce> shm,
//                    ShmAllreduce::Connect(options, store, deadline));
//   if (shm != nullptr) shm->Run(op, abort);  // else the TCP ring
#ifndef CHORUS_WORKER_COMM_SHM_ALLREDUCE_H_
#define CHORUS_WORKER_COMM_SHM_ALLREDUCE_H_

#include <ATen/core/Tensor.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/gloo_algorithms.h"
#include "worker/comm/store.h"

namespace chorus {

// What "the same host" means for shared memory: one kernel boot, and the same
// network, mount and PID namespaces (ranks in separate network namespaces are
// separate hosts to Chorus, even on one machine).
std::string SharedMemoryHostKey();

class ShmArena;

class ShmAllreduce {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    // All-reduces are cut into segments of this many bytes; one segment is
    // published, reduced and handed back before the next. Also the size of
    // each of the two staging slots through which tensors outside the arena
    // travel.
    size_t segment_bytes = size_t{1} << 20;
  };

  // Sets up shared memory among options.size ranks through `store` (already
  // namespaced to this group). Returns nullptr, on every rank alike, when the
  // ranks are not all on one host or one of them cannot map another's memory;
  // an error only when the store fails or `deadline` passes.
  static absl::StatusOr<std::unique_ptr<ShmAllreduce>> Connect(const Options& options, Store& store,
                                                               absl::Time deadline);

  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // A contiguous CPU tensor of `numel` elements in this rank's shared memory,
  // which Run reduces in place without copying it in and out; an undefined
  // tensor when the arena has no room (use ordinary memory then).
  at::Tensor NewBuffer(int64_t numel, const at::TensorOptions& options);

  struct Op {
    void* data = nullptr;  // contiguous, reduced in place
    size_t count = 0;      // elements
    size_t element_size = 0;
    ReduceFunction reduce;
    // Applied to the reduced values (e.g. dividing by size for an average).
    std::function<void(void*, size_t)> finalize;
    // Set for float32 sums and averages: a fused loop replaces reduce and
    // finalize. `scale` multiplies the sum (1 for kSum).
    bool float_sum = false;
    float scale = 1.0f;
    // Identifies the op (fingerprint and sequence): ranks wait until their
    // peers publish the same value, so different collectives at the same
    // position never mix data (the hang detector reports the mismatch).
    uint64_t slot = 0;
    std::chrono::milliseconds timeout{0};
  };

  // All-reduces `op` in place. Throws gloo::IoException when a peer exits or
  // closes its communicator ("... is gone"), when `abort` is aborted, or after
  // op.timeout ("Timed out ...").
  void Run(const Op& op, const AbortHandle& abort);

  // Tells the peers this rank is gone: their waits fail at once. Run calls it
  // when an op fails, since the communicator is broken from then on.
  void Close();

 private:
  struct Peer;
  ShmAllreduce(const Options& options, std::shared_ptr<ShmArena> self,
               std::vector<std::unique_ptr<Peer>> peers);

  void Publish(uint64_t slot, size_t offset, size_t bytes);
  void WaitReady(int peer, uint32_t seq, uint64_t slot, absl::Time deadline,
                 const AbortHandle& abort);
  // The per-segment counters a rank bumps after reducing its slice (kDone)
  // and after gathering every slice into its output (kCopied).
  enum class Counter { kDone, kCopied };
  void WaitCounter(int peer, Counter counter, uint32_t seq, absl::Time deadline,
                   const AbortHandle& abort);
  // Throws if a peer this rank still needs for segment `seq` is gone, `abort`
  // is aborted or `deadline` passed (naming `awaited`). `arrived` says
  // whether what is awaited from `awaited` has come (Note [A peer that
  // finished and left]).
  void CheckPeers(int awaited, uint32_t seq, absl::Time deadline, const AbortHandle& abort,
                  const std::function<bool()>& arrived) const;
  void RunSegments(const Op& op, const AbortHandle& abort);
  // Reduces this rank's slice of the segment into its own source.
  void ReduceSlice(const Op& op, const std::vector<char*>& sources, size_t elements);

  const Options options_;
  std::shared_ptr<ShmArena> self_;
  // Indexed by rank; this rank's entry maps self_.
  std::vector<std::unique_ptr<Peer>> peers_;
  uint32_t seq_ = 0;
  bool staging_reserved_ = false;
};

// Note [Shared-memory all-reduce]
// Ranks on one host gain nothing from TCP over loopback: every byte is copied
// into the kernel and out again, and on a machine with few cores those copies
// compete with training for the same CPUs. Instead each rank owns a shared
// memory arena (a POSIX shm object, unlinked once every peer has mapped it, so
// a killed job leaves nothing in /dev/shm) holding a control block, a staging
// area and buffers handed out by NewBuffer (DDP allocates its buckets there).
// For each segment of an all-reduce:
//   1. each rank publishes where its segment lies in its arena (the tensor
//      itself when it lives there, else a copy in the staging area) and bumps
//      its `ready` counter;
//   2. once every peer is ready, rank r reduces the r-th slice of the segment
//      across all ranks' segments (its own values first, then the others in
//      rank order) into that slice of its own segment and bumps `done`;
//   3. each rank gathers: for every peer, once that peer is `done`, it copies
//      the peer's reduced slice out of the peer's segment into its output
//      (and its own slice too, if it staged), then bumps `copied`.
// A rank writes only its own memory; peers only read it. Stores into lines
// that another core holds cost a cross-core round trip each, and reading
// them is what the hardware prefetches well: writing the result into every
// peer's segment measured 3-6x slower than this. Staging uses two slots in
// turn: a rank stages segment s+1 while its peers may still gather segment s
// from the other slot, and it cannot reach s+2 before every peer has
// published s+1, which each does only after gathering s. A rank whose
// tensor lives in its arena (peers read the caller's memory itself) waits at
// the end of the op until every peer is `copied`.
// Every element is reduced by exactly one rank, so all ranks end with
// identical bits, and the same inputs give the same bits in every run. Waits
// spin briefly, then sleep on a futex in the shared page in slices of a few
// milliseconds, checking between slices whether the peer's process has exited
// or closed its communicator (UNAVAILABLE at once, as a closed TCP connection
// gives), the abort flag and the op deadline. Arena pages are reserved with
// fallocate before use: touching an unreserved page of a full tmpfs would kill
// the process with SIGBUS instead of returning an error.

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_SHM_ALLREDUCE_H_
