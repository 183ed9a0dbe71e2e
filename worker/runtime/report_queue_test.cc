#include "worker/runtime/report_queue.h"

#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "glog/logging.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

v1::ReportRequest ReportOfStep(int64_t step) {
  v1::ReportRequest request;
  request.set_job_id("job-000001");
  request.set_rank(1);
  request.mutable_metrics()->set_step(step);
  return request;
}

// The coordinator as the queue's send function reaches it: records each
// send as it begins (its report, its deadline, when it began) and answers
// with `answer`, which may block.
class FakeCoordinator {
 public:
  using Answer = std::function<absl::Status(const v1::ReportRequest&, absl::Time deadline)>;
  struct Send {
    int64_t step;
    absl::Time deadline;
    absl::Time began;
  };

  explicit FakeCoordinator(Answer answer) : answer_(std::move(answer)) {}

  ReportQueue::SendFunction send_function() {
    return [this](const v1::ReportRequest& request, absl::Time deadline) {
      {
        absl::MutexLock lock(&mu_);
        sends_.push_back({request.metrics().step(), deadline, absl::Now()});
      }
      return answer_(request, deadline);
    };
  }

  // Waits up to 10 s until `n` sends have begun.
  bool AwaitSends(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sends_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }
  std::vector<Send> sends() {
    absl::MutexLock lock(&mu_);
    return sends_;
  }

 private:
  const Answer answer_;
  absl::Mutex mu_;
  std::vector<Send> sends_ ABSL_GUARDED_BY(mu_);
};

// A frozen coordinator: a send ends at its deadline, as a gRPC call to a
// stopped process does, unless `thaw` is notified first.
FakeCoordinator::Answer FrozenUntil(absl::Notification& thaw) {
  return [&thaw](const v1::ReportRequest&, absl::Time deadline) {
    if (thaw.WaitForNotificationWithDeadline(deadline)) return absl::OkStatus();
    return absl::DeadlineExceededError("Deadline Exceeded");
  };
}

TEST(ReportQueueTest, OffersNeverWaitForTheSendInFlightAndTheNewestIsSentNext) {
  absl::Notification thaw;
  FakeCoordinator coordinator(FrozenUntil(thaw));
  ReportQueue::Options options;
  options.attempt_timeout = absl::Seconds(2);
  ReportQueue queue(coordinator.send_function(), options);
  queue.Offer(ReportOfStep(0));
  ASSERT_TRUE(coordinator.AwaitSends(1));

  // The training thread's view while the coordinator is frozen.
  const absl::Time start = absl::Now();
  for (int64_t step = 1; step <= 100; ++step) queue.Offer(ReportOfStep(step));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(50));

  ASSERT_TRUE(coordinator.AwaitSends(2));
  thaw.Notify();
  queue.Flush(absl::Now() + absl::Seconds(5));
  const std::vector<FakeCoordinator::Send> sends = coordinator.sends();
  ASSERT_EQ(sends.size(), 2u);
  EXPECT_EQ(sends[0].step, 0);
  // One send at a time: the next began once the first ran out of time.
  EXPECT_GE(sends[1].began, sends[0].deadline);
  EXPECT_EQ(sends[1].step, 100);  // the newest; 1..99 were replaced
  const ReportQueue::Counts counts = queue.counts();
  EXPECT_EQ(counts.offered, 101);
  EXPECT_EQ(counts.failed, 1);  // step 0: Deadline Exceeded
  EXPECT_EQ(counts.sent, 1);
  EXPECT_EQ(counts.coalesced, 99);
  EXPECT_EQ(counts.dropped, 0);
}

TEST(ReportQueueTest, EachSendsDeadlineIsTheAttemptTimeoutAfterItBegins) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  FakeCoordinator coordinator(
      [](const v1::ReportRequest&, absl::Time) { return absl::OkStatus(); });
  ReportQueue::Options options;
  options.attempt_timeout = absl::Seconds(3);
  options.clock = &clock;
  ReportQueue queue(coordinator.send_function(), options);
  queue.Offer(ReportOfStep(1));
  ASSERT_TRUE(coordinator.AwaitSends(1));
  clock.Advance(absl::Minutes(1));
  queue.Offer(ReportOfStep(2));
  ASSERT_TRUE(coordinator.AwaitSends(2));
  queue.Flush(clock.Now());
  const std::vector<FakeCoordinator::Send> sends = coordinator.sends();
  ASSERT_EQ(sends.size(), 2u);
  EXPECT_EQ(sends[0].deadline, absl::FromUnixSeconds(1003));
  EXPECT_EQ(sends[1].deadline, absl::FromUnixSeconds(1063));
}

