#include "coordinator/hang/hang_detector.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

const absl::Time kNow = absl::FromUnixSeconds(10000);

v1::HangDetectionSpec Spec() {
  v1::HangDetectionSpec s;
  s.set_dead_after_seconds(5);
  s.set_stall_after_seconds(3);
  s.set_straggler_ratio(1.5);
  s.set_phase_limit_seconds(600);
  return s;
}

v1::CollectiveRecord Record(int64_t seq, const std::string& tag, v1::CollectiveRecord::State state,
                            absl::Duration started_ago,
                            absl::Duration took = absl::ZeroDuration()) {
  v1::CollectiveRecord r;
  r.set_seq(seq);
  r.mutable_fingerprint()->set_op("allreduce/avg");
  r.mutable_fingerprint()->set_tag(tag);
  r.mutable_fingerprint()->set_dtype("float32");
  r.mutable_fingerprint()->set_count(1 << 20);
  r.mutable_fingerprint()->set_bytes(4 << 20);
  r.set_state(state);
  r.set_started_us(absl::ToUnixMicros(kNow - started_ago));
  if (state == v1::CollectiveRecord::COMPLETED) {
    r.set_completed_us(absl::ToUnixMicros(kNow - started_ago + took));
  }
  return r;
}

RankView Rank(int rank, int64_t last_enqueued, v1::Phase phase, int64_t step, double phase_seconds,
              std::vector<v1::CollectiveRecord> records = {}) {
  RankView v;
  v.rank = rank;
  v.has_heartbeat = true;
  v.heartbeat_at = kNow - absl::Milliseconds(300);
  v.heartbeat.set_rank(rank);
  v.heartbeat.set_step(step);
  v.heartbeat.set_phase(phase);
  v.heartbeat.set_phase_seconds(phase_seconds);
  v.heartbeat.mutable_flight_recorder()->set_last_enqueued_seq(last_enqueued);
  for (auto& r : records) *v.heartbeat.mutable_flight_recorder()->add_records() = r;
  return v;
}

std::vector<std::string> Messages(const std::vector<v1::Diagnosis>& ds) {
  std::vector<std::string> out;
  for (const auto& d : ds) out.push_back(v1::Diagnosis::Kind_Name(d.kind()) + " " + d.message());
  return out;
}

TEST(HangDetectorTest, NamesTheRankThatNeverJoinedAndWhatItIsDoing) {
  auto waiting =
      Record(1234, "ddp:model/bucket2", v1::CollectiveRecord::STARTED, absl::Milliseconds(12300));
  std::vector<RankView> ranks = {
      Rank(0, 1234, v1::COLLECTIVE, 945, 12.3, {waiting}),
      Rank(1, 1233, v1::DATA, 945, 12.9),
      Rank(2, 1234, v1::COLLECTIVE, 945, 12.3, {waiting}),
  };
  auto ds = DiagnoseHangs(Spec(), ranks, kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::NEVER_JOINED);
  EXPECT_THAT(ds[0].ranks(), ElementsAre(1));
  EXPECT_THAT(ds[0].waiting_ranks(), ElementsAre(0, 2));
  EXPECT_EQ(ds[0].seq(), 1234);
  EXPECT_EQ(ds[0].message(),
            "rank 1 has not entered collective #1234 allreduce/avg ddp:model/bucket2 "
            "(float32[1048576], 4.0 MB); "
            "ranks 0,2 have waited 12.3 s; rank 1 is in DATA at step 945 for 12.9 s");
}

TEST(HangDetectorTest, ARankThatMarksNoPhasesIsNamedByItsStep) {
  // A script on the Python package's backend alone: its phase is
  // PHASE_UNSPECIFIED once its process group exists.
  auto waiting =
      Record(16, "torch:all_reduce", v1::CollectiveRecord::STARTED, absl::Milliseconds(4000));
  std::vector<RankView> ranks = {
      Rank(0, 16, v1::COLLECTIVE, 9, 4.0, {waiting}),
      Rank(1, 15, v1::PHASE_UNSPECIFIED, 9, 4.1),
  };
  auto ds = DiagnoseHangs(Spec(), ranks, kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::NEVER_JOINED);
  EXPECT_THAT(ds[0].message(),
              HasSubstr("rank 1 is outside any collective (no phase marked) at step 9"));
}

// A rank of an NCCL communicator on `device`: its records are device ops.
RankView GpuRank(int rank, int64_t step, std::vector<v1::CollectiveRecord> records) {
  RankView v = Rank(rank, records.empty() ? 0 : records.back().seq(), v1::COLLECTIVE, step, 9.0,
                    std::move(records));
  v.heartbeat.mutable_flight_recorder()->set_device("cuda:0");
  return v;
}

