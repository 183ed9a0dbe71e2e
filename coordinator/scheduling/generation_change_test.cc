#include "coordinator/scheduling/generation_change.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "coordinator/scheduling/placement.h"
#include "coordinator/scheduling/running_job_test_peer.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(10000);

// A 3-rank elastic job in generation 1 (formed), ranks 0 and 1 on agent
// "ha" and rank 2 on "hb", with one more slot free on "hb" and on "hc".
struct World {
  World() {
    ha = Add("ha", 2);
    hb = Add("hb", 2);
    hc = Add("hc", 1);
    for (const auto& [agent, slot] : std::vector<std::pair<std::string, int>>{
             {ha, 0}, {ha, 1}, {hb, 0}}) {
      RankSlot s;
      s.agent_id = agent;
      s.slot = slot;
      RankState& r = RanksOf(run).emplace_back(RankState::At(s));
      r.state = v1::RankStatus::TRAINING;
      agents.SetBusy(agent, slot, true);
    }
    for (int rank = 0; rank < 3; ++rank) run.mutable_rendezvous().MarkJoined(rank);
  }
  std::string Add(const std::string& host, int slots) {
    v1::AgentHello hello;
    hello.set_host(host);
    hello.set_slots(slots);
    hello.set_device(v1::ResourceSpec::CPU);
    return agents.Add(hello, nullptr).value();
  }
  void Exit(int rank, int code) {
    RankOf(run, rank).state = v1::RankStatus::EXITED;
    RankOf(run, rank).exit_code = code;
  }
  // The free slots as the Scheduler would give them (its reservations none).
  GenerationChange Change(const std::string& cause, ReformKind kind) {
    const ChangeInputs in{job, agents, kNow, [this] { return agents.FreeSlots(); },
                          [this] { return ToQueuedJob(job.job_id(), job.spec()); }};
    return ChangeGeneration(run, cause, kind, in);
  }

  AgentRegistry agents;
  std::string ha, hb, hc;
  // A program job's ranks as they are (its program is part of its spec).
  void MakeProgram() {
    job.mutable_spec()->mutable_program()->add_argv("/usr/bin/true");
    Respec();
  }
  // The run rebuilt from `job` as changed, its ranks kept.
  void Respec() {
    std::vector<RankState> ranks = std::move(run.ranks());
    storage.emplace(job, 3, /*generation=*/1);
    RanksOf(run) = std::move(ranks);
    for (int rank = 0; rank < 3; ++rank) run.mutable_rendezvous().MarkJoined(rank);
  }
  static v1::Job ElasticJob() {
    v1::Job job;
    job.set_job_id("job-000001");
    job.mutable_spec()->mutable_resources()->set_device(v1::ResourceSpec::CPU);
    job.mutable_spec()->mutable_resources()->set_min_ranks(2);
    job.mutable_spec()->mutable_resources()->set_max_ranks(3);
    job.mutable_spec()->mutable_elastic()->set_max_restarts(3);
    job.mutable_spec()->mutable_elastic()->set_wait_seconds(60);
    return job;
  }
  v1::Job job = ElasticJob();
  std::optional<RunningJob> storage{std::in_place, job, 3, /*generation=*/1};
  RunningJob& run = *storage;  // rebuilt in place by MakeProgram
};

std::string PhaseOf(const RunningJob& run) {
  if (run.phase().forming() != nullptr) return "forming";
  if (run.phase().waiting() != nullptr) return "waiting";
  if (run.phase().restarting() != nullptr) return "restarting";
  return "steady";
}

// The change and the job after it, as one line.
std::string Describe(const GenerationChange& change, const World& w) {
  std::vector<std::string> parts;
  if (change.fail.has_value()) parts.push_back("fail: " + *change.fail);
  for (const std::string& e : change.events) parts.push_back("event: " + e);
  for (const auto& [agent, slots] : change.stop) {
    parts.push_back(absl::StrCat("stop ", w.agents.Find(agent)->hello.host(), " slots ",
                                 absl::StrJoin(slots, ","), ": ", change.stop_reason));
  }
  if (change.begun.has_value()) {
    std::vector<std::string> ranks;
    for (const RankState& r : w.run.ranks()) {
      ranks.push_back(absl::StrCat(w.agents.Find(r.agent_id)->hello.host(), ":", r.slot, " ",
                                   v1::RankStatus::State_Name(r.state)));
    }
    parts.push_back(absl::StrCat("begun ", change.begun->generation, " of ", change.begun->world,
                                 " [", absl::StrJoin(ranks, ", "), "]: ", change.begun->change));
  }
  parts.push_back(absl::StrCat("phase ", PhaseOf(w.run), ", restarts ", w.run.restarts(),
                               ", joins aborted ", change.joins.size()));
  return absl::StrJoin(parts, " | ");
}

