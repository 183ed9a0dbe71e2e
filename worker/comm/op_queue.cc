#include "worker/comm/op_queue.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace chorus {

std::shared_ptr<Work> QueuedWork::Failed(absl::Status status) {
  auto work = std::make_shared<QueuedWork>(0, Fingerprint(), nullptr);
  work->Finish(std::move(status));
  return work;
}

absl::Status QueuedWork::Wait(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithDeadline(absl::Condition(&done_), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("op #", seq_, " (", fingerprint_.ToString(),
                                                    ") has not finished by its deadline"));
  }
  return status_;
}

absl::Status QueuedWork::WaitOnDevice(absl::Time deadline) {
  std::function<absl::Status()> order_after;
  {
    absl::MutexLock lock(&mu_);
    auto enqueued = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ || deferred_; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&enqueued), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "op #", seq_, " (", fingerprint_.ToString(), ") was not enqueued by its deadline"));
    }
    if (done_) return status_;
    order_after = order_after_;
  }
  return order_after ? order_after() : Wait(deadline);
}

void QueuedWork::Defer(std::function<absl::Status()> order_after) {
  absl::MutexLock lock(&mu_);
  order_after_ = std::move(order_after);
  deferred_ = true;
}

bool QueuedWork::deferred() const {
  absl::MutexLock lock(&mu_);
  return deferred_;
}

bool QueuedWork::Done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

void QueuedWork::WhenDone(std::function<void(const absl::Status&)> callback) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (!done_) {
      callbacks_.push_back(std::move(callback));
      return;
    }
    status = status_;
  }
  callback(status);
}

void QueuedWork::Finish(absl::Status status) {
  // The body (and the tensors it captured) goes before the waiter wakes: once
  // Wait returns, the communicator holds no reference to the caller's
  // tensors, so memory the caller frees is free (and reused) at once.
  std::function<void()> body;
  {
    absl::MutexLock lock(&mu_);
    body.swap(body_);
  }
  body = nullptr;
  std::vector<std::function<void(const absl::Status&)>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
    callbacks.swap(callbacks_);
  }
  for (auto& callback : callbacks) callback(status);
}

OpQueue::OpQueue(FlightRecorder& recorder, Executor execute)
    : recorder_(recorder), execute_(std::move(execute)) {
  thread_ = std::thread([this] { RunLoop(); });
}

OpQueue::~OpQueue() {
  Shutdown(absl::AbortedError("communicator destroyed"), [] {});
}

std::shared_ptr<Work> OpQueue::Issue(Fingerprint fingerprint, bool collective,
                                     std::function<void(uint32_t)> body) {
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return QueuedWork::Failed(broken_);
  const uint32_t index = collective ? next_collective_++ : 0;
  OpIndex op_index;
  if (collective) op_index.collective = static_cast<int64_t>(index) + 1;
  return IssueLocked(std::move(fingerprint), op_index,
                     [body = std::move(body), index] { body(index); });
}

std::shared_ptr<Work> OpQueue::IssuePointToPoint(Fingerprint fingerprint, int send_to,
                                                 int recv_from, std::function<void()> body) {
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return QueuedWork::Failed(broken_);
  OpIndex index;
  if (send_to >= 0) {
    index.send_to = send_to;
    index.send = ++sends_to_[send_to];
  }
  if (recv_from >= 0) {
    index.recv_from = recv_from;
    index.recv = ++receives_from_[recv_from];
  }
  return IssueLocked(std::move(fingerprint), index, std::move(body));
}

std::shared_ptr<Work> OpQueue::IssueLocked(Fingerprint fingerprint, OpIndex index,
                                           std::function<void()> body) {
  const int64_t seq = recorder_.Enqueued(fingerprint, index);
  auto work = std::make_shared<QueuedWork>(seq, std::move(fingerprint), std::move(body));
  queue_.push_back(work);
  return work;
}

void OpQueue::Shutdown(absl::Status reason, const std::function<void()>& wake) {
  std::deque<std::shared_ptr<QueuedWork>> dropped;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = std::move(reason);
    status = broken_;
    dropped.swap(queue_);
    stopping_ = true;
  }
  for (auto& work : dropped) {
    recorder_.Finished(work->seq(), OpState::kFailed, std::string(status.message()));
    work->Finish(status);
  }
  wake();
  absl::MutexLock lock(&join_mu_);
  if (thread_.joinable()) thread_.join();
}

void OpQueue::RunLoop() {
  while (true) {
    std::shared_ptr<QueuedWork> work;
    absl::Status broken;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](OpQueue* q)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) { return q->stopping_ || !q->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping
      work = std::move(queue_.front());
      queue_.pop_front();
      broken = broken_;
    }
    if (!broken.ok()) {
      recorder_.Finished(work->seq(), OpState::kFailed, std::string(broken.message()));
      work->Finish(broken);
      continue;
    }
    recorder_.Started(work->seq());
    absl::Status status = execute_(*work);
    // Note [Deferred completion]: the backend finishes it.
    if (status.ok() && work->deferred()) continue;
    Conclude(*work, std::move(status));
  }
}

void OpQueue::Complete(QueuedWork& work, absl::Status status) { Conclude(work, std::move(status)); }

void OpQueue::Conclude(QueuedWork& work, absl::Status status) {
  if (status.ok()) {
    recorder_.Finished(work.seq(), OpState::kCompleted, "");
  } else {
    recorder_.Finished(work.seq(),
                       status.code() == absl::StatusCode::kDeadlineExceeded ? OpState::kTimedOut
                                                                            : OpState::kFailed,
                       std::string(status.message()));
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) {
      broken_ = absl::Status(status.code(), absl::StrCat("communicator broken by an earlier op: ",
                                                         status.message()));
    } else {
      status = broken_;  // shut down while it ran: report why
    }
  }
  work.Finish(std::move(status));
}

}  // namespace chorus
