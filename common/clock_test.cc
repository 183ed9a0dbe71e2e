#include "common/clock.h"

#include <thread>

#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(FakeClockTest, MovesOnlyWhenTold) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1000));
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1005));
  clock.SleepFor(absl::Milliseconds(250));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1005) + absl::Milliseconds(250));
}

TEST(FakeClockTest, AwaitTimesOutOnFakeTimeNotRealTime) {
  FakeClock clock(absl::FromUnixSeconds(0));
  absl::Mutex mu;
  bool ready = false;
  std::thread advancer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    clock.Advance(absl::Hours(1));
  });
  absl::Time real_start = absl::Now();
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(clock.AwaitWithDeadline(mu, absl::Condition(&ready), absl::FromUnixSeconds(60)));
  }
  advancer.join();
  // An hour of fake time passed in well under the 10 s we allow for a loaded machine.
  EXPECT_LT(absl::Now() - real_start, absl::Seconds(10));
}

TEST(FakeClockTest, AwaitReturnsWhenConditionBecomesTrue) {
  FakeClock clock;
  absl::Mutex mu;
  bool ready = false;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(10));
    absl::MutexLock lock(&mu);
    ready = true;
  });
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(
        clock.AwaitWithDeadline(mu, absl::Condition(&ready), clock.Now() + absl::Seconds(1)));
  }
  setter.join();
}

TEST(RealClockTest, AwaitHonoursDeadline) {
  RealClock clock;
  absl::Mutex mu;
  bool never = false;
  absl::Time start = clock.Now();
  absl::MutexLock lock(&mu);
  EXPECT_FALSE(
      clock.AwaitWithDeadline(mu, absl::Condition(&never), start + absl::Milliseconds(30)));
  EXPECT_GE(clock.Now() - start, absl::Milliseconds(30));
}

}  // namespace
}  // namespace chorus