TEST(HangDetectorTest, NamesTheRankWhoseGpuHasNotReachedTheCollective) {
  // Note [Device op states]: every rank issued #77, so every rank's host is
  // past it; ranks 0 and 2's GPUs run it (waiting for the peers) while rank
  // 1's GPU is still busy with the kernels it queued before.
  auto running = Record(77, "ddp:model/bucket0", v1::CollectiveRecord::RUNNING, absl::Seconds(9));
  running.set_running_us(absl::ToUnixMicros(kNow - absl::Seconds(8)));
  auto queued = Record(77, "ddp:model/bucket0", v1::CollectiveRecord::STARTED, absl::Seconds(9));
  std::vector<RankView> ranks = {GpuRank(0, 40, {running}), GpuRank(1, 40, {queued}),
                                 GpuRank(2, 40, {running})};
  auto ds = DiagnoseHangs(Spec(), ranks, kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::NEVER_JOINED);
  EXPECT_THAT(ds[0].ranks(), ElementsAre(1));
  EXPECT_THAT(ds[0].waiting_ranks(), ElementsAre(0, 2));
  EXPECT_EQ(ds[0].seq(), 77);
  EXPECT_EQ(ds[0].message(),
            "the GPU of rank 1 has not reached collective #77 allreduce/avg ddp:model/bucket0 "
            "(float32[1048576], 4.0 MB): it is still busy with kernels queued before it (a long or "
            "hung kernel); "
            "ranks 0,2 have waited 8.0 s inside it; rank 1 queued it 9.0 s ago, at step 40");

  // Every GPU still busy before #77 (a long backward pass): nobody waits
  // inside the collective, so nothing is stuck in it.
  std::vector<RankView> busy = {GpuRank(0, 40, {queued}), GpuRank(1, 40, {queued})};
  EXPECT_THAT(DiagnoseHangs(Spec(), busy, kNow), IsEmpty());

  // The same records from a host backend (no device): started means inside,
  // so every rank is inside and the transport is suspect.
  std::vector<RankView> host = {Rank(0, 77, v1::COLLECTIVE, 40, 9.0, {queued}),
                                Rank(1, 77, v1::COLLECTIVE, 40, 9.0, {queued})};
  auto stuck = DiagnoseHangs(Spec(), host, kNow);
  ASSERT_EQ(stuck.size(), 1u) << ::testing::PrintToString(Messages(stuck));
  EXPECT_EQ(stuck[0].kind(), v1::Diagnosis::STUCK_IN_COLLECTIVE);

  // Below the threshold (3 s inside): nothing yet.
  running.set_running_us(absl::ToUnixMicros(kNow - absl::Seconds(2)));
  std::vector<RankView> early = {GpuRank(0, 40, {running}), GpuRank(1, 40, {queued})};
  EXPECT_THAT(DiagnoseHangs(Spec(), early, kNow), IsEmpty());
}

TEST(HangDetectorTest, ASilentCulpritIsDeadNotNeverJoined) {
  // Rank 1 was stopped (SIGSTOP) before collective #50: its last heartbeat
  // is as old as the others' wait. It is not named until it counts as DEAD.
  auto waiting = Record(50, "ddp:model/bucket0", v1::CollectiveRecord::STARTED, absl::Seconds(4));
  RankView stopped = Rank(1, 49, v1::DATA, 10, 0.1);
  stopped.heartbeat_at = kNow - absl::Seconds(4);
  EXPECT_THAT(DiagnoseHangs(Spec(), {Rank(0, 50, v1::COLLECTIVE, 10, 4, {waiting}), stopped}, kNow),
              IsEmpty());
  stopped.heartbeat_at = kNow - absl::Seconds(6);
  auto ds = DiagnoseHangs(Spec(), {Rank(0, 50, v1::COLLECTIVE, 10, 6, {waiting}), stopped}, kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::DEAD);
  EXPECT_THAT(ds[0].ranks(), ElementsAre(1));
  EXPECT_THAT(ds[0].message(), HasSubstr("its process has not exited"));
}

