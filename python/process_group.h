// CommunicatorProcessGroup: torch.distributed's ProcessGroup (c10d) over a
// Chorus Communicator, the `chorus` backend of the Python package
// (docs/python.md). A PyTorch script's collectives, its own and those of
// DistributedDataParallel, run on the job's communicator (Gloo on the CPU,
// NCCL on a GPU) and so go through its flight recorder: the rank's heartbeats
// carry it and the coordinator's hang detector reads it as it reads a
// built-in rank's.
//
// How each c10d op maps (Note [Ops on a Communicator]):
//   allreduce, broadcast, barrier, send, recv, _allgather_base: one op each;
//   allgather, gather: an all-gather into one flat buffer, copied out;
//   reduce_scatter(_base): a ring reduce-scatter ((n - 1) / n of the input
//     on the wire per rank), a list first laid out in one flat buffer;
//   reduce: an all-reduce (into a copy on ranks other than the root);
//   scatter: a broadcast of the root's inputs in one flat buffer;
//   alltoall, alltoall_base: a send and a receive per other rank (uneven
//     splits too), this rank's own part copied;
//   allreduce_coalesced, allgather_coalesced, recv from any source,
//   monitored_barrier: refused with an error naming the op.
// Reductions: SUM, AVG, MIN, MAX, and BAND, BOR, BXOR (integer and bool
// tensors on the CPU); PRODUCT and PREMUL_SUM are refused by name.
//
// Completion: ops finish in any order (an irecv before an earlier isend
// whose peer has not yet received: Note [Point-to-point progress] in
// worker/comm/p2p_lanes.h), so each tells the group when it finished and one
// thread of the group finishes their c10d Work and its Future (which DDP's
// reducer chains on) in the order they finished, off the communicator's
// threads. A failed op's Work raises the Chorus status as "CODE: message"
// (UNAVAILABLE: a peer was lost; ABORTED: the generation ended;
// DEADLINE_EXCEEDED).
//
// Thread-safety: ops may be issued from any thread (torch's autograd threads
// do); their order is the order of the calls, as for the Communicator.
#ifndef CHORUS_PYTHON_PROCESS_GROUP_H_
#define CHORUS_PYTHON_PROCESS_GROUP_H_

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/communicator.h"
#include "worker/comm/store.h"

namespace chorus {

class ProgressReporter;

// One c10d op's handle. Its Future holds the op's output tensors.
class CommunicatorWork : public c10d::Work {
 public:
  // `progress` (may be null) is put in phase COLLECTIVE while a caller
  // waits.
  CommunicatorWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                   ProgressReporter* progress);

  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Finishes the Work and its Future (an error for a failed `status`).
  void Complete(const absl::Status& status);

