#include "coordinator/scheduling/hang_restart.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/scheduling/running_job_test_peer.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(10000);

// A formed 3-rank elastic job of generation 2 whose ranks all heartbeat now
// (`elastic` false: the same without an elastic block).
RunningJob Job(v1::HangDetectionSpec::Action action = v1::HangDetectionSpec::ACTION_UNSPECIFIED,
               bool elastic = true) {
  v1::Job job;
  job.set_job_id("job-000001");
  if (elastic) job.mutable_spec()->mutable_elastic()->set_wait_seconds(60);
  job.mutable_spec()->mutable_hang_detection()->set_dead_after_seconds(5);
  job.mutable_spec()->mutable_hang_detection()->set_action(action);
  RunningJob run(job, 3, /*generation=*/2);
  for (int rank = 0; rank < 3; ++rank) {
    RankSlot slot;
    slot.agent_id = "agent-1";
    slot.slot = rank;
    RankState& r = RanksOf(run).emplace_back(RankState::At(slot));
    r.state = v1::RankStatus::TRAINING;
    r.heartbeat_at = kNow;
    r.heard_at = kNow;
    run.mutable_rendezvous().MarkJoined(rank);
  }
  return run;
}

v1::Diagnosis Diagnosis(v1::Diagnosis::Kind kind, std::vector<int> ranks,
                        const std::string& message) {
  v1::Diagnosis d;
  d.set_kind(kind);
  for (int rank : ranks) d.add_ranks(rank);
  d.set_message(message);
  return d;
}

std::string Describe(const HangRestart& restart) {
  std::string out = restart.kind == HangRestart::kNone    ? "none"
                    : restart.kind == HangRestart::kEvict ? "evict"
                    : restart.kind == HangRestart::kWait  ? "wait"
                                                          : "restart: " + restart.cause;
  for (const Eviction& e : restart.evictions) {
    out += "; rank " + std::to_string(e.rank) + " by " + e.by + ": " + e.why;
  }
  return out;
}

struct Case {
  std::string name;
  std::function<void(RunningJob&)> change;
  std::vector<v1::Diagnosis> diagnoses;
  std::string expected;
};

