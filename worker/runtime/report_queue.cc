#include "worker/runtime/report_queue.h"

#include <algorithm>
#include <utility>

#include "glog/logging.h"

namespace chorus {

ReportQueue::ReportQueue(SendFunction send, Options options)
    : send_(std::move(send)),
      options_(options),
      clock_(options_.clock != nullptr ? *options_.clock : real_clock_),
      thread_([this] { Run(); }) {}

ReportQueue::~ReportQueue() { Flush(clock_.Now()); }

void ReportQueue::Offer(v1::ReportRequest request) {
  absl::MutexLock lock(&mu_);
  ++counts_.offered;
  if (stop_by_.has_value()) {
    ++counts_.dropped;
    return;
  }
  if (pending_.has_value()) ++counts_.coalesced;
  pending_ = std::move(request);
}

void ReportQueue::Flush(absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_by_.has_value()) stop_by_ = deadline;
  }
  if (thread_.joinable()) thread_.join();
}

ReportQueue::Counts ReportQueue::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

bool ReportQueue::HasWork() const { return pending_.has_value() || stop_by_.has_value(); }

void ReportQueue::Run() {
  while (std::optional<Attempt> attempt = NextAttempt()) {
    const absl::Status status = send_(attempt->request, attempt->deadline);
    Finished(attempt->request, status);
  }
}

std::optional<ReportQueue::Attempt> ReportQueue::NextAttempt() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &ReportQueue::HasWork));
  if (!pending_.has_value()) return std::nullopt;  // stopped, nothing left
  const absl::Time now = clock_.Now();
  absl::Time deadline = now + options_.attempt_timeout;
  if (stop_by_.has_value()) {
    if (now >= *stop_by_) {
      ++counts_.dropped;
      pending_.reset();
      return std::nullopt;
    }
    deadline = std::min(deadline, *stop_by_);
  }
  Attempt attempt{*std::move(pending_), deadline};
  pending_.reset();
  return attempt;
}

void ReportQueue::Finished(const v1::ReportRequest& request, const absl::Status& status) {
  int64_t failures_before = 0;
  {
    absl::MutexLock lock(&mu_);
    failures_before = failures_in_a_row_;
    if (status.ok()) {
      ++counts_.sent;
      failures_in_a_row_ = 0;
    } else {
      ++counts_.failed;
      ++failures_in_a_row_;
    }
  }
  // Logged without the lock: Offer never waits for a log write.
  if (!status.ok() && failures_before == 0) {
    LOG(WARNING) << "report of step " << request.metrics().step()
                 << " to the coordinator not sent: " << status.message()
                 << " (later reports are still sent; further failures are counted until one "
                    "gets through)";
  } else if (status.ok() && failures_before > 0) {
    LOG(INFO) << "reports reach the coordinator again, after " << failures_before
              << " that were not sent";
  }
}

}  // namespace chorus
