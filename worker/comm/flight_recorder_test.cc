#include "worker/comm/flight_recorder.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

Fingerprint Fp(const std::string& tag, int64_t count = 8) {
  return Fingerprint{"allreduce/sum", "float32", count, {}, tag};
}

TEST(FingerprintTest, DescribesItself) {
  Fingerprint fp{"allreduce/avg", "float16", 1000, {0, 2}, "ddp:model/bucket2"};
  EXPECT_EQ(fp.bytes(), 2000);
  EXPECT_EQ(fp.ToString(), "allreduce/avg float16[1000] group{0,2} ddp:model/bucket2");
  EXPECT_EQ(fp, fp);
  Fingerprint other = fp;
  other.count = 999;
  EXPECT_NE(fp, other);
}

// Note [Point-to-point progress]: a send still waiting for its peer while
// a later collective has finished stays in flight, and records say where
// they stand among their kind.
TEST(FlightRecorderTest, AnOpThatFinishesLaterStaysInFlightWithItsIndex) {
  FlightRecorder recorder(16);
  OpIndex send;
  send.send_to = 1;
  send.send = 1;
  const int64_t isend = recorder.Enqueued({"send/to1", "float32", 4, {}, "p2p"}, send);
  OpIndex first;
  first.collective = 1;
  const int64_t allreduce = recorder.Enqueued(Fp("a"), first);
  recorder.Started(isend);
  recorder.Started(allreduce);
  recorder.Finished(allreduce, OpState::kCompleted, "");

  FlightRecorder::Snapshot s = recorder.TakeSnapshot(/*recent=*/4);
  EXPECT_EQ(s.last_finished_seq, 2);
  EXPECT_EQ(s.collectives_enqueued, 1);
  ASSERT_EQ(s.in_flight.size(), 1u);
  EXPECT_EQ(s.in_flight[0].seq, isend);
  EXPECT_EQ(s.in_flight[0].index.send_to, 1);
  EXPECT_EQ(s.in_flight[0].index.send, 1);
  ASSERT_EQ(s.recent.size(), 1u);  // not the unfinished send a second time
  EXPECT_EQ(s.recent[0].seq, allreduce);
  EXPECT_EQ(s.recent[0].index.collective, 1);

  recorder.Finished(isend, OpState::kCompleted, "");
  s = recorder.TakeSnapshot(/*recent=*/4);
  EXPECT_TRUE(s.in_flight.empty());
  EXPECT_EQ(s.recent.size(), 2u);
  EXPECT_THAT(recorder.DumpJson(), HasSubstr("\"send_to\":1,\"send_index\":1"));
}

TEST(FlightRecorderTest, TracksLifecycleAndTimes) {
  FakeClock clock(absl::FromUnixSeconds(10));
  FlightRecorder recorder(16, &clock);
  int64_t a = recorder.Enqueued(Fp("a"));
  int64_t b = recorder.Enqueued(Fp("b"));
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 2);
  clock.Advance(absl::Seconds(1));
  recorder.Started(a);
  clock.Advance(absl::Seconds(2));
  recorder.Finished(a, OpState::kCompleted, "");
  recorder.Started(b);

  FlightRecorder::Snapshot s = recorder.TakeSnapshot(/*recent=*/4);
  EXPECT_EQ(s.last_enqueued_seq, 2);
  EXPECT_EQ(s.last_started_seq, 2);
  EXPECT_EQ(s.last_finished_seq, 1);
  EXPECT_EQ(s.last_completed_seq, 1);
  ASSERT_EQ(s.in_flight.size(), 1u);
  EXPECT_EQ(s.in_flight[0].seq, 2);
  EXPECT_EQ(s.in_flight[0].state, OpState::kStarted);
  EXPECT_EQ(s.in_flight[0].fingerprint.tag, "b");
  ASSERT_EQ(s.recent.size(), 1u);
  EXPECT_EQ(s.recent[0].state, OpState::kCompleted);
  EXPECT_EQ(s.recent[0].finished - s.recent[0].started, absl::Seconds(2));
  EXPECT_EQ(s.recent[0].started - s.recent[0].enqueued, absl::Seconds(1));

  recorder.Finished(b, OpState::kTimedOut, "peer silent");
  s = recorder.TakeSnapshot(1);
  EXPECT_TRUE(s.in_flight.empty());
  EXPECT_EQ(s.last_finished_seq, 2);
  EXPECT_EQ(s.last_completed_seq, 1);  // a timeout is not a completion
  ASSERT_EQ(s.recent.size(), 1u);
  EXPECT_EQ(s.recent[0].error, "peer silent");
}