struct Case {
  std::string name;
  std::function<void(World&)> before;
  std::string cause;
  ReformKind kind;
  std::string expected;
};

TEST(GenerationChangeTest, ChangesGiveTheirActions) {
  const std::vector<Case> cases = {
      {"a lost rank is replaced on the slot it freed; its survivors join",
       [](World& w) { w.Exit(1, 1); }, "rank 1 exited with code 1", ReformKind::kRankLost,
       "begun 2 of 3 [ha:0 JOINING, ha:1 LAUNCHING, hb:0 JOINING]: generation 2 after rank 1 "
       "exited with code 1: 3 -> 3 ranks (rank 1 on ha slot 1), restart 1 of 3 | phase forming, "
       "restarts 1, joins aborted 0"},
      {"past elastic.max_restarts the job fails before anything moves",
       [](World& w) {
         w.job.set_restarts(3);  // three failures survived already
         w.Respec();
         w.Exit(1, 1);
       },
       "rank 1 exited with code 1", ReformKind::kRankLost,
       "fail: rank 1 exited with code 1; elastic.max_restarts 3 used up in generation 1 | phase "
       "steady, restarts "
       "3, joins aborted 0"},
      {"a drain is no restart: the drained ranks leave at the boundary and depart",
       [](World& w) { w.agents.SetDraining(w.ha); }, "agent ha was drained", ReformKind::kDrain,
       "begun 2 of 3 [hb:1 LAUNCHING, hc:0 LAUNCHING, hb:0 JOINING]: generation 2 after agent ha "
       "was drained: 3 -> 3 ranks (rank 0 on hb slot 1, rank 1 on hc slot 0), at a step boundary "
       "(not a restart) | phase forming, restarts 0, joins aborted 0"},
      {"its agent lost and no free slot, the survivors form alone while they are min_ranks",
       [](World& w) {
         w.agents.Remove(w.hb);
         w.agents.SetBusy(w.hc, 0, true);
       },
       "lost contact with hb", ReformKind::kAgentLost,
       "begun 2 of 2 [ha:0 JOINING, ha:1 JOINING]: generation 2 after lost contact with hb: 3 -> 2 "
       "ranks, restart 1 of 3 | phase forming, restarts 1, joins aborted 0"},
      {"below min_ranks without a free slot it waits for slots",
       [](World& w) {
         w.job.mutable_spec()->mutable_resources()->set_min_ranks(3);
         w.agents.Remove(w.hb);
         w.agents.SetBusy(w.hc, 0, true);
       },
       "lost contact with hb", ReformKind::kAgentLost,
       "event: generation 2 after lost contact with hb waits up to elastic.wait_seconds 60 s for "
       "free slots: "},
      {"a program that restarts all first has every live rank stopped",
       [](World& w) {
         w.MakeProgram();
         w.Exit(1, 1);
       },
       "rank 1 exited with code 1", ReformKind::kRankLost,
       "event: restart-all for generation 2 after rank 1 exited with code 1: stopping the 2 "
       "running rank(s) (the program does not re-form in its own process); every rank starts "
       "again once they have exited | stop ha slots 0: restart-all for generation 2 after rank 1 "
       "exited with code 1 | stop hb slots 0: restart-all for generation 2 after rank 1 exited "
       "with code 1 | phase restarting, restarts 0, joins aborted 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    World w;
    c.before(w);
    const std::string got = Describe(w.Change(c.cause, c.kind), w);
    if (c.expected.back() == ' ') {  // a prefix: the rest is PlanReform's wording
      EXPECT_EQ(got.substr(0, c.expected.size()), c.expected) << got;
      EXPECT_NE(got.find("phase waiting, restarts 0"), std::string::npos) << got;
    } else {
      EXPECT_EQ(got, c.expected);
    }
  }
}

TEST(GenerationChangeTest, ARestartAllStartsEveryRankAgainOnceTheLastHasExited) {
  World w;
  w.MakeProgram();
  w.Exit(1, 1);
  ASSERT_FALSE(w.Change("rank 1 exited with code 1", ReformKind::kRankLost).begun.has_value());
  EXPECT_TRUE(w.run.ranks()[0].stopping);
  // A planned change meanwhile does not replace the failure, nor start
  // anything while ranks run.
  GenerationChange drain = w.Change("agent hc was drained", ReformKind::kDrain);
  EXPECT_FALSE(drain.begun.has_value());
  EXPECT_TRUE(drain.stop.empty());
  w.Exit(0, 143);
  w.Exit(2, 143);
  const GenerationChange change = w.Change("rank 2 exited", ReformKind::kRankLost);
  ASSERT_TRUE(change.begun.has_value());
  EXPECT_EQ(change.begun->kind, ReformKind::kRankLost);
  EXPECT_EQ(change.begun->change,
            "generation 2 after rank 1 exited with code 1: 3 -> 3 ranks (restart-all: every rank "
            "started again), restart 1 of 3");
  for (const RankState& r : w.run.ranks()) EXPECT_EQ(r.state, v1::RankStatus::LAUNCHING);
  EXPECT_EQ(w.run.restarts(), 1);
}

// The formed event says how long the change took; a failure's time is
// the job's recovery_seconds.
TEST(GenerationChangeTest, AFormedGenerationSaysHowLongItTook) {
  World w;
  EXPECT_EQ(OnGenerationFormed(w.run, kNow), std::nullopt);  // nothing was forming
  w.run.mutable_phase().BeginForming(ReformKind::kRankLost, kNow - absl::Seconds(2),
                                     kNow + absl::Seconds(58));
  EXPECT_EQ(OnGenerationFormed(w.run, kNow),
            "generation 1 formed with 3 ranks, 2 s after the failure (recovery_seconds)");
  EXPECT_EQ(w.run.recovery_seconds(), 2);
  EXPECT_EQ(OnGenerationFormed(w.run, kNow), std::nullopt);  // once
  w.run.mutable_phase().BeginForming(ReformKind::kDrain, kNow - absl::Seconds(1),
                                     kNow + absl::Seconds(59));
  EXPECT_EQ(OnGenerationFormed(w.run, kNow),
            "generation 1 formed with 3 ranks, 1 s after the step boundary");
  EXPECT_EQ(w.run.recovery_seconds(), 2);  // a planned change is not a recovery
}

// Whether a job may grow, as a table over its state.
TEST(GenerationChangeTest, AJobGrowsWhenSteadyAndPastItsScaleUpInterval) {
  struct Row {
    std::string name;
    std::function<void(World&)> change;
    bool may_grow;
  };
  const std::vector<Row> rows = {
      {"grew 10 s ago, interval 30 s", [](World&) {}, false},
      {"grew 30 s ago",
       [](World& w) { w.run.CountChange(false, /*grew=*/true, false, kNow - absl::Seconds(30)); },
       true},
      {"owes replacements", [](World& w) { w.run.CountChange(false, false, /*owes=*/true, kNow); },
       true},
      {"forming",
       [](World& w) {
         w.run.CountChange(false, /*grew=*/true, false, kNow - absl::Seconds(30));
         w.run.mutable_rendezvous() = Rendezvous("job-000001", 2, 3);  // generation 2 forming
         w.run.mutable_phase().BeginForming(ReformKind::kDrain, kNow, kNow + absl::Seconds(60));
       },
       false},
      {"a staged growth under way",
       [](World& w) {
         w.run.CountChange(false, false, /*owes=*/true, kNow);
         w.run.mutable_staged().Start(2, 4, "growth", {StagedNewcomer{}}, kNow, absl::Seconds(60));
       },
       false},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    World w;
    w.job.mutable_spec()->mutable_elastic()->set_scale_up_interval_seconds(30);
    w.Respec();
    w.run.CountChange(false, /*grew=*/true, false, kNow - absl::Seconds(10));
    row.change(w);
    EXPECT_EQ(MayGrow(w.run, kNow), row.may_grow);
  }
}

// A growth takes the free slots up to max_ranks; a program's is staged:
// its newcomers are launched for the next generation before it forms.
TEST(GenerationChangeTest, AGrowthTakesFreeSlotsAndAProgramsIsStaged) {
  World w;
  w.job.mutable_spec()->mutable_resources()->set_max_ranks(5);
  const QueuedJob capped = ToQueuedJob(w.job.job_id(), w.job.spec());
  EXPECT_EQ(PlanGrowth(w.run, 3, w.agents.FreeSlots(), capped), std::nullopt);  // at max_ranks
  EXPECT_EQ(PlanGrowth(w.run, 5, {}, capped), std::nullopt);                    // no free slot
  std::optional<Growth> growth = PlanGrowth(w.run, 5, w.agents.FreeSlots(), capped);
  ASSERT_TRUE(growth.has_value());
  EXPECT_EQ(growth->next.ranks.size(), 5u);
  EXPECT_EQ(growth->cause, "2 free slot(s) let the job grow from 3 towards resources.max_ranks 5");
  EXPECT_FALSE(growth->staged);  // the built-in trainer's newcomers come with the change

  w.MakeProgram();
  w.run.NoteReformsInProcess();  // not a restart-all (Note [Restart-all])
  w.run.CountChange(false, false, /*owes=*/true, kNow);
  growth = PlanGrowth(w.run, 5, w.agents.FreeSlots(), capped);
  ASSERT_TRUE(growth.has_value());
  EXPECT_EQ(growth->cause, "2 newcomer(s) replace the rank(s) lost in generation 0");
  EXPECT_TRUE(growth->staged);

  JobActions actions = StageGrowth(w.run, "job-000001", *growth, w.agents, "127.0.0.1:1", kNow);
  ASSERT_EQ(actions.messages.size(), 2u);  // one launch per agent: hb and hc
  for (const auto& [agent, message] : actions.messages) {
    EXPECT_EQ(message.launch().generation(), 2) << agent;
    EXPECT_EQ(message.launch().ranks_size(), 1) << agent;
  }
  EXPECT_TRUE(w.agents.FreeSlots().empty() || w.agents.FreeSlots()[0].free_slots.empty());
  EXPECT_TRUE(w.run.staged().active());
  EXPECT_EQ(w.run.staged().generation(), 2);
  ASSERT_EQ(actions.events.size(), 1u);
  EXPECT_EQ(actions.events[0],
            "generation 2 after 2 newcomer(s) replace the rank(s) lost in generation 0: starting "
            "rank 3 on hb slot 1, rank 4 on hc slot 0; the job re-forms at a step boundary once "
            "they are up");

  // Its newcomers: one exited (its slot is free), one dropped (stopped;
  // its slot busy until it exits).
  StagedGrowth::Actions staged;
  staged.freed.emplace_back(w.hc, 0);
  staged.stop[w.hb] = {1};
  staged.stop_reason = "not up within elastic.wait_seconds 60 s";
  actions = ApplyStaged(w.run, "job-000001", staged, w.agents);
  EXPECT_FALSE(w.agents.Find(w.hc)->busy[0]);
  EXPECT_TRUE(w.agents.Find(w.hb)->busy[1]);
  EXPECT_EQ(w.run.leaving().size(), 1u);
  ASSERT_EQ(actions.messages.size(), 1u);
  EXPECT_EQ(actions.messages[0].first, w.hb);
  EXPECT_EQ(actions.messages[0].second.stop().reason(), "not up within elastic.wait_seconds 60 s");
  EXPECT_TRUE(actions.events.empty());
  EXPECT_EQ(actions.logs.size(), 2u);
}

// A planned change's size: ranks on a draining agent leave, free slots
// are taken up to max_ranks.
TEST(GenerationChangeTest, APlannedChangesWorldCountsLeaversAndNewcomers) {
  World w;
  const QueuedJob capped = ToQueuedJob(w.job.job_id(), w.job.spec());  // max_ranks 3
  EXPECT_EQ(PlannedWorld(w.run, w.agents, {}, capped), 3);
  w.agents.SetDraining(w.ha);                                                 // ranks 0 and 1 leave
  EXPECT_EQ(PlannedWorld(w.run, w.agents, {}, capped), std::nullopt);         // below min_ranks 2
  EXPECT_EQ(PlannedWorld(w.run, w.agents, w.agents.FreeSlots(), capped), 3);  // hb:1 and hc:0
}

}  // namespace
}  // namespace chorus
