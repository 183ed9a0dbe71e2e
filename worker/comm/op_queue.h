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
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/communicator.h"
#include "worker/comm/flight_recorder.h"

namespace chorus {

// The Work of one queued op; finished exactly once.
class QueuedWork : public Work {
 public:
  QueuedWork(int64_t seq, Fingerprint fingerprint, std::function<void()> body)
      : seq_(seq), fingerprint_(std::move(fingerprint)), body_(std::move(body)) {}

  // A Work that failed before it was issued (bad arguments); it has no seq.
  static std::shared_ptr<Work> Failed(absl::Status status);

  absl::Status Wait(absl::Time deadline) override;
  bool Done() const override;
  int64_t seq() const override { return seq_; }

  const Fingerprint& fingerprint() const { return fingerprint_; }
  // Runs the op's body; may throw whatever the backend throws.
  // REQUIRES: called once, by the queue's thread.
  void RunBody() { body_(); }
  // Publishes the result and drops the body (and the tensors it holds).
  void Finish(absl::Status status);

 private:
  const int64_t seq_;
  const Fingerprint fingerprint_;
  std::function<void()> body_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
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

  // Breaks the queue with `reason` (unless already broken), fails every op
  // not yet started, calls `wake` so the backend can interrupt the op in
  // flight, and joins the thread. Idempotent.
  void Shutdown(absl::Status reason, const std::function<void()>& wake);

 private:
  void RunLoop();

  FlightRecorder& recorder_;
  const Executor execute_;
  absl::Mutex mu_;
  std::deque<std::shared_ptr<QueuedWork>> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t next_collective_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Mutex join_mu_;
  std::thread thread_;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_OP_QUEUE_H_