TEST(FlightRecorderTest, ADeviceOpIsRunningOnceTheDeviceReachedIt) {
  // Note [Device op states].
  FakeClock clock(absl::FromUnixSeconds(10));
  FlightRecorder recorder(16, &clock, "cuda:1");
  EXPECT_EQ(recorder.device(), "cuda:1");
  EXPECT_EQ(FlightRecorder().device(), "");
  const int64_t a = recorder.Enqueued(Fp("a"));
  recorder.Running(a);  // not started: nothing to mark
  EXPECT_EQ(recorder.TakeSnapshot().in_flight[0].state, OpState::kEnqueued);
  recorder.Started(a);  // queued on the GPU
  clock.Advance(absl::Seconds(3));
  recorder.Running(a);  // the GPU reached it
  FlightRecorder::Snapshot s = recorder.TakeSnapshot();
  ASSERT_EQ(s.in_flight.size(), 1u);
  EXPECT_EQ(s.in_flight[0].state, OpState::kRunning);
  EXPECT_EQ(s.in_flight[0].running - s.in_flight[0].started, absl::Seconds(3));
  EXPECT_STREQ(OpStateName(OpState::kRunning), "running");
  EXPECT_THAT(recorder.DumpJson(), HasSubstr("\"state\":\"running\",\"enqueued_us\":"));
  clock.Advance(absl::Seconds(1));
  recorder.Finished(a, OpState::kCompleted, "");
  recorder.Running(a);  // late: a finished op stays finished
  s = recorder.TakeSnapshot(1);
  EXPECT_TRUE(s.in_flight.empty());
  ASSERT_EQ(s.recent.size(), 1u);
  EXPECT_EQ(s.recent[0].state, OpState::kCompleted);
  EXPECT_EQ(s.recent[0].finished - s.recent[0].running, absl::Seconds(1));
}

TEST(FlightRecorderTest, RingKeepsTheNewestEntries) {
  FlightRecorder recorder(4);
  for (int i = 0; i < 10; ++i) {
    int64_t seq = recorder.Enqueued(Fp("t" + std::to_string(i)));
    recorder.Started(seq);
    recorder.Finished(seq, OpState::kCompleted, "");
  }
  FlightRecorder::Snapshot s = recorder.TakeSnapshot(100);
  EXPECT_EQ(s.last_completed_seq, 10);
  ASSERT_EQ(s.recent.size(), 4u);
  EXPECT_EQ(s.recent.front().seq, 7);
  EXPECT_EQ(s.recent.back().seq, 10);
  std::string json = recorder.DumpJson();
  EXPECT_THAT(json, HasSubstr("\"last_completed_seq\":10"));
  EXPECT_THAT(json, HasSubstr("\"seq\":7,\"op\":\"allreduce/sum\""));
  EXPECT_THAT(json, ::testing::Not(HasSubstr("\"seq\":6,")));
}

TEST(FlightRecorderTest, InFlightEntriesSurviveWhileQueued) {
  FlightRecorder recorder(8);
  for (int i = 0; i < 5; ++i) recorder.Enqueued(Fp("q"));
  FlightRecorder::Snapshot s = recorder.TakeSnapshot();
  ASSERT_EQ(s.in_flight.size(), 5u);
  EXPECT_EQ(s.in_flight[0].state, OpState::kEnqueued);
  EXPECT_EQ(s.in_flight[4].seq, 5);
  EXPECT_EQ(s.last_started_seq, 0);
}

TEST(FlightRecorderTest, JsonEscapesTags) {
  FlightRecorder recorder(2);
  recorder.Enqueued(Fp("quote\"back\\slash"));
  EXPECT_THAT(recorder.DumpJson(), HasSubstr("\"tag\":\"quote\\\"back\\\\slash\""));
  EXPECT_THAT(recorder.DumpJson(), HasSubstr("\"started_us\":null"));
}

}  // namespace
}  // namespace chorus