// Note [A silent agent's ranks]: a rank's silence counts up to what its
// relaying agent's last message vouches for, and at most
// kAgentSilenceForgiven less than in full.
TEST(HangDetectorTest, ARankWhoseAgentIsSilentTooIsNotDeadUntilTheAgentsSilenceIsForgivenNoLonger) {
  RankView relayed = Rank(1, 49, v1::DATA, 10, 0.1);
  relayed.heartbeat_at = kNow - absl::Seconds(8);
  relayed.relay_heard_at = kNow - absl::Seconds(8);  // the agent fell silent with it
  EXPECT_THAT(DiagnoseHangs(Spec(), {Rank(0, 49, v1::DATA, 10, 0.1), relayed}, kNow), IsEmpty());

  relayed.relay_heard_at = kNow - absl::Milliseconds(500);  // the agent talks; the rank does not
  auto ds = DiagnoseHangs(Spec(), {Rank(0, 49, v1::DATA, 10, 0.1), relayed}, kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::DEAD);
  EXPECT_EQ(ds[0].duration_seconds(), 8);
  EXPECT_THAT(ds[0].message(), Not(HasSubstr("its agent has been silent")));

  // Both silent 15.6 s: 15.6 - 10 forgiven > 5 s (dead_after_seconds).
  relayed.heartbeat_at = kNow - absl::Milliseconds(15600);
  relayed.relay_heard_at = relayed.heartbeat_at;
  ds = DiagnoseHangs(Spec(), {Rank(0, 49, v1::DATA, 10, 0.1), relayed}, kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::DEAD);
  EXPECT_THAT(ds[0].message(), HasSubstr("no heartbeat for 15.6 s"));
  EXPECT_THAT(ds[0].message(), HasSubstr("its agent has been silent for 15.6 s too"));
  relayed.heartbeat_at = kNow - absl::Milliseconds(14900);
  relayed.relay_heard_at = relayed.heartbeat_at;
  EXPECT_THAT(DiagnoseHangs(Spec(), {Rank(0, 49, v1::DATA, 10, 0.1), relayed}, kNow), IsEmpty());
}

TEST(HangDetectorTest, AHeartbeatFromBeforeTheWaitSaysNothingAboutTheRankNow) {
  // Rank 1 stopped 0.2 s after its last heartbeat, just as rank 0 entered
  // #27. Past the stall threshold its heartbeat is younger than the silence
  // limit but older than rank 0's wait: it cannot tell what rank 1 does now.
  v1::HangDetectionSpec spec = Spec();
  spec.set_stall_after_seconds(1.5);
  auto waiting =
      Record(27, "ddp:model/bucket0", v1::CollectiveRecord::STARTED, absl::Milliseconds(2200));
  RankView stopped = Rank(1, 26, v1::DATA, 10, 0.1);
  stopped.heartbeat_at = kNow - absl::Milliseconds(2400);
  EXPECT_THAT(DiagnoseHangs(spec, {Rank(0, 27, v1::COLLECTIVE, 10, 2.2, {waiting}), stopped}, kNow),
              IsEmpty());
  // Once it has reported from inside the wait, it is named.
  stopped.heartbeat_at = kNow - absl::Milliseconds(900);
  auto ds = DiagnoseHangs(spec, {Rank(0, 27, v1::COLLECTIVE, 10, 2.2, {waiting}), stopped}, kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::NEVER_JOINED);
  EXPECT_THAT(ds[0].ranks(), ElementsAre(1));
}

// Note [A wait the heartbeats vouch for]: ranks whose last heartbeats said
// "inside #40" and then fell silent (they finished, or froze) are not
// stuck in it for longer than those heartbeats show.
TEST(HangDetectorTest, AWaitCountsOnlyAsFarAsTheRanksHeartbeatsVouchForIt) {
  auto inside = Record(40, "eval/metrics", v1::CollectiveRecord::STARTED, absl::Seconds(10));
  std::vector<RankView> ranks = {Rank(0, 40, v1::COLLECTIVE, 9, 10, {inside}),
                                 Rank(1, 40, v1::COLLECTIVE, 9, 10, {inside})};
  for (RankView& v : ranks) v.heartbeat_at = kNow - absl::Seconds(8);  // 2 s in, then silence
  EXPECT_THAT(Messages(DiagnoseHangs(Spec(), ranks, kNow)),
              ElementsAre(HasSubstr("DEAD rank 0"), HasSubstr("DEAD rank 1")))
      << "silent past dead_after_seconds, but never STUCK_IN_COLLECTIVE";
  for (RankView& v : ranks) v.heartbeat_at = kNow - absl::Seconds(4);  // 6 s in, then silence
  EXPECT_THAT(Messages(DiagnoseHangs(Spec(), ranks, kNow)),
              ElementsAre(HasSubstr(
                  "STUCK_IN_COLLECTIVE every rank has been inside collective "
                  "#40 allreduce/avg eval/metrics (float32[1048576], 4.0 MB) for 10.0 s")));
  // The heartbeat's own time (the rank's clock) comes first when it has one:
  // composed 2 s into the wait, received late.
  for (RankView& v : ranks) {
    v.heartbeat_at = kNow - absl::Seconds(1);
    v.heartbeat.set_time_us(absl::ToUnixMicros(kNow - absl::Seconds(8)));
  }
  EXPECT_THAT(DiagnoseHangs(Spec(), ranks, kNow), IsEmpty());
}

