#include "coordinator/scheduling/agent_departure.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "coordinator/scheduling/running_job_test_peer.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1000);

v1::AgentHello HelloOf(const std::string& host, int64_t pid) {
  v1::AgentHello hello;
  hello.set_host(host);
  hello.set_pid(pid);
  hello.set_slots(2);
  return hello;
}

// Ranks 0 and 1 on agent-1 (node-a, pid 11), rank 2 on agent-2.
RunningJob RunOf(bool elastic) {
  v1::Job job;
  job.set_job_id("job-000001");
  if (elastic) job.mutable_spec()->mutable_elastic();
  RunningJob run(job, 3, /*generation=*/1);
  run.AddRank(RankState::At({"agent-1", 0, 0, 2}));
  run.AddRank(RankState::At({"agent-1", 1, 1, 2}));
  run.AddRank(RankState::At({"agent-2", 0, 0, 1}));
  return run;
}

// Each row: the job, the reconnect grace, whether the agent is back
// already, and what the job does; for a wait, how long.
TEST(AgentDepartureTest, WhatAJobDoesWhenAnAgentIsGone) {
  struct Row {
    const char* name;
    bool elastic;
    absl::Duration grace;
    bool rebinding;
    bool exited;  // both ranks on agent-1 had exited
    AgentLoss::Kind kind;
    const char* text;
    std::optional<absl::Duration> waits;
  };
  const Row rows[] = {
      {"not elastic, waits the grace", false, absl::Seconds(10), false, false,
       AgentLoss::Kind::kAwait,
       "lost contact with the agent on node-a (agent-1), which ran rank(s) 0,1; waiting up to 10s",
       absl::Seconds(10)},
      {"not elastic, no grace: fails", false, absl::ZeroDuration(), false, false,
       AgentLoss::Kind::kFail, "lost contact with the agent on node-a (agent-1), which ran ranks",
       std::nullopt},
      {"elastic, waits kElasticAgentGrace at most", true, absl::Seconds(10), false, false,
       AgentLoss::Kind::kAwait, "waiting up to 5s", absl::Seconds(5)},
      {"elastic, a shorter grace", true, absl::Seconds(2), false, false, AgentLoss::Kind::kAwait,
       "waiting up to 2s", absl::Seconds(2)},
      {"elastic, no grace: re-forms at once", true, absl::ZeroDuration(), false, false,
       AgentLoss::Kind::kReform,
       "lost contact with the agent on node-a (agent-1), which ran rank(s) 0,1", std::nullopt},
      {"elastic, the agent is back already", true, absl::Seconds(10), true, false,
       AgentLoss::Kind::kRebind, "", std::nullopt},
      {"its ranks there had exited", true, absl::Seconds(10), false, true, AgentLoss::Kind::kNone,
       "", std::nullopt},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    RunningJob run = RunOf(row.elastic);
    if (row.exited) {
      RankOf(run, 0).state = v1::RankStatus::EXITED;
      RankOf(run, 1).state = v1::RankStatus::EXITED;
    }
    const AgentLoss loss =
        OnAgentLost(run, "agent-1", HelloOf("node-a", 11), row.grace, row.rebinding, kNow);
    EXPECT_EQ(loss.kind, row.kind);
    EXPECT_TRUE(absl::StrContains(loss.text, row.text)) << loss.text;
    if (row.waits.has_value()) {
      EXPECT_EQ(run.recovering_until(), kNow + *row.waits);
      ASSERT_EQ(run.wait_cause().lost_agents.size(), 1u);
      EXPECT_EQ(run.wait_cause().lost_agents[0].ranks, (std::vector<int>{0, 1}));
    } else {
      EXPECT_EQ(run.recovering_until(), absl::InfinitePast());
      EXPECT_TRUE(run.wait_cause().lost_agents.empty());
    }
    const bool unbound =
        row.kind == AgentLoss::Kind::kAwait || row.kind == AgentLoss::Kind::kRebind;
    EXPECT_EQ(run.ranks()[0].agent_id.empty(), unbound);
    EXPECT_EQ(run.ranks()[2].agent_id, "agent-2");  // another agent's rank stays
  }
}

