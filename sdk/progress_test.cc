#include "chorus/progress.h"

#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/flight_recorder.h"
#include "worker/runtime/progress_channel.h"

namespace chorus {
namespace {

ProgressOptions Manual(Clock* clock) {
  ProgressOptions options;
  options.interval = absl::ZeroDuration();  // only explicit sends
  options.clock = clock;
  return options;
}

TEST(ProgressTest, StepAndPhasesReachTheReceiverEnd) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ProgressReceiver receiver(pair->supervisor_fd);
  auto sender = std::make_shared<ProgressSender>(pair->program_fd);
  FakeClock clock(absl::FromUnixSeconds(1000));
  FlightRecorder recorder;
  const int64_t seq = recorder.Enqueued({"allreduce/sum", "float32", 10, {}, "ddp:model/bucket0"});
  recorder.Started(seq);
  ProgressReporter progress([sender](const v1::RankHeartbeat& hb) { return sender->Send(hb); },
                            &recorder, Manual(&clock));

  {
    PhaseScope forward(progress, v1::FORWARD);
    clock.Advance(absl::Milliseconds(1500));
    absl::StatusOr<v1::RankHeartbeat> got = receiver.Receive(absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->phase(), v1::FORWARD);
    {
      PhaseScope collective(progress, v1::COLLECTIVE);
      clock.Advance(absl::Milliseconds(500));
    }
    // Newest: back in FORWARD after the nested scope.
    got = receiver.Receive(absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->phase(), v1::FORWARD);
  }
  progress.SetEpoch(2);
  progress.SetCommWait(absl::Milliseconds(500));
  progress.Step(17, 0.75, 64);
  absl::StatusOr<v1::RankHeartbeat> got = receiver.Receive(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step(), 17);
  EXPECT_EQ(got->epoch(), 2);
  EXPECT_EQ(got->phase(), v1::SETUP);  // where the program was before FORWARD
  EXPECT_DOUBLE_EQ(got->loss(), 0.75);
  // 2 s since the reporter was made: 64 samples / 2 s, 0.5 s of it waiting.
  EXPECT_DOUBLE_EQ(got->timings().step_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(got->timings().comm_wait_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(got->timings().compute_seconds(), 1.5);
  EXPECT_DOUBLE_EQ(got->samples_per_second(), 32.0);
  ASSERT_EQ(got->flight_recorder().records_size(), 1);
  EXPECT_EQ(got->flight_recorder().records(0).fingerprint().tag(), "ddp:model/bucket0");
  EXPECT_EQ(got->flight_recorder().records(0).state(), v1::CollectiveRecord::STARTED);
  EXPECT_EQ(progress.sent(), 5);  // 4 phase changes and the step
  EXPECT_EQ(progress.refused(), 0);
}

TEST(ProgressTest, PhaseAgeGrowsWhileBlocked) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  ProgressReporter progress([](const v1::RankHeartbeat&) { return absl::OkStatus(); }, nullptr,
                            Manual(&clock));
  progress.EnterPhase(v1::COLLECTIVE);
  clock.Advance(absl::Seconds(7));
  EXPECT_EQ(progress.Current().phase(), v1::COLLECTIVE);
  EXPECT_DOUBLE_EQ(progress.Current().phase_seconds(), 7.0);
}

TEST(ProgressTest, TheThreadSendsWhileTheProgramIsSilent) {
  absl::Mutex mu;
  std::vector<v1::RankHeartbeat> got;
  ProgressOptions options;
  options.interval = absl::Milliseconds(10);
  ProgressReporter progress(
      [&](const v1::RankHeartbeat& hb) {
        absl::MutexLock lock(&mu);
        got.push_back(hb);
        return absl::OkStatus();
      },
      nullptr, options);
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(mu.AwaitWithTimeout(
      absl::Condition(
          +[](std::vector<v1::RankHeartbeat>* v) { return v->size() >= 3; }, &got),
      absl::Seconds(10)));
  EXPECT_EQ(got.back().phase(), v1::SETUP);
}

TEST(ProgressTest, RefusedRecordsAreCounted) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  ProgressReporter progress(
      [](const v1::RankHeartbeat&) { return absl::ResourceExhaustedError("full"); }, nullptr,
      Manual(&clock));
  progress.Step(1, 0, 1);
  progress.Step(2, 0, 1);
  EXPECT_EQ(progress.sent(), 0);
  EXPECT_EQ(progress.refused(), 2);
}

}  // namespace
}  // namespace chorus