TEST(HangDetectorTest, NothingBeforeTheStallThresholdOrDuringADeclaredPause) {
  auto waiting = Record(10, "ddp:model/bucket0", v1::CollectiveRecord::STARTED, absl::Seconds(1));
  EXPECT_THAT(
      DiagnoseHangs(
          Spec(), {Rank(0, 10, v1::COLLECTIVE, 5, 1, {waiting}), Rank(1, 9, v1::DATA, 5, 1)}, kNow),
      IsEmpty());
  auto long_wait =
      Record(10, "ddp:model/bucket0", v1::CollectiveRecord::STARTED, absl::Seconds(30));
  EXPECT_THAT(
      DiagnoseHangs(Spec(),
                    {Rank(0, 10, v1::COLLECTIVE, 5, 30, {long_wait}), Rank(1, 9, v1::EVAL, 5, 30)},
                    kNow),
      IsEmpty())
      << "rank 1 declared an evaluation";
  v1::HangDetectionSpec short_limit = Spec();
  short_limit.set_phase_limit_seconds(20);
  EXPECT_EQ(
      DiagnoseHangs(short_limit,
                    {Rank(0, 10, v1::COLLECTIVE, 5, 30, {long_wait}), Rank(1, 9, v1::EVAL, 5, 30)},
                    kNow)
          .size(),
      1u)
      << "a pause longer than its limit counts";
}

TEST(HangDetectorTest, ThresholdAdaptsToHowLongTheCollectiveUsuallyTakes) {
  // This tag usually takes 1 s, so 10 s is the threshold, not 3 s.
  auto done =
      Record(9, "slow/tag", v1::CollectiveRecord::COMPLETED, absl::Seconds(20), absl::Seconds(1));
  auto waiting5 = Record(10, "slow/tag", v1::CollectiveRecord::STARTED, absl::Seconds(5));
  EXPECT_THAT(DiagnoseHangs(Spec(),
                            {Rank(0, 10, v1::COLLECTIVE, 5, 5, {done, waiting5}),
                             Rank(1, 9, v1::FORWARD, 5, 5, {done})},
                            kNow),
              IsEmpty());
  auto waiting11 = Record(10, "slow/tag", v1::CollectiveRecord::STARTED, absl::Seconds(11));
  auto ds = DiagnoseHangs(Spec(),
                          {Rank(0, 10, v1::COLLECTIVE, 5, 11, {done, waiting11}),
                           Rank(1, 9, v1::FORWARD, 5, 11, {done})},
                          kNow);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::NEVER_JOINED);
}

TEST(HangDetectorTest, MismatchIsReportedAtOnce) {
  auto actor =
      Record(5, "ddp:actor/bucket0", v1::CollectiveRecord::STARTED, absl::Milliseconds(10));
  auto critic =
      Record(5, "ddp:critic/bucket0", v1::CollectiveRecord::STARTED, absl::Milliseconds(10));
  auto ds = DiagnoseHangs(
      Spec(),
      {Rank(0, 5, v1::COLLECTIVE, 1, 0, {actor}), Rank(1, 5, v1::COLLECTIVE, 1, 0, {critic})},
      kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::MISMATCH);
  EXPECT_THAT(ds[0].message(), HasSubstr("ranks 0 and 1 issued different collectives at #5: rank 0 "
                                         "allreduce/avg ddp:actor/bucket0"));
  EXPECT_EQ(ds[0].other_fingerprint().tag(), "ddp:critic/bucket0");
}

// Note [Pairing ranks' ops]: records that say where they stand among
// their kind.
v1::CollectiveRecord Collective(int64_t seq, int64_t index, const std::string& tag,
                                v1::CollectiveRecord::State state, absl::Duration started_ago) {
  v1::CollectiveRecord r = Record(seq, tag, state, started_ago);
  r.set_collective_index(index);
  return r;
}

v1::CollectiveRecord Message(int64_t seq, const std::string& op, int peer, int64_t index,
                             v1::CollectiveRecord::State state, absl::Duration started_ago) {
  v1::CollectiveRecord r = Record(seq, "torch:" + op, state, started_ago);
  const bool send = op == "send";
  r.mutable_fingerprint()->set_op(absl::StrCat(op, send ? "/to" : "/from", peer));
  r.mutable_fingerprint()->set_count(4);
  r.mutable_fingerprint()->set_bytes(16);
  if (send) {
    r.set_send_index(index);
    r.set_send_to(peer);
  } else {
    r.set_recv_index(index);
    r.set_recv_from(peer);
  }
  return r;
}

