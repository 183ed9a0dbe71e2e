// OpQueue with deferred completion (Note [Deferred completion]), as a device
// backend uses it, with a body that stands in for enqueueing on a GPU.

#include "worker/comm/op_queue.h"

#include <atomic>
#include <memory>
#include <thread>

#include "gtest/gtest.h"

namespace chorus {
namespace {

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// A backend whose ops are "enqueued" by their body and finished later.
struct DeferringBackend {
  FlightRecorder recorder{16, nullptr};
  QueuedWork* current = nullptr;
  std::atomic<int> orders{0};
  OpQueue queue{recorder, [this](QueuedWork& work) {
                  current = &work;
                  work.RunBody();
                  return absl::OkStatus();
                }};

  std::shared_ptr<Work> Issue(const std::string& tag) {
    return queue.Issue({"allreduce/sum", "float32", 4, {}, tag}, true, [this](uint32_t) {
      current->Defer([this] {
        ++orders;
        return absl::OkStatus();
      });
    });
  }
};

TEST(OpQueueTest, DeferredOpStaysStartedUntilCompleted) {
  DeferringBackend backend;
  std::shared_ptr<Work> work = backend.Issue("a");
  // Ordered after at once, without finishing.
  EXPECT_TRUE(work->WaitOnDevice(In(absl::Seconds(5))).ok());
  EXPECT_EQ(backend.orders.load(), 1);
  EXPECT_FALSE(work->Done());
  EXPECT_EQ(work->Wait(In(absl::Milliseconds(50))).code(), absl::StatusCode::kDeadlineExceeded);
  FlightRecorder::Snapshot before = backend.recorder.TakeSnapshot();
  EXPECT_EQ(before.last_started_seq, 1);
  EXPECT_EQ(before.last_completed_seq, 0);

  backend.queue.Complete(*std::static_pointer_cast<QueuedWork>(work), absl::OkStatus());
  EXPECT_TRUE(work->Wait(In(absl::Seconds(1))).ok());
  EXPECT_EQ(backend.recorder.TakeSnapshot().last_completed_seq, 1);
  // Once finished, WaitOnDevice returns the result and orders nothing more.
  EXPECT_TRUE(work->WaitOnDevice(In(absl::Seconds(1))).ok());
  EXPECT_EQ(backend.orders.load(), 1);
}

TEST(OpQueueTest, DeferredFailureBreaksTheQueue) {
  DeferringBackend backend;
  std::shared_ptr<Work> first = backend.Issue("first");
  std::shared_ptr<Work> second = backend.Issue("second");
  ASSERT_TRUE(second->WaitOnDevice(In(absl::Seconds(5))).ok());
  backend.queue.Complete(*std::static_pointer_cast<QueuedWork>(first),
                         absl::DeadlineExceededError("exceeded the op timeout"));
  backend.queue.Complete(*std::static_pointer_cast<QueuedWork>(second),
                         absl::UnavailableError("aborted with the first"));
  EXPECT_EQ(first->Wait(In(absl::Seconds(1))).code(), absl::StatusCode::kDeadlineExceeded);
  absl::Status later = second->Wait(In(absl::Seconds(1)));
  EXPECT_EQ(later.code(), absl::StatusCode::kDeadlineExceeded) << later;
  EXPECT_NE(later.message().find("broken by an earlier op"), std::string::npos) << later;
  // A new op fails at once, with the same reason.
  absl::Status third = backend.Issue("third")->Wait(In(absl::Seconds(1)));
  EXPECT_EQ(third.code(), absl::StatusCode::kDeadlineExceeded) << third;
  EXPECT_EQ(backend.recorder.TakeSnapshot().last_completed_seq, 0);
}

// A host backend's op (no Defer) is finished by the queue, and WaitOnDevice
// is Wait.
TEST(OpQueueTest, HostOpWaitOnDeviceIsWait) {
  FlightRecorder recorder(16, nullptr);
  OpQueue queue(recorder, [](QueuedWork& work) {
    work.RunBody();
    return absl::OkStatus();
  });
  std::atomic<bool> ran{false};
  std::shared_ptr<Work> work =
      queue.Issue({"barrier", "", 0, {}, "b"}, true, [&](uint32_t) {
        absl::SleepFor(absl::Milliseconds(100));
        ran = true;
      });
  EXPECT_TRUE(work->WaitOnDevice(In(absl::Seconds(5))).ok());
  EXPECT_TRUE(ran.load());
  EXPECT_TRUE(work->Done());
}

}  // namespace
}  // namespace chorus