TEST(HangRestartTest, DiagnosesGiveTheirAction) {
  const v1::Diagnosis dead = Diagnosis(v1::Diagnosis::DEAD, {1}, "rank 1 silent for 6.0 s");
  const v1::Diagnosis never = Diagnosis(v1::Diagnosis::NEVER_JOINED, {2}, "rank 2 never joined");
  const v1::Diagnosis mismatch =
      Diagnosis(v1::Diagnosis::MISMATCH, {0, 1}, "ranks 0,1 differ at #12");
  const v1::Diagnosis stuck = Diagnosis(v1::Diagnosis::STUCK_IN_COLLECTIVE, {0, 1, 2}, "all stuck");
  const v1::Diagnosis straggler = Diagnosis(v1::Diagnosis::STRAGGLER, {0}, "rank 0 slow");
  auto nothing = [](RunningJob&) {};
  const std::string by = " by hang_detection.action RESTART: ";
  const std::vector<Case> cases = {
      {"no diagnosis: nothing", nothing, {}, "none"},
      {"a warning is the hang policy's, not a restart's", nothing, {straggler}, "none"},
      {"DEAD evicts its rank",
       nothing,
       {dead},
       "evict; rank 1" + by + "DEAD rank 1 silent for 6.0 s"},
      {"eviction wins over a MISMATCH",
       nothing,
       {mismatch, dead, never},
       "evict; rank 1" + by + "DEAD rank 1 silent for 6.0 s; rank 2" + by +
           "NEVER_JOINED rank 2 never joined"},
      {"a rank named twice is evicted once, for the first",
       nothing,
       {dead, Diagnosis(v1::Diagnosis::NEVER_JOINED, {1}, "again")},
       "evict; rank 1" + by + "DEAD rank 1 silent for 6.0 s"},
      {"a rank evicted already or exited is not evicted again, and nothing restarts",
       [](RunningJob& run) {
         run.MarkEvicted(1, "earlier");
         RankOf(run, 2).state = v1::RankStatus::EXITED;
       },
       {dead, never},
       "evict"},
      {"a rank outside the job is ignored",
       nothing,
       {Diagnosis(v1::Diagnosis::DEAD, {7, -1}, "who")},
       "evict"},
      {"MISMATCH: every rank re-forms its transport",
       nothing,
       {mismatch},
       "restart: hang_detection.action RESTART for MISMATCH ranks 0,1 (every rank re-forms its "
       "transport): ranks 0,1 differ at #12"},
      {"STUCK_IN_COLLECTIVE too",
       nothing,
       {stuck},
       "restart: hang_detection.action RESTART for STUCK_IN_COLLECTIVE ranks 0,1,2 (every rank "
       "re-forms its transport): all stuck"},
      {"it waits while the generation forms",
       [](RunningJob& run) { run.mutable_rendezvous() = Rendezvous("job-000001", 3, 3); },
       {mismatch},
       "wait"},
      {"it waits while ranks are taken back after a restart",
       [](RunningJob& run) { run.AwaitAfterRestart(kNow + absl::Seconds(5)); },
       {stuck},
       "wait"},
      {"it waits for an evicted rank's exit",
       [](RunningJob& run) { run.MarkEvicted(0, "earlier"); },
       {stuck},
       "wait"},
      {"it waits for a silent rank to be found DEAD",
       [](RunningJob& run) {
         RankOf(run, 2).heartbeat_at = kNow - kRankSilentAfter - absl::Seconds(1);
       },
       {stuck},
       "wait"},
      {"an exited rank's silence does not hold it up",
       [](RunningJob& run) {
         RankOf(run, 2).state = v1::RankStatus::EXITED;
         RankOf(run, 2).heartbeat_at = absl::InfinitePast();
       },
       {stuck},
       "restart: hang_detection.action RESTART for STUCK_IN_COLLECTIVE ranks 0,1,2 (every rank "
       "re-forms its transport): all stuck"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RunningJob run = Job();
    c.change(run);
    EXPECT_EQ(Describe(PlanHangRestart(run, c.diagnoses, kNow)), c.expected);
  }
}

// A 3-rank job forming generation 3, whose ranks have not joined.
RunningJob Forming() {
  RunningJob run = Job();
  run.mutable_rendezvous() = Rendezvous("job-000001", 3, 3);
  run.mutable_phase().BeginForming(ReformKind::kRankLost, kNow - absl::Seconds(10),
                                   kNow + absl::Seconds(50));
  return run;
}

TEST(HangRestartTest, ASurvivorSilentForDeadAfterSecondsIsEvictedFromTheFormingGeneration) {
  RunningJob run = Forming();
  run.mutable_rendezvous().MarkJoined(0);
  run.HeardFrom(0, kNow - absl::Seconds(30));      // joined: not judged
  run.HeardFrom(1, kNow - absl::Seconds(6));       // silent past 5 s
  RankOf(run, 2).heard_at = absl::InfinitePast();  // a newcomer: never heard
  std::vector<Eviction> silent = SilentJoiners(run, kNow);
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0].rank, 1);
  EXPECT_EQ(silent[0].by, "the forming generation");
  EXPECT_EQ(silent[0].why,
            "rank 1 has not joined generation 3 and its process has sent no heartbeat for 6.0 s "
            "(hang_detection.dead_after_seconds 5): it is stopped or not responding");

  run.HeardFrom(1, kNow - absl::Seconds(5));  // not past it yet
  EXPECT_TRUE(SilentJoiners(run, kNow).empty());
  run.HeardFrom(1, kNow - absl::Seconds(6));
  run.MarkEvicted(1, "the forming generation: ...");  // once
  EXPECT_TRUE(SilentJoiners(run, kNow).empty());

  RunningJob steady = Job();  // a formed generation is the hang detector's
  steady.HeardFrom(1, kNow - absl::Seconds(60));
  EXPECT_TRUE(SilentJoiners(steady, kNow).empty());
}