RankView Issuing(RankView v, int64_t collectives) {
  v.heartbeat.mutable_flight_recorder()->set_collectives_enqueued(collectives);
  return v;
}

TEST(HangDetectorTest, SendsAndReceivesAreNotAMismatchNorDoTheyShiftTheCollectives) {
  // A 2-stage pipeline: stage 0 sent twice (seqs 1, 2), stage 1 received
  // twice; then both entered their first all-reduce, at seq 3 on both, and
  // stage 1 one more receive than stage 0 sent before its second (seq 5
  // against 4).
  const auto done = v1::CollectiveRecord::COMPLETED;
  const auto in = v1::CollectiveRecord::STARTED;
  std::vector<v1::CollectiveRecord> stage0 = {
      Message(1, "send", 1, 1, done, absl::Seconds(1)),
      Message(2, "send", 1, 2, done, absl::Seconds(1)),
      Collective(3, 1, "torch:all_reduce", done, absl::Seconds(1)),
      Collective(4, 2, "torch:all_reduce", in, absl::Milliseconds(100))};
  std::vector<v1::CollectiveRecord> stage1 = {
      Message(1, "recv", 0, 1, done, absl::Seconds(1)),
      Message(2, "recv", 0, 2, done, absl::Seconds(1)),
      Collective(3, 1, "torch:all_reduce", done, absl::Seconds(1)),
      Message(4, "recv", 0, 3, done, absl::Milliseconds(500)),
      Collective(5, 2, "torch:all_reduce", in, absl::Milliseconds(100))};
  auto ds = DiagnoseHangs(Spec(),
                          {Issuing(Rank(0, 4, v1::COLLECTIVE, 2, 0.1, stage0), 2),
                           Issuing(Rank(1, 5, v1::COLLECTIVE, 2, 0.1, stage1), 2)},
                          kNow);
  EXPECT_THAT(Messages(ds), IsEmpty());

  // The same second collective, but stage 1 entered another one.
  stage1.back().mutable_fingerprint()->set_dtype("float64");
  stage1.back().mutable_fingerprint()->set_bytes(8 << 20);
  ds = DiagnoseHangs(Spec(),
                     {Issuing(Rank(0, 4, v1::COLLECTIVE, 2, 0.1, stage0), 2),
                      Issuing(Rank(1, 5, v1::COLLECTIVE, 2, 0.1, stage1), 2)},
                     kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::MISMATCH);
  EXPECT_THAT(ds[0].message(),
              HasSubstr("issued different collectives at #2: rank 0 allreduce/avg "
                        "torch:all_reduce (float32[1048576], 4.0 MB), rank 1 allreduce/avg "
                        "torch:all_reduce (float64[1048576], 8.0 MB)"));
}

TEST(HangDetectorTest, ARankThatNeverPostsTheReceiveForASendIsNamed) {
  const auto in = v1::CollectiveRecord::STARTED;
  // Rank 0 waits 12 s in its 3rd send to rank 1; rank 1 has posted two
  // receives from it and computes.
  std::vector<v1::CollectiveRecord> sender = {Message(7, "send", 1, 3, in, absl::Seconds(12))};
  std::vector<v1::CollectiveRecord> receiver = {
      Message(6, "recv", 0, 2, v1::CollectiveRecord::COMPLETED, absl::Seconds(13))};
  auto ds = DiagnoseHangs(Spec(),
                          {Issuing(Rank(0, 7, v1::COLLECTIVE, 5, 12, sender), 0),
                           Issuing(Rank(1, 6, v1::FORWARD, 5, 12.5, receiver), 0)},
                          kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::NEVER_JOINED);
  EXPECT_THAT(ds[0].ranks(), ElementsAre(1));
  EXPECT_THAT(ds[0].waiting_ranks(), ElementsAre(0));
  EXPECT_EQ(ds[0].message(),
            "rank 1 has not posted the receive matching rank 0's send #3 to it (send/to1 "
            "torch:send (float32[4], 16 bytes)); rank 0 has waited 11.7 s; rank 1 is in FORWARD "
            "at step 5 for 12.5 s");

  // Once rank 1 posted it, the two wait for the transport, not for a rank.
  receiver.push_back(Message(8, "recv", 0, 3, in, absl::Seconds(1)));
  ds = DiagnoseHangs(Spec(),
                     {Issuing(Rank(0, 7, v1::COLLECTIVE, 5, 12, sender), 0),
                      Issuing(Rank(1, 8, v1::COLLECTIVE, 5, 1, receiver), 0)},
                     kNow);
  EXPECT_THAT(Messages(ds), IsEmpty());
}