TEST(ReportQueueTest, FlushWaitsForTheSendInFlightOnlyUntilItsDeadline) {
  absl::Notification never;
  FakeCoordinator coordinator(FrozenUntil(never));
  ReportQueue::Options options;
  options.attempt_timeout = absl::Seconds(1);
  ReportQueue queue(coordinator.send_function(), options);
  queue.Offer(ReportOfStep(1));
  ASSERT_TRUE(coordinator.AwaitSends(1));
  queue.Offer(ReportOfStep(2));  // pending behind the frozen send

  queue.Flush(absl::Now());
  const absl::Time returned = absl::Now();
  const std::vector<FakeCoordinator::Send> sends = coordinator.sends();
  ASSERT_EQ(sends.size(), 1u);  // step 2's time had passed: dropped
  EXPECT_LT(returned, sends[0].deadline + absl::Milliseconds(500));
  EXPECT_LE(sends[0].deadline - sends[0].began, absl::Seconds(1));

  queue.Offer(ReportOfStep(3));  // after Flush: dropped, never sent
  const ReportQueue::Counts counts = queue.counts();
  EXPECT_EQ(counts.offered, 3);
  EXPECT_EQ(counts.failed, 1);
  EXPECT_EQ(counts.sent, 0);
  EXPECT_EQ(counts.dropped, 2);
  EXPECT_EQ(coordinator.sends().size(), 1u);
}

TEST(ReportQueueTest, FlushSendsThePendingReportWithinItsDeadline) {
  absl::Notification thaw;
  FakeCoordinator coordinator(FrozenUntil(thaw));
  ReportQueue::Options options;
  options.attempt_timeout = absl::Seconds(30);
  ReportQueue queue(coordinator.send_function(), options);
  queue.Offer(ReportOfStep(1));
  ASSERT_TRUE(coordinator.AwaitSends(1));
  queue.Offer(ReportOfStep(2));

  const absl::Time stop_by = absl::Now() + absl::Seconds(5);
  std::thread flusher([&] { queue.Flush(stop_by); });
  // Flush has stopped the queue once an offer is dropped (offering step 2
  // again leaves the pending report as it was until then).
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (queue.counts().dropped == 0 && absl::Now() < give_up) {
    queue.Offer(ReportOfStep(2));
    absl::SleepFor(absl::Milliseconds(1));
  }
  thaw.Notify();
  flusher.join();

  const std::vector<FakeCoordinator::Send> sends = coordinator.sends();
  ASSERT_EQ(sends.size(), 2u);
  EXPECT_EQ(sends[1].step, 2);
  EXPECT_LE(sends[1].deadline, stop_by);  // not 30 s: Flush's deadline
  const ReportQueue::Counts counts = queue.counts();
  EXPECT_EQ(counts.sent, 2);
  EXPECT_GE(counts.dropped, 1);
  EXPECT_EQ(counts.offered, counts.sent + counts.failed + counts.coalesced + counts.dropped);
}

// The queue's log lines (from report_queue.cc).
class QueueLog : public google::LogSink {
 public:
  struct Line {
    google::LogSeverity severity;
    std::string text;
  };
  QueueLog() { google::AddLogSink(this); }
  ~QueueLog() override { google::RemoveLogSink(this); }

  void send(google::LogSeverity severity, const char*, const char* base_filename, int,
            const google::LogMessageTime&, const char* message, size_t message_len) override {
    if (std::string(base_filename) != "report_queue.cc") return;
    absl::MutexLock lock(&mu_);
    lines_.push_back({severity, std::string(message, message_len)});
  }
  std::vector<Line> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  absl::Mutex mu_;
  std::vector<Line> lines_ ABSL_GUARDED_BY(mu_);
};

TEST(ReportQueueTest, FailedSendsAreLoggedOnceAndLaterReportsStillGo) {
  QueueLog log;
  FakeCoordinator coordinator([](const v1::ReportRequest& request, absl::Time) {
    if (request.metrics().step() < 3) return absl::UnavailableError("connection refused");
    return absl::OkStatus();
  });
  ReportQueue queue(coordinator.send_function());
  // Each offered once the previous one's send began: none is replaced.
  for (int64_t step = 1; step <= 3; ++step) {
    queue.Offer(ReportOfStep(step));
    ASSERT_TRUE(coordinator.AwaitSends(step));
  }
  queue.Flush(absl::Now() + absl::Seconds(5));

  const ReportQueue::Counts counts = queue.counts();
  EXPECT_EQ(counts.failed, 2);
  EXPECT_EQ(counts.sent, 1);
  const std::vector<QueueLog::Line> lines = log.lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].severity, google::GLOG_WARNING);
  EXPECT_TRUE(absl::StrContains(lines[0].text,
                                "report of step 1 to the coordinator not sent: connection refused"))
      << lines[0].text;
  EXPECT_EQ(lines[1].severity, google::GLOG_INFO);
  EXPECT_TRUE(absl::StrContains(lines[1].text, "again, after 2 that were not sent"))
      << lines[1].text;
}

TEST(ReportQueueTest, DestructorIsBoundedByTheSendInFlight) {
  absl::Notification never;
  FakeCoordinator coordinator(FrozenUntil(never));
  ReportQueue::Options options;
  options.attempt_timeout = absl::Seconds(1);
  {
    ReportQueue queue(coordinator.send_function(), options);
    queue.Offer(ReportOfStep(1));
    ASSERT_TRUE(coordinator.AwaitSends(1));
    queue.Offer(ReportOfStep(2));
  }
  const absl::Time returned = absl::Now();
  const std::vector<FakeCoordinator::Send> sends = coordinator.sends();
  ASSERT_EQ(sends.size(), 1u);  // the pending step 2 is dropped, not sent
  EXPECT_LT(returned, sends[0].deadline + absl::Milliseconds(500));
}

}  // namespace
}  // namespace chorus
