// OpQueue: the ordered op queue every Communicator backend runs on.
//
// Ops are recorded in the flight recorder when issued and run one at a time,
// in issue order, on the queue's own thread. The first op that fails breaks
// the queue (Note [Communicator failures] in communicator.h): every later op
// fails with that status without running.
//
// Thread-safety: Issue() and Shutdown() may be called from any thread.
//
// Example:
//   OpQueue queue(recorder, [](const QueuedWork& w) { return RunCatchingErrors(w); });
//   std::shared_ptr<Work> w = queue.Issue(fp, /*collective=*/true,
//                                         [](uint32_t index) { ... });
//   queue.Shutdown(absl::AbortedError("bye"), [&] { WakeTransport(); });
#ifndef CHORUS_WORKER_COMM_OP_QUEUE_H_
#define CHORUS_WORKER_COMM_OP_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "chorus/communicator.h"
#include "worker/comm/flight_recorder.h"

namespace chorus {

// The Work of one queued op; finished exactly once.
class QueuedWork : public Work, public std::enable_shared_from_this<QueuedWork> {
 public:
  QueuedWork(int64_t seq, Fingerprint fingerprint, std::function<void()> body)
      : seq_(seq), fingerprint_(std::move(fingerprint)), body_(std::move(body)) {}

  // A Work that failed before it was issued (bad arguments); it has no seq.
  static std::shared_ptr<Work> Failed(absl::Status status);

  absl::Status Wait(absl::Time deadline) override;
  absl::Status WaitOnDevice(absl::Time deadline) override;
  bool Done() const override;
  void WhenDone(std::function<void(const absl::Status&)> callback) override;
  int64_t seq() const override { return seq_; }

  const Fingerprint& fingerprint() const { return fingerprint_; }
  // Runs the op's body; may throw whatever the backend throws.
  // REQUIRES: called once, by the queue's thread.
  void RunBody() { body_(); }
  // Publishes the result and drops the body (and the tensors it holds).
  void Finish(absl::Status status);

  // For ops that finish after the body has returned (Note [Deferred
  // completion]): called by the body once the op is on its way; for a device
  // op `order_after` makes the caller's stream wait for it (WaitOnDevice),
  // for a host op (null) WaitOnDevice waits for it. The queue then leaves
  // the op started, and the backend finishes it with OpQueue::Complete.
  void Defer(std::function<absl::Status()> order_after);
  bool deferred() const;

 private:
  const int64_t seq_;
  const Fingerprint fingerprint_;
  std::function<void()> body_;
  mutable absl::Mutex mu_;
  bool deferred_ ABSL_GUARDED_BY(mu_) = false;
  std::function<absl::Status()> order_after_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(const absl::Status&)>> callbacks_ ABSL_GUARDED_BY(mu_);
};

class OpQueue {
 public:
  // Runs one op and turns whatever it throws into a Status naming the op.
  using Executor = std::function<absl::Status(QueuedWork&)>;

  // `recorder` is not owned and must outlive the queue.
  OpQueue(FlightRecorder& recorder, Executor execute);
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;
  // Shuts down with ABORTED if Shutdown was not called.
  ~OpQueue();

  // Records the op and queues it. `body` receives the op's collective index
  // (0, 1, ... among ops issued with collective=true; equal on every rank
  // that issues the same collectives) and runs on the queue's thread.
  std::shared_ptr<Work> Issue(Fingerprint fingerprint, bool collective,
                              std::function<void(uint32_t collective_index)> body);
  // The same for a point-to-point op: a send to `send_to`, a receive from
  // `recv_from`, or both (a SendRecv); -1 for a part it does not have. The
  // flight recorder numbers its parts per peer (OpIndex).
  std::shared_ptr<Work> IssuePointToPoint(Fingerprint fingerprint, int send_to, int recv_from,
                                          std::function<void()> body);

  // Breaks the queue with `reason` (unless already broken), fails every op
  // not yet started, calls `wake` so the backend can interrupt the op in
  // flight, and joins the thread. Idempotent.
  void Shutdown(absl::Status reason, const std::function<void()>& wake);

  // Finishes a deferred op (QueuedWork::Defer) with `status`, as the queue
  // finishes the others: flight recorder, and a failure breaks the queue.
  // From any thread, in any order (a device backend's ops finish in issue
  // order; a host backend's point-to-point ops as their peers answer).
  void Complete(QueuedWork& work, absl::Status status);

 private:
  void RunLoop();
  void Conclude(QueuedWork& work, absl::Status status);
  std::shared_ptr<Work> IssueLocked(Fingerprint fingerprint, OpIndex index,
                                    std::function<void()> body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  FlightRecorder& recorder_;
  const Executor execute_;
  absl::Mutex mu_;
  std::deque<std::shared_ptr<QueuedWork>> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t next_collective_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, int64_t> sends_to_ ABSL_GUARDED_BY(mu_);      // per peer
  std::map<int, int64_t> receives_from_ ABSL_GUARDED_BY(mu_);  // per peer
  absl::Mutex join_mu_;
  std::thread thread_;
};

// Note [Deferred completion]
// A host backend (Gloo) runs an op to its end on the queue's thread. A device
// backend (NCCL) only enqueues it there: the op runs on the GPU while the
// queue's thread enqueues the next one, and the backend's own watcher finishes
// it (OpQueue::Complete) when its completion event fires, or fails it on an
// error, the op timeout or an abort. Until then the flight recorder shows it
// started, so hang detection sees what the GPU is doing, and Wait() blocks.
// WaitOnDevice() lets a caller order its stream after the op instead, so the
// host never waits for the GPU (DDP's gradient sync, Note [Device buckets]).
// A host backend defers its point-to-point ops the same way once they are
// posted (Note [Point-to-point progress] in p2p_lanes.h).

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_OP_QUEUE_H_