TEST(HangDetectorTest, AReceiveWaitingForASendIsPairedWithThePeersSends) {
  const auto in = v1::CollectiveRecord::STARTED;
  // An isend/irecv ring of 3 where rank 2 never sends to rank 0: rank 0 waits
  // in its receive from 2, everything else has arrived.
  std::vector<v1::CollectiveRecord> r0 = {Message(2, "recv", 2, 1, in, absl::Seconds(9))};
  std::vector<v1::CollectiveRecord> r2 = {
      Message(1, "recv", 1, 1, v1::CollectiveRecord::COMPLETED, absl::Seconds(9))};
  auto ds = DiagnoseHangs(
      Spec(),
      {Rank(0, 2, v1::PHASE_UNSPECIFIED, 1, 0, r0), Rank(1, 2, v1::PHASE_UNSPECIFIED, 1, 0, {}),
       Rank(2, 1, v1::PHASE_UNSPECIFIED, 1, 0, r2)},
      kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::NEVER_JOINED);
  EXPECT_THAT(ds[0].message(),
              HasSubstr("rank 2 has not posted the send matching rank 0's receive #1 from it"));
}

TEST(HangDetectorTest, EveryRankStuckInsideMeansTheTransport) {
  auto in = Record(7, "ddp:model/bucket1", v1::CollectiveRecord::STARTED, absl::Seconds(20));
  auto ds = DiagnoseHangs(
      Spec(), {Rank(0, 7, v1::COLLECTIVE, 3, 20, {in}), Rank(1, 7, v1::COLLECTIVE, 3, 20, {in})},
      kNow);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::STUCK_IN_COLLECTIVE);
  EXPECT_THAT(ds[0].message(), HasSubstr("every rank has been inside collective #7"));
}

// Note [A starved node]: every rank inside one collective past the threshold
// is NODE_SLOW while all their nodes are starved, up to three thresholds;
// a node that is not starved, or a longer wait, makes it STUCK_IN_COLLECTIVE.
TEST(HangDetectorTest, EveryRankInsideOnStarvedNodesIsNodeSlowUpToThreeThresholds) {
  struct Row {
    double pressure0, pressure1;
    int waited_seconds;
    std::optional<v1::Diagnosis::Kind> expected;
  };
  const Row rows[] = {
      {0.8, 0.8, 2, std::nullopt},  // within the threshold (3 s): nothing
      {0.8, 0.8, 5, v1::Diagnosis::NODE_SLOW},
      {0.5, 0.5, 5, v1::Diagnosis::NODE_SLOW},  // kStarvedPressure itself is starved
      {0.8, 0.8, 8, v1::Diagnosis::NODE_SLOW},
      {0.8, 0.8, 10, v1::Diagnosis::STUCK_IN_COLLECTIVE},  // past 3 x 3 s
      {0.8, 0.3, 5, v1::Diagnosis::STUCK_IN_COLLECTIVE},   // rank 1's node is not starved
      {0.0, 0.0, 5, v1::Diagnosis::STUCK_IN_COLLECTIVE},   // unknown (old agents): as before
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(absl::StrCat(row.pressure0, " ", row.pressure1, " ", row.waited_seconds, " s"));
    auto in =
        Record(7, "eval/metrics", v1::CollectiveRecord::STARTED, absl::Seconds(row.waited_seconds));
    std::vector<RankView> ranks = {Rank(0, 7, v1::COLLECTIVE, 3, row.waited_seconds, {in}),
                                   Rank(1, 7, v1::COLLECTIVE, 3, row.waited_seconds, {in})};
    ranks[0].node_cpu_pressure = row.pressure0;
    ranks[1].node_cpu_pressure = row.pressure1;
    auto ds = DiagnoseHangs(Spec(), ranks, kNow);
    if (!row.expected.has_value()) {
      EXPECT_TRUE(ds.empty()) << ::testing::PrintToString(Messages(ds));
      continue;
    }
    ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
    EXPECT_EQ(ds[0].kind(), *row.expected) << ds[0].message();
    EXPECT_THAT(ds[0].ranks(), ElementsAre(0, 1));
    EXPECT_THAT(ds[0].message(), HasSubstr("every rank has been inside collective #7"));
    if (*row.expected == v1::Diagnosis::NODE_SLOW) {
      EXPECT_THAT(ds[0].message(), HasSubstr("starved of CPU"));
      EXPECT_THAT(ds[0].message(), HasSubstr("no action before 9.0 s"));
    }
  }
  EXPECT_TRUE(IsWarningOnly(v1::Diagnosis::NODE_SLOW));
  EXPECT_TRUE(IsWarningOnly(v1::Diagnosis::STRAGGLER));
  EXPECT_FALSE(IsWarningOnly(v1::Diagnosis::STUCK_IN_COLLECTIVE));
}