// A job already waiting keeps the later deadline.
TEST(AgentDepartureTest, ASecondLostAgentKeepsTheLaterDeadline) {
  RunningJob run = RunOf(/*elastic=*/false);
  OnAgentLost(run, "agent-1", HelloOf("node-a", 11), absl::Seconds(10), false, kNow);
  OnAgentLost(run, "agent-2", HelloOf("node-b", 12), absl::Seconds(10), false,
              kNow - absl::Seconds(3));
  EXPECT_EQ(run.recovering_until(), kNow + absl::Seconds(10));
  EXPECT_EQ(run.wait_cause().lost_agents.size(), 2u);
}

// Note [An elastic job's lost agent]: not back in time, the agent's ranks
// are lost on it and the cause names it, its ranks and its grace.
TEST(AgentDepartureTest, AnAgentNotBackInTimeLosesItsRanks) {
  RunningJob run = RunOf(/*elastic=*/true);
  OnAgentLost(run, "agent-1", HelloOf("node-a", 11), absl::Seconds(10), false, kNow);
  RankOf(run, 1).agent_id = "agent-3";  // rank 1 was rebound meanwhile
  const std::string cause = GiveUpLostAgents(run);
  EXPECT_EQ(cause,
            "lost contact with the agent on node-a (agent-1), which ran rank(s) 0, and it was not "
            "back within 5s");
  EXPECT_EQ(run.ranks()[0].agent_id, "agent-1");
  EXPECT_EQ(run.ranks()[1].agent_id, "agent-3");
  EXPECT_EQ(run.recovering_until(), absl::InfinitePast());
  EXPECT_TRUE(run.wait_cause().lost_agents.empty());
}

// Note [An agent back before its stream ended]: the agent's new hello
// rebound rank 0 only; rank 1 is lost on the new registration.
TEST(AgentDepartureTest, RanksTheReconnectedAgentDidNotBringBackAreLost) {
  RunningJob run = RunOf(/*elastic=*/true);
  ASSERT_EQ(OnAgentLost(run, "agent-1", HelloOf("node-a", 11), absl::Seconds(10), true, kNow).kind,
            AgentLoss::Kind::kRebind);
  v1::AgentHello again = HelloOf("node-a", 11);
  again.set_agent_id("agent-3");
  RankOf(run, 0).agent_id = "agent-3";
  RankOf(run, 0).state = v1::RankStatus::TRAINING;
  EXPECT_EQ(GiveUpUnbound(run, again), "the agent on node-a connected again without rank(s) 1");
  EXPECT_EQ(run.ranks()[1].agent_id, "agent-3");
  EXPECT_EQ(GiveUpUnbound(run, again), "");  // nothing left unbound
  // Another process on the same host does not claim them.
  RunningJob other = RunOf(/*elastic=*/true);
  OnAgentLost(other, "agent-1", HelloOf("node-a", 11), absl::Seconds(10), true, kNow);
  EXPECT_EQ(GiveUpUnbound(other, HelloOf("node-a", 99)), "");
}

TEST(AgentDepartureTest, ADrainedAgentsRanksLeaveAnElasticJobAndStayInAnyOther) {
  RunningJob elastic = RunOf(/*elastic=*/true);
  RankOf(elastic, 1).state = v1::RankStatus::EXITED;
  AgentDrain drain = OnAgentDrained(elastic, "agent-1", "agent agent-1 (node-a)");
  EXPECT_EQ(drain.kind, AgentDrain::Kind::kReform);
  EXPECT_EQ(drain.text, "agent agent-1 (node-a) was drained: rank(s) 0 leave");

  RunningJob fixed = RunOf(/*elastic=*/false);
  drain = OnAgentDrained(fixed, "agent-1", "agent agent-1 (node-a)");
  EXPECT_EQ(drain.kind, AgentDrain::Kind::kStays);
  EXPECT_EQ(drain.text,
            "agent agent-1 (node-a) is draining; the job is not elastic: rank(s) 0,1 keep running "
            "there until the job ends");

  EXPECT_EQ(OnAgentDrained(fixed, "agent-9", "agent agent-9 (node-z)").kind,
            AgentDrain::Kind::kNone);
}

}  // namespace
}  // namespace chorus