 private:
  const std::vector<at::Tensor> outputs_;
  ProgressReporter* const progress_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class CommunicatorProcessGroup : public c10d::ProcessGroup {
 public:
  // `comm` is this generation's communicator; `progress` (may be null) is
  // the rank's progress reporter, which `owner` (may be null) keeps alive
  // for as long as the group lives.
  // `exit_grace`: how long destruction waits for ops still running.
  CommunicatorProcessGroup(std::shared_ptr<Communicator> comm, ProgressReporter* progress,
                           std::shared_ptr<const void> owner = nullptr,
                           absl::Duration exit_grace = absl::Seconds(10));
  // Waits for the ops issued so far, up to `exit_grace`; then aborts the
  // communicator (failing them) rather than hang: a script that ends, or
  // drops its group, while a collective waits for a peer that never comes
  // still exits.
  ~CommunicatorProcessGroup() override;

  const std::string getBackendName() const override { return "chorus"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // Sequence numbers: the count of ops this group has issued.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override;

 private:
  // A finished op: the c10d Work to finish, what to do first if it
  // succeeded (copy the result out), and its status.
  struct Finished {
    c10::intrusive_ptr<CommunicatorWork> work;
    std::function<void()> after;
    absl::Status status;
  };
  // What the ops' callbacks share with the completion thread; it outlives
  // the group for a callback that comes late.
  struct Completions {
    absl::Mutex mu;
    std::deque<Finished> finished ABSL_GUARDED_BY(mu);
    size_t unfinished ABSL_GUARDED_BY(mu) = 0;  // issued, not yet completed
    bool stopping ABSL_GUARDED_BY(mu) = false;
  };

  // Has `op` finish its c10d Work once it finished, and returns that Work.
  c10::intrusive_ptr<c10d::Work> Track(std::shared_ptr<Work> op, c10d::OpType type,
                                       std::vector<at::Tensor> outputs,
                                       std::function<void()> after = nullptr);
  void CompleteAsFinished();
  // Sends sends[p] to every other rank p and receives receives[p] from it,
  // copies this rank's own part, and tracks it all as one Work (Note
  // [All-to-all as sends and receives] in process_group.cc).
  c10::intrusive_ptr<c10d::Work> Exchange(const std::vector<at::Tensor>& sends,
                                          const std::vector<at::Tensor>& receives,
                                          c10d::OpType type, std::vector<at::Tensor> outputs,
                                          std::function<void()> after = nullptr);
  // Waits up to `timeout` for every op issued to be completed; false if
  // some are not.
  bool AwaitAllCompleted(absl::Duration timeout);

  const std::shared_ptr<Communicator> comm_;
  ProgressReporter* const progress_;
  const std::shared_ptr<const void> owner_;
  const absl::Duration exit_grace_;
  const std::shared_ptr<Completions> completions_;
  std::atomic<uint64_t> issued_{0};
  std::thread completer_;
};

// torch.distributed's Store interface over a Chorus Store (the generation's
// namespace at the coordinator), given to init_process_group so that its
// rendezvous barrier meets the other ranks (a store private to the process
// would wait for them forever). set, get, add, check and wait are served;
// compare_set, delete_key and num_keys are refused by name. Waits without
// a timeout use the store's (set_timeout; torch's default 5 minutes).
class TorchStore : public c10d::Store {
 public:
  // `store` must stay alive as long as `owner` does, which the store keeps.
  TorchStore(chorus::Store& store, std::shared_ptr<const void> owner);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& current,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  chorus::Store& store_;
  const std::shared_ptr<const void> owner_;
};

// The Communicator reduction for a c10d one; INVALID_ARGUMENT naming the
// op and `collective` for a reduction the backend does not offer.
absl::StatusOr<ReduceOp> ToChorusReduceOp(const c10d::ReduceOp& op, const char* collective);

// Note [Tensors die on Python's terms]
// A tensor made in Python keeps its Python object alive while C++ holds it,
// and whoever drops the last reference frees that object, taking the GIL.
// On one of the communicator's threads during the interpreter's shutdown
// that ends the thread by force, and the process with "terminate called
// without an active exception": a script's isend ring exited so, now and
// then, after every exchange had succeeded. So no thread of the group or of
// the communicator keeps an op's tensors past the op: the communicator
// drops its references before it finishes the op, an op's callback hands
// its Work over without keeping a copy, and the completion thread drops
// its own before the op counts as completed, which is what the group's
// destruction (destroy_process_group) waits for. What is left then is
// Python's own.

// Note [Ops on a Communicator]
// c10d's interface passes lists: one tensor per device of this process
// (always one here: a rank owns one device) and, for gathers, one per rank.
// The Communicator takes one contiguous tensor per op, so lists are laid
// out in one flat buffer, the op runs on it, and the completion thread
// copies the slices out before the Work is finished; the Work (and DDP's
// Future) therefore never completes before the outputs hold the result.
// Inputs that a c10d op must leave unchanged (reduce on a non-root,
// reduce_scatter's input) are copied first.

}  // namespace chorus

#endif  // CHORUS_PYTHON_PROCESS_GROUP_H_