TEST(HangDetectorTest, ARankThatStopsOnAStarvedNodeIsStillDead) {
  RankView dead = Rank(1, 3, v1::FORWARD, 2, 1);
  dead.heartbeat_at = kNow - absl::Seconds(6);
  dead.node_cpu_pressure = 0.9;
  RankView alive = Rank(0, 3, v1::FORWARD, 2, 1);
  alive.node_cpu_pressure = 0.9;
  auto ds = DiagnoseHangs(Spec(), {alive, dead}, kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::DEAD);
  EXPECT_THAT(ds[0].ranks(), ElementsAre(1));
}

// Found writing //coordinator:heartbeat_fuzzer (its input
// completed_before_started is UBSan's report without the fix): a record that says it completed
// before it started (a rank's clock stepped back, or a damaged heartbeat)
// made the typical duration overflow (undefined behaviour; in practice a
// huge threshold that hid every stuck collective with that tag).
TEST(HangDetectorTest, ARecordThatEndsBeforeItStartsIsNotADuration) {
  auto in = Record(7, "ddp:model/bucket1", v1::CollectiveRecord::STARTED, absl::Seconds(20));
  auto garbage = Record(6, "ddp:model/bucket1", v1::CollectiveRecord::COMPLETED, absl::Seconds(30));
  garbage.set_started_us(1);
  garbage.set_completed_us(std::numeric_limits<int64_t>::min());
  auto ds = DiagnoseHangs(
      Spec(),
      {Rank(0, 7, v1::COLLECTIVE, 3, 20, {garbage, in}), Rank(1, 7, v1::COLLECTIVE, 3, 20, {in})},
      kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::STUCK_IN_COLLECTIVE);
  EXPECT_THAT(ds[0].message(), HasSubstr("threshold 3.0 s"));
}

TEST(HangDetectorTest, ARankThatFinishedItsSideWaitsInTheNextCollective) {
  // The network failed while the last chunks of #145 were in flight: rank 0
  // had all it needed and moved on to #146; rank 1 still waits in #145.
  auto done = Record(145, "ddp:model/bucket0", v1::CollectiveRecord::COMPLETED, absl::Seconds(20));
  auto next = Record(146, "ddp:model/bucket1", v1::CollectiveRecord::STARTED, absl::Seconds(19));
  auto stuck = Record(145, "ddp:model/bucket0", v1::CollectiveRecord::STARTED, absl::Seconds(20));
  auto ds = DiagnoseHangs(Spec(),
                          {Rank(0, 146, v1::COLLECTIVE, 70, 19, {done, next}),
                           Rank(1, 145, v1::COLLECTIVE, 69, 20, {stuck})},
                          kNow);
  ASSERT_EQ(ds.size(), 1u) << ::testing::PrintToString(Messages(ds));
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::STUCK_IN_COLLECTIVE);
  EXPECT_EQ(ds[0].ranks_size(), 2);
  EXPECT_THAT(ds[0].message(), HasSubstr("rank 1 has been inside collective #145"));
  EXPECT_THAT(ds[0].message(), HasSubstr("rank 0, which finished its side of it, in the next one"));
}

TEST(HangDetectorTest, DeadRankAndStraggler) {
  RankView dead = Rank(1, 3, v1::FORWARD, 2, 1);
  dead.heartbeat_at = kNow - absl::Seconds(6);
  auto ds = DiagnoseHangs(Spec(), {Rank(0, 3, v1::FORWARD, 2, 1), dead}, kNow);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::DEAD);
  EXPECT_THAT(ds[0].message(),
              HasSubstr("rank 1 has sent no heartbeat for 6.0 s (last seen in FORWARD at step 2)"));

  std::vector<RankView> ranks = {Rank(0, 3, v1::FORWARD, 2, 0), Rank(1, 3, v1::FORWARD, 2, 0),
                                 Rank(2, 3, v1::FORWARD, 2, 0)};
  ranks[0].heartbeat.mutable_timings()->set_compute_seconds(0.1);
  ranks[1].heartbeat.mutable_timings()->set_compute_seconds(0.11);
  ranks[2].heartbeat.mutable_timings()->set_compute_seconds(0.3);
  ds = DiagnoseHangs(Spec(), ranks, kNow);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::STRAGGLER);
  EXPECT_THAT(ds[0].ranks(), ElementsAre(2));

  // 3x the median but only 2 ms a step: noise, not a straggler.
  ranks[0].heartbeat.mutable_timings()->set_compute_seconds(0.001);
  ranks[1].heartbeat.mutable_timings()->set_compute_seconds(0.001);
  ranks[2].heartbeat.mutable_timings()->set_compute_seconds(0.003);
  EXPECT_TRUE(DiagnoseHangs(Spec(), ranks, kNow).empty());
}

