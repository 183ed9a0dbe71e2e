#include "worker/runtime/heartbeat_compose.h"

#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(HeartbeatComposeTest, ProgressFieldsAndPhaseAge) {
  TrainingProgress progress;
  progress.step.store(42);
  progress.epoch.store(3);
  progress.phase.store(v1::BACKWARD);
  const absl::Time since = absl::FromUnixSeconds(1000);
  progress.phase_since_us.store(absl::ToUnixMicros(since));
  progress.step_seconds.store(0.5);
  progress.compute_seconds.store(0.4);
  progress.comm_wait_seconds.store(0.1);
  progress.loss.store(1.25);
  progress.samples_per_second.store(128);

  v1::RankHeartbeat hb = ProgressHeartbeat(progress, nullptr, since + absl::Milliseconds(2500));
  EXPECT_EQ(hb.step(), 42);
  EXPECT_EQ(hb.epoch(), 3);
  EXPECT_EQ(hb.phase(), v1::BACKWARD);
  EXPECT_DOUBLE_EQ(hb.phase_seconds(), 2.5);
  EXPECT_DOUBLE_EQ(hb.timings().step_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(hb.timings().compute_seconds(), 0.4);
  EXPECT_DOUBLE_EQ(hb.timings().comm_wait_seconds(), 0.1);
  EXPECT_DOUBLE_EQ(hb.loss(), 1.25);
  EXPECT_DOUBLE_EQ(hb.samples_per_second(), 128);
  EXPECT_FALSE(hb.has_flight_recorder());
  EXPECT_EQ(hb.rank(), 0);  // identity is the sender's business
}

TEST(HeartbeatComposeTest, PhaseSecondsZeroBeforeFirstPhase) {
  TrainingProgress progress;
  EXPECT_EQ(ProgressHeartbeat(progress, nullptr, absl::Now()).phase_seconds(), 0.0);
}

TEST(HeartbeatComposeTest, FlightRecorderInFlightThenRecent) {
  FlightRecorder recorder;
  const int64_t done = recorder.Enqueued({"allreduce/sum", "float32", 8, {}, "ddp:model/bucket0"});
  recorder.Started(done);
  recorder.Finished(done, OpState::kCompleted, "");
  const int64_t open = recorder.Enqueued({"allreduce/sum", "float32", 4, {}, "ddp:model/bucket1"});
  recorder.Started(open);

  TrainingProgress progress;
  v1::RankHeartbeat hb = ProgressHeartbeat(progress, &recorder, absl::Now());
  const v1::FlightRecorderSummary& fr = hb.flight_recorder();
  EXPECT_EQ(fr.last_enqueued_seq(), open);
  EXPECT_EQ(fr.last_started_seq(), open);
  EXPECT_EQ(fr.last_completed_seq(), done);
  ASSERT_EQ(fr.records_size(), 2);
  EXPECT_EQ(fr.records(0).seq(), open);
  EXPECT_EQ(fr.records(0).state(), v1::CollectiveRecord::STARTED);
  EXPECT_EQ(fr.records(0).fingerprint().tag(), "ddp:model/bucket1");
  EXPECT_EQ(fr.records(0).fingerprint().bytes(), 16);
  EXPECT_EQ(fr.records(0).completed_us(), 0);
  EXPECT_EQ(fr.records(1).seq(), done);
  EXPECT_EQ(fr.records(1).state(), v1::CollectiveRecord::COMPLETED);
  EXPECT_GT(fr.records(1).completed_us(), 0);
  EXPECT_EQ(fr.device(), "");
}

TEST(HeartbeatComposeTest, RecordsSayWhereTheyStandAmongTheirKind) {
  FlightRecorder recorder;
  OpIndex collective;
  collective.collective = 3;
  recorder.Enqueued({"allreduce/sum", "float32", 8, {}, "a"}, collective);
  OpIndex exchange;
  exchange.send_to = 2;
  exchange.send = 5;
  exchange.recv_from = 0;
  exchange.recv = 4;
  recorder.Enqueued({"sendrecv/to2/from0", "float32", 8, {}, "gossip"}, exchange);

  TrainingProgress progress;
  const v1::FlightRecorderSummary fr = ProgressHeartbeat(progress, &recorder, absl::Now())
                                           .flight_recorder();
  EXPECT_EQ(fr.collectives_enqueued(), 3);
  ASSERT_EQ(fr.records_size(), 2);
  EXPECT_EQ(fr.records(0).collective_index(), 3);
  EXPECT_EQ(fr.records(0).send_index(), 0);
  EXPECT_EQ(fr.records(0).recv_index(), 0);
  EXPECT_EQ(fr.records(1).collective_index(), 0);
  EXPECT_EQ(fr.records(1).send_to(), 2);
  EXPECT_EQ(fr.records(1).send_index(), 5);
  EXPECT_EQ(fr.records(1).recv_from(), 0);
  EXPECT_EQ(fr.records(1).recv_index(), 4);
}

TEST(HeartbeatComposeTest, ADeviceOpSaysWhetherTheGpuReachedIt) {
  FlightRecorder recorder(16, nullptr, "cuda:0");
  const int64_t queued = recorder.Enqueued({"allreduce/avg", "float32", 8, {}, "b0"});
  recorder.Started(queued);
  const int64_t reached = recorder.Enqueued({"allreduce/avg", "float32", 8, {}, "b1"});
  recorder.Started(reached);
  recorder.Running(reached);
  TrainingProgress progress;
  const v1::FlightRecorderSummary fr =
      ProgressHeartbeat(progress, &recorder, absl::Now()).flight_recorder();
  EXPECT_EQ(fr.device(), "cuda:0");
  ASSERT_EQ(fr.records_size(), 2);
  EXPECT_EQ(fr.records(0).state(), v1::CollectiveRecord::STARTED);
  EXPECT_EQ(fr.records(0).running_us(), 0);
  EXPECT_EQ(fr.records(1).state(), v1::CollectiveRecord::RUNNING);
  EXPECT_GE(fr.records(1).running_us(), fr.records(1).started_us());
  EXPECT_GT(fr.records(1).started_us(), 0);
}

}  // namespace
}  // namespace chorus