TEST(HangRestartTest, AChangeIsOverduePastElasticWaitSeconds) {
  RunningJob run = Forming();
  run.AddHistory("generation 3 after rank 1 exited");
  run.mutable_rendezvous().MarkJoined(1);
  EXPECT_EQ(ReformOverdue(run, kNow + absl::Seconds(49)), std::nullopt);
  EXPECT_EQ(ReformOverdue(run, kNow + absl::Seconds(50)),
            "generation 3 did not form within elastic.wait_seconds 60 s; ranks that have not "
            "joined: 0,2; history: generation 3 after rank 1 exited");
  run.mutable_rendezvous().MarkJoined(0);
  run.mutable_rendezvous().MarkJoined(2);
  EXPECT_EQ(ReformOverdue(run, kNow + absl::Seconds(50)), std::nullopt);  // formed

  RunningJob restarting = Job();
  RankOf(restarting, 0).state = v1::RankStatus::EXITED;
  restarting.mutable_phase().BeginRestarting("rank 0 exited", ReformKind::kRankLost, kNow,
                                             kNow + absl::Seconds(60));
  EXPECT_EQ(ReformOverdue(restarting, kNow + absl::Seconds(59)), std::nullopt);
  EXPECT_EQ(ReformOverdue(restarting, kNow + absl::Seconds(60)),
            "rank 0 exited; restart-all: rank(s) 1,2 of generation 2 did not exit within "
            "elastic.wait_seconds 60 s of being stopped");

  EXPECT_EQ(ReformOverdue(Job(), kNow + absl::Hours(1)), std::nullopt);  // steady
}

// An eviction stops the rank through its agent (SIGKILL 1 s after
// SIGTERM) with an event, once; nothing for an exited rank or one whose
// agent is gone.
TEST(HangRestartTest, AnEvictionStopsTheRankOnce) {
  AgentRegistry agents;
  v1::AgentHello hello;
  hello.set_host("node-a");
  hello.set_slots(3);
  ASSERT_EQ(*agents.Add(hello, nullptr), "agent-1");
  RunningJob run = Job();
  const Eviction e{1, "rank 1 sent no heartbeat for 6.0 s", "hang detection"};
  JobActions actions = Evict(run, "job-000001", e, agents);
  ASSERT_EQ(actions.messages.size(), 1u);
  EXPECT_EQ(actions.messages[0].first, "agent-1");
  const v1::StopRanks& stop = actions.messages[0].second.stop();
  EXPECT_EQ(stop.job_id(), "job-000001");
  ASSERT_EQ(stop.slots_size(), 1);
  EXPECT_EQ(stop.slots(0), 1);
  EXPECT_EQ(stop.grace_seconds(), 1);
  EXPECT_EQ(stop.reason(), "evicted by hang detection: rank 1 sent no heartbeat for 6.0 s");
  EXPECT_EQ(actions.events,
            std::vector<std::string>{
                "evicting rank 1 (hang detection): rank 1 sent no heartbeat for 6.0 s"});
  EXPECT_EQ(run.ranks()[1].evicted, "hang detection: rank 1 sent no heartbeat for 6.0 s");

  EXPECT_TRUE(Evict(run, "job-000001", e, agents).messages.empty());  // once
  RankOf(run, 2).state = v1::RankStatus::EXITED;
  EXPECT_TRUE(Evict(run, "job-000001", {2, "", "x"}, agents).events.empty());
  RankOf(run, 0).agent_id = "agent-9";  // gone
  EXPECT_TRUE(Evict(run, "job-000001", {0, "", "x"}, agents).events.empty());
  EXPECT_TRUE(run.ranks()[0].evicted.empty());
}