// WaitCausedBy runs for every status request and scrape: at 16,384 ranks its
// definition (a sum over every pair) took seconds. It must agree with the
// definition, and stay well under a second at 65,536 ranks (about 30 s the
// old way, unoptimized).
TEST(HangDetectorTest, TheWaitAttributionIsTheSumOverPairsInNLogNTime) {
  std::vector<double> waits;
  uint64_t x = 12345;
  for (int r = 0; r < 300; ++r) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    // Unknown waits, ties and distinct values.
    waits.push_back(r % 7 == 0 ? -1 : static_cast<double>((x >> 33) % 50) / 100);
  }
  const std::vector<double> caused = WaitCausedBy(waits);
  for (size_t r = 0; r < waits.size(); ++r) {
    double want = 0;
    for (size_t o = 0; o < waits.size() && waits[r] >= 0; ++o) {
      if (o != r && waits[o] >= 0) want += std::max(0.0, waits[o] - waits[r]);
    }
    ASSERT_NEAR(caused[r], want, 1e-9) << "rank " << r;
  }
  std::vector<double> many(65536);
  for (size_t r = 0; r < many.size(); ++r) many[r] = static_cast<double>(r % 1000) / 1000;
  const absl::Time start = absl::Now();
  const std::vector<double> big = WaitCausedBy(many);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  double total = 0;
  for (double w : many) total += w;
  EXPECT_NEAR(big[0], total, 1e-6 * total) << "rank 0 waited least (0 s): every wait is on it";
}

TEST(HangDetectorTest, TheWaitIsAttributedToTheRankEveryoneWaitedFor) {
  // Rank 2 arrives 0.2 s late: ranks 0 and 1 wait 0.21 s, it waits 0.01 s.
  std::vector<double> caused = WaitCausedBy({0.21, 0.21, 0.01});
  ASSERT_EQ(caused.size(), 3u);
  EXPECT_DOUBLE_EQ(caused[0], 0.0);
  EXPECT_DOUBLE_EQ(caused[1], 0.0);
  EXPECT_NEAR(caused[2], 0.4, 1e-12);
  // Two late ranks: rank 0 waits for both, rank 1 (0.1 s late) waits 0.2 s
  // for rank 2 (0.3 s late); rank 1 has kept rank 0 waiting 0.1 s of it.
  caused = WaitCausedBy({0.3, 0.2, 0.0});
  EXPECT_NEAR(caused[0], 0.0, 1e-12);
  EXPECT_NEAR(caused[1], 0.1, 1e-12);
  EXPECT_NEAR(caused[2], 0.5, 1e-12);
  // Unknown waits (negative) count for no one and get nothing.
  caused = WaitCausedBy({0.25, -1, 0.05});
  EXPECT_DOUBLE_EQ(caused[1], 0.0);
  EXPECT_NEAR(caused[2], 0.2, 1e-12);
  EXPECT_DOUBLE_EQ(caused[0], 0.0);
  EXPECT_TRUE(WaitCausedBy({}).empty());

  // The STRAGGLER diagnosis says how long the others waited for the slow rank.
  std::vector<RankView> ranks = {Rank(0, 3, v1::FORWARD, 2, 0), Rank(1, 3, v1::FORWARD, 2, 0)};
  ranks[0].heartbeat.mutable_timings()->set_compute_seconds(0.05);
  ranks[0].heartbeat.mutable_timings()->set_comm_wait_seconds(0.26);
  ranks[1].heartbeat.mutable_timings()->set_compute_seconds(0.3);
  ranks[1].heartbeat.mutable_timings()->set_comm_wait_seconds(0.01);
  std::vector<v1::Diagnosis> ds = DiagnoseHangs(Spec(), ranks, kNow);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].kind(), v1::Diagnosis::STRAGGLER);
  EXPECT_THAT(ds[0].ranks(), ElementsAre(1));
  EXPECT_THAT(ds[0].message(), HasSubstr("the others wait for it (0.250 s per step between them)"));
}

}  // namespace
}  // namespace chorus
