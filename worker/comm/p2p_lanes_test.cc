// P2pLanes (Note [Point-to-point progress]): a lane finishes its ops in the
// order they were added; lanes do not wait for each other.

#include "worker/comm/p2p_lanes.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

absl::Time In(absl::Duration d) { return absl::Now() + d; }

struct Deferred {
  FlightRecorder recorder{16, nullptr};
  QueuedWork* current = nullptr;
  OpQueue queue{recorder, [this](QueuedWork& work) {
                  current = &work;
                  work.RunBody();
                  return absl::OkStatus();
                }};
  P2pLanes lanes{[this](QueuedWork& work, absl::Status s) { queue.Complete(work, s); }};

  // A point-to-point op on `lane` whose transfer is done once `arrived`.
  std::shared_ptr<Work> Issue(int lane, absl::Notification* arrived) {
    return queue.Issue({"send/to1", "float32", 4, {}, "p2p"}, false, [this, lane, arrived](uint32_t) {
      current->Defer(nullptr);
      lanes.Add(lane, current->shared_from_this(), [arrived] {
        arrived->WaitForNotification();
        return absl::OkStatus();
      });
    });
  }
};

TEST(P2pLanesTest, AnOpFinishesBeforeAnEarlierOneOnAnotherLane) {
  Deferred d;
  absl::Notification first_arrived, second_arrived;
  std::shared_ptr<Work> first = d.Issue(P2pLanes::SendLane(1), &first_arrived);
  std::shared_ptr<Work> second = d.Issue(P2pLanes::RecvLane(1), &second_arrived);
  second_arrived.Notify();
  EXPECT_TRUE(second->Wait(In(absl::Seconds(10))).ok());
  EXPECT_FALSE(first->Done());
  // Waiting on the device means waiting for a host op.
  EXPECT_EQ(first->WaitOnDevice(In(absl::Milliseconds(20))).code(),
            absl::StatusCode::kDeadlineExceeded);
  first_arrived.Notify();
  EXPECT_TRUE(first->Wait(In(absl::Seconds(10))).ok());
  EXPECT_EQ(d.recorder.TakeSnapshot().last_completed_seq, 2);
}

TEST(P2pLanesTest, OpsOfOneLaneFinishInOrder) {
  Deferred d;
  absl::Notification first_arrived, second_arrived;
  std::shared_ptr<Work> first = d.Issue(P2pLanes::SendLane(2), &first_arrived);
  std::shared_ptr<Work> second = d.Issue(P2pLanes::SendLane(2), &second_arrived);
  second_arrived.Notify();
  EXPECT_EQ(second->Wait(In(absl::Milliseconds(50))).code(), absl::StatusCode::kDeadlineExceeded);
  first_arrived.Notify();
  EXPECT_TRUE(first->Wait(In(absl::Seconds(10))).ok());
  EXPECT_TRUE(second->Wait(In(absl::Seconds(10))).ok());
}

TEST(P2pLanesTest, AFailedWaitFailsItsOpAndBreaksTheQueue) {
  Deferred d;
  std::shared_ptr<Work> failed =
      d.queue.Issue({"recv/from1", "float32", 4, {}, "p2p"}, false, [&d](uint32_t) {
        d.current->Defer(nullptr);
        d.lanes.Add(P2pLanes::RecvLane(1), d.current->shared_from_this(),
                    [] { return absl::UnavailableError("peer gone"); });
      });
  absl::Status s = failed->Wait(In(absl::Seconds(10)));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "peer gone");
  absl::Notification never;
  absl::Status later = d.Issue(P2pLanes::SendLane(1), &never)->Wait(In(absl::Seconds(10)));
  EXPECT_EQ(later.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(later.message().find("broken by an earlier op: peer gone"), absl::string_view::npos)
      << later;
}

TEST(P2pLanesTest, WhenDoneCallsBackOnceForAFinishedOrALaterOp) {
  Deferred d;
  absl::Notification arrived;
  std::shared_ptr<Work> op = d.Issue(P2pLanes::SendLane(1), &arrived);
  std::atomic<int> calls{0};
  absl::Notification called;
  op->WhenDone([&calls, &called](const absl::Status& s) {
    calls += s.ok() ? 1 : 100;
    called.Notify();
  });
  EXPECT_EQ(calls.load(), 0);
  arrived.Notify();
  ASSERT_TRUE(called.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(calls.load(), 1);
  op->WhenDone([&calls](const absl::Status& s) { calls += s.ok() ? 1 : 100; });
  EXPECT_EQ(calls.load(), 2);  // at once, on this thread
}

}  // namespace
}  // namespace chorus