// What a Tick makes of a job's deadlines, as a table.
TEST(HangRestartTest, DeadlinesGiveTheirActions) {
  struct Row {
    std::string name;
    std::function<RunningJob()> job;
    std::string expected;  // fail | evict ranks | event | give up
  };
  const auto describe = [](const DeadlineCheck& c) {
    std::string out = c.fail.value_or("-");
    for (const Eviction& e : c.evictions) out += "; evict " + std::to_string(e.rank);
    if (c.event.has_value()) out += "; event: " + *c.event;
    if (c.give_up_lost_agents) out += "; give up";
    return out;
  };
  const auto waiting_for_agent = [](bool elastic, bool back) {
    RunningJob run = Job(v1::HangDetectionSpec::REPORT, elastic);
    run.AwaitLostAgent(LostAgentWait{"agent-1", "node-a", {2}, absl::Seconds(10)}, kNow);
    if (!back) RankOf(run, 2).agent_id.clear();
    return run;
  };
  const std::vector<Row> rows = {
      {"steady", [] { return Job(); }, "-"},
      {"overdue: nothing else is checked",
       [] {
         RunningJob run = Forming();
         run.HeardFrom(1, kNow - absl::Seconds(60));
         run.mutable_phase() = ElasticPhase();
         run.mutable_phase().BeginForming(ReformKind::kRankLost, kNow - absl::Seconds(60),
                                          kNow - absl::Seconds(1));
         return run;
       },
       "generation 3 did not form within elastic.wait_seconds 60 s; ranks that have not joined: "
       "0,1,2"},
      {"a silent survivor of the forming generation",
       [] {
         RunningJob run = Forming();
         run.HeardFrom(1, kNow - absl::Seconds(6));
         return run;
       },
       "-; evict 1"},
      {"a lost agent's ranks back", [&] { return waiting_for_agent(true, true); },
       "-; event: every rank is back: the agent on node-a reconnected"},
      {"an elastic job's lost agent not back: it re-forms without it",
       [&] { return waiting_for_agent(true, false); }, "-; give up"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    RunningJob run = row.job();
    EXPECT_EQ(describe(CheckDeadlines(run, kNow)), row.expected);
  }
  RunningJob fixed = waiting_for_agent(false, false);
  const DeadlineCheck check = CheckDeadlines(fixed, kNow);
  ASSERT_TRUE(check.fail.has_value());  // not elastic: it fails
  EXPECT_FALSE(check.give_up_lost_agents);
}

// What a Tick makes of a job's diagnoses, as a table.
TEST(HangRestartTest, DiagnosesOfATickGiveTheirActions) {
  const v1::Diagnosis dead = Diagnosis(v1::Diagnosis::DEAD, {2}, "rank 2 is dead");
  const v1::Diagnosis stuck =
      Diagnosis(v1::Diagnosis::STUCK_IN_COLLECTIVE, {0, 1, 2}, "all stuck in allreduce #7");
  const auto with = [](v1::HangDetectionSpec::Action action, bool elastic) {
    RunningJob run = Job(action, elastic);
    for (RankState& r : RanksOf(run)) r.last_heartbeat.set_step(3);
    return run;
  };
  const auto describe = [](const DiagnosisCheck& c) {
    std::string out;
    for (const Eviction& e : c.evictions) out += "evict " + std::to_string(e.rank) + "; ";
    if (c.restart.has_value()) out += "restart; ";
    if (c.fail.has_value()) out += "fail: " + *c.fail;
    return out;
  };
  EXPECT_EQ(describe(CheckDiagnoses(with(v1::HangDetectionSpec::RESTART, true), {dead}, kNow)),
            "evict 2; ");
  EXPECT_EQ(describe(CheckDiagnoses(with(v1::HangDetectionSpec::RESTART, true), {}, kNow)), "");
  EXPECT_EQ(describe(CheckDiagnoses(with(v1::HangDetectionSpec::ABORT, false), {dead}, kNow)),
            "fail: hang detection: DEAD rank 2 is dead");
  EXPECT_EQ(describe(CheckDiagnoses(with(v1::HangDetectionSpec::REPORT, false), {dead}, kNow)), "");
  RunningJob waiting = with(v1::HangDetectionSpec::ABORT, true);
  waiting.mutable_phase().BeginWaiting("rank 1 exited", ReformKind::kRankLost, kNow, kNow);
  EXPECT_EQ(describe(CheckDiagnoses(waiting, {dead, stuck}, kNow)), "");
  const DiagnosisCheck restart =
      CheckDiagnoses(with(v1::HangDetectionSpec::RESTART, true), {stuck}, kNow);
  ASSERT_TRUE(restart.restart.has_value()) << describe(restart);
  EXPECT_TRUE(restart.evictions.empty());
  EXPECT_FALSE(restart.fail.has_value());
}

}  // namespace
}  // namespace chorus
