#include "coordinator/scheduling/job_recovery.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "coordinator/scheduling/running_job_test_peer.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

// A job that ran two ranks on node-a's agent (pid 77), slots 0 and 1, in
// generation 1.
v1::Job RunningOnNodeA() {
  v1::Job job;
  job.set_job_id("job-000001");
  job.set_state(v1::Job::RUNNING);
  job.set_generation(1);
  for (int slot = 0; slot < 2; ++slot) {
    v1::RankPlacement* p = job.add_placements();
    p->set_host("node-a");
    p->set_agent_pid(77);
    p->set_slot(slot);
    p->set_local_rank(slot);
    p->set_local_world_size(2);
  }
  return job;
}

v1::AgentHello NodeA(std::vector<std::pair<std::string, int>> running) {
  v1::AgentHello hello;
  hello.set_host("node-a");
  hello.set_pid(77);
  hello.set_slots(2);
  for (const auto& [job_id, slot] : running) {
    v1::RunningRank* r = hello.add_running();
    r->set_job_id(job_id);
    r->set_generation(1);
    r->set_slot(slot);
    r->set_pid(1000 + slot);
  }
  return hello;
}

// Uploads cut by the restart are retried by the ranks: the recovered job
// must grant them as the job did before (CheckUploader is what OpenUpload,
// Upload and Commit check), from its first moment, before any rank is back.
TEST(JobRecoveryTest, RecoveredJobGrantsCheckpointUploadsAsBeforeTheRestart) {
  v1::Job job = RunningOnNodeA();
  job.mutable_spec()->mutable_checkpoint()->set_every_steps(20);
  job.mutable_spec()->mutable_checkpoint()->set_keep_last(5);
  const UploadGrant before = UploadGrantFor(job, /*world_size=*/2, /*generation=*/1);
  const RunningJob run = RecoveredJob(job, absl::FromUnixSeconds(1030));
  absl::StatusOr<UploadGrant> granted = CheckUploader(run.upload_grant(), 1, 0);
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_EQ(granted->manifest.SerializeAsString(), before.manifest.SerializeAsString());
  EXPECT_EQ(granted->manifest.generation(), 1);
  EXPECT_EQ(granted->manifest.world_size(), 2);
  EXPECT_EQ(granted->keep_last, 5);
  EXPECT_EQ(CheckUploader(run.upload_grant(), 1, 1).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "still only rank 0 uploads";
  EXPECT_EQ(CheckUploader(run.upload_grant(), 0, 0).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "an older generation still may not";
}

TEST(JobRecoveryTest, RecoveredJobWaitsWithEveryRankLostAndJoined) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  const RunningJob run = RecoveredJob(RunningOnNodeA(), clock.Now() + absl::Seconds(30));
  ASSERT_EQ(run.ranks().size(), 2u);
  EXPECT_EQ(run.generation(), 1);
  EXPECT_EQ(run.recovering_until(), clock.Now() + absl::Seconds(30));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(run.ranks()[r].state, v1::RankStatus::LOST);
    EXPECT_TRUE(run.ranks()[r].agent_id.empty());
    EXPECT_EQ(run.ranks()[r].recover_host, "node-a");
    EXPECT_EQ(run.ranks()[r].slot, r);
    EXPECT_TRUE(run.rendezvous().joined(r));
  }
}

TEST(JobRecoveryTest, ReconnectingAgentGetsItsRanksBackAndStopsOrphans) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  std::map<std::string, RunningJob> running;
  running.emplace("job-000001", RecoveredJob(RunningOnNodeA(), clock.Now() + absl::Seconds(30)));
  std::vector<std::pair<std::string, int>> bound;
  const std::map<std::string, std::vector<int>> orphans =
      RebindRanks(running, "agent-3", NodeA({{"job-000001", 1}, {"job-000009", 0}}), &bound);
  ASSERT_EQ(bound.size(), 1u);
  EXPECT_EQ(bound[0], std::make_pair(std::string("job-000001"), 1));
  const RankState& back = RankOf(running.at("job-000001"), 1);
  EXPECT_EQ(back.agent_id, "agent-3");
  EXPECT_EQ(back.pid, 1001);
  EXPECT_EQ(back.state, v1::RankStatus::TRAINING);
  EXPECT_TRUE(running.at("job-000001").ranks()[0].agent_id.empty());
  ASSERT_EQ(orphans.size(), 1u);
  EXPECT_EQ(orphans.at("job-000009"), std::vector<int>{0});
}

// A reconnecting agent's ranks take their slots again and their heartbeat
// clock restarts; a rank a restart-all was stopping is stopped again, and
// ranks no job waits for are stopped.
TEST(JobRecoveryTest, BindingAnAgentsRanksSaysWhatToStop) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  AgentRegistry agents;
  ASSERT_EQ(*agents.Add(NodeA({}), nullptr), "agent-1");
  std::map<std::string, RunningJob> running;
  RunningJob& run =
      running.emplace("job-000001", RecoveredJob(RunningOnNodeA(), now + absl::Seconds(30)))
          .first->second;
  RankOf(run, 0).heartbeat_at = now - absl::Seconds(20);
  run.MarkStopping(1);
  run.mutable_phase().BeginRestarting("rank 2 exited", ReformKind::kRankLost, now,
                                      now + absl::Seconds(60));

  std::map<std::string, JobActions> actions =
      BindAgentRanks(running, agents, "agent-1",
                     NodeA({{"job-000001", 0}, {"job-000001", 1}, {"job-000009", 1}}), now);
  EXPECT_TRUE(agents.Find("agent-1")->busy[0]);
  EXPECT_TRUE(agents.Find("agent-1")->busy[1]);
  EXPECT_EQ(run.ranks()[0].heartbeat_at, now);
  ASSERT_EQ(actions.size(), 2u);
  const JobActions& own = actions.at("job-000001");
  EXPECT_EQ(own.logs,
            (std::vector<std::string>{"slot 0 on node-a is back", "slot 1 on node-a is back"}));
  ASSERT_EQ(own.messages.size(), 1u);  // the rank the restart-all was stopping
  EXPECT_EQ(own.messages[0].first, "agent-1");
  EXPECT_EQ(own.messages[0].second.stop().slots(0), 1);
  EXPECT_EQ(own.messages[0].second.stop().reason(), "rank 2 exited");
  const JobActions& orphan = actions.at("job-000009");
  ASSERT_EQ(orphan.messages.size(), 1u);
  EXPECT_EQ(orphan.messages[0].second.stop().reason(), "the coordinator no longer runs this job");
}

TEST(JobRecoveryTest, AnotherAgentOrGenerationDoesNotBind) {
  std::map<std::string, RunningJob> running;
  running.emplace("job-000001", RecoveredJob(RunningOnNodeA(), absl::InfiniteFuture()));
  v1::AgentHello restarted = NodeA({{"job-000001", 0}});
  restarted.set_pid(78);  // a new agent process on the same host
  std::vector<std::pair<std::string, int>> bound;
  EXPECT_EQ(RebindRanks(running, "agent-4", restarted, &bound).at("job-000001"),
            std::vector<int>{0});
  v1::AgentHello old_generation = NodeA({{"job-000001", 0}});
  old_generation.mutable_running(0)->set_generation(2);
  EXPECT_EQ(RebindRanks(running, "agent-5", old_generation, &bound).size(), 1u);
  EXPECT_TRUE(bound.empty());
}

// Note [Exits told again]: only an exit of a rank still waited for counts.
TEST(JobRecoveryTest, AToldExitCountsOnlyForARankStillWaitedForOnThatAgentAndGeneration) {
  std::map<std::string, RunningJob> running;
  running.emplace("job-000001", RecoveredJob(RunningOnNodeA(), absl::InfiniteFuture()));
  v1::RankExited exited;
  exited.set_job_id("job-000001");
  exited.set_slot(0);
  exited.set_generation(1);
  v1::AgentHello hello = NodeA({{"job-000001", 1}});
  const RunningJob& run = running.at("job-000001");
  EXPECT_TRUE(AwaitsToldExit(run, hello, exited));

  v1::RankExited other_generation = exited;
  other_generation.set_generation(0);  // an older agent's, or an earlier generation's
  EXPECT_FALSE(AwaitsToldExit(run, hello, other_generation));
  v1::AgentHello other_process = hello;
  other_process.set_pid(78);
  EXPECT_FALSE(AwaitsToldExit(run, other_process, exited));
  v1::AgentHello other_host = hello;
  other_host.set_host("node-b");
  EXPECT_FALSE(AwaitsToldExit(run, other_host, exited));
  v1::RankExited other_slot = exited;
  other_slot.set_slot(5);
  EXPECT_FALSE(AwaitsToldExit(run, hello, other_slot));

  // A rank bound again (it is running) is not waited for.
  std::vector<std::pair<std::string, int>> bound;
  RebindRanks(running, "agent-3", hello, &bound);
  v1::RankExited bound_slot = exited;
  bound_slot.set_slot(1);
  EXPECT_FALSE(AwaitsToldExit(run, hello, bound_slot));
  // Nor one whose exit was taken already.
  RankOf(running.at("job-000001"), 0).state = v1::RankStatus::EXITED;
  EXPECT_FALSE(AwaitsToldExit(run, hello, exited));
}

TEST(JobRecoveryTest, CheckRecoveryEndsTheWaitOneWayOrTheOther) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  RunningJob run = RecoveredJob(RunningOnNodeA(), clock.Now() + absl::Seconds(30));
  RecoveryProgress progress = CheckRecovery(run, clock.Now());
  EXPECT_FALSE(progress.all_back);
  EXPECT_EQ(progress.failure, "");
  clock.Advance(absl::Seconds(31));
  progress = CheckRecovery(run, clock.Now());
  EXPECT_EQ(progress.failure, "2 of 2 rank(s) did not come back after the coordinator restarted");

  RunningJob back = RecoveredJob(RunningOnNodeA(), clock.Now() + absl::Seconds(30));
  for (RankState& rank : RanksOf(back)) rank.agent_id = "agent-1";
  progress = CheckRecovery(back, clock.Now());
  EXPECT_TRUE(progress.all_back);
  EXPECT_EQ(back.recovering_until(), absl::InfinitePast());
  progress = CheckRecovery(back, clock.Now());
  EXPECT_FALSE(progress.all_back) << "all back is reported once";
}

// Note [Elastic phase]: every phase, and a planned change beside it, comes
// back from the saved record as it was, its kinds saved by their names.
TEST(JobRecoveryTest, ElasticPhaseComesBackFromItsRecord) {
  v1::Job job = RunningOnNodeA();
  job.mutable_spec()->mutable_elastic()->set_wait_seconds(60);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const ElasticPhase::Forming forming{ReformKind::kAgentLost, t0, t0 + absl::Seconds(60)};
  const ElasticPhase::Planned planned{"agent a2 was drained", ReformKind::kDrain, 1};
  const std::vector<ElasticPhase> phases = {
      ElasticPhase(ElasticPhase::Steady{}, planned),
      ElasticPhase(forming, planned),
      ElasticPhase(ElasticPhase::Waiting{"rank 1 exited", ReformKind::kRankLost, t0,
                                         t0 + absl::Seconds(90), forming}),
      ElasticPhase(ElasticPhase::Waiting{"hang", ReformKind::kHangRestart, t0,
                                         t0 + absl::Seconds(90), std::nullopt},
                   ElasticPhase::Planned{"grow", ReformKind::kScaleUp, std::nullopt}),
      ElasticPhase(
          ElasticPhase::Restarting{"preempted", ReformKind::kPreempt, t0, t0 + absl::Seconds(30)}),
  };
  for (size_t i = 0; i < phases.size(); ++i) {
    SCOPED_TRACE(i);
    RunningJob run(job, /*world_size=*/2, /*generation=*/1);  // not formed
    for (int slot = 0; slot < 2; ++slot) {
      run.AddRank(RankState::At(RankSlot{"agent-1", slot, slot, 2}));
    }
    run.mutable_phase() = phases[i];
    const coordinator::ElasticRecord record = ElasticRecordOf(run, {false, false});
    const ElasticPhase back = RecoveredJob(job, t0, record).phase();
    EXPECT_EQ(back.phase().index(), phases[i].phase().index());
    EXPECT_EQ(back.started(), phases[i].started());
    ASSERT_EQ(back.planned().has_value(), phases[i].planned().has_value());
    if (back.planned().has_value()) {
      EXPECT_EQ(back.planned()->cause, phases[i].planned()->cause);
      EXPECT_EQ(back.planned()->kind, phases[i].planned()->kind);
      EXPECT_EQ(back.planned()->world, phases[i].planned()->world);
    }
    if (const ElasticPhase::Forming* f = back.forming()) {
      EXPECT_EQ(f->kind, forming.kind);
      EXPECT_EQ(f->deadline, forming.deadline);
      EXPECT_EQ(record.forming().kind(), "agent_lost");
    }
    if (const ElasticPhase::Waiting* w = back.waiting()) {
      const ElasticPhase::Waiting& was = *phases[i].waiting();
      EXPECT_EQ(w->cause, was.cause);
      EXPECT_EQ(w->kind, was.kind);
      EXPECT_EQ(w->until, was.until);
      EXPECT_EQ(w->unformed.has_value(), was.unformed.has_value());
      EXPECT_EQ(record.waiting().kind(), ReformKindName(was.kind));
    }
    if (const ElasticPhase::Restarting* r = back.restarting()) {
      EXPECT_EQ(r->cause, "preempted");
      EXPECT_EQ(r->kind, ReformKind::kPreempt);
      EXPECT_EQ(r->deadline, t0 + absl::Seconds(30));
      EXPECT_EQ(record.restart_all().kind(), "preempt");
    }
  }
}

// Note [Agent reconnect grace] in running_job.h: two agents lost, one back.
// The failure names only the agent whose rank is missing, and comes at the
// deadline itself; all back names the agents that reconnected.
TEST(JobRecoveryTest, AWaitForLostAgentsNamesTheAgentWhoseRanksAreMissing) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  v1::Job job = RunningOnNodeA();
  RunningJob run(job, 2, 1);
  for (int rank = 0; rank < 2; ++rank) {
    RankState& r = RanksOf(run).emplace_back();
    r.agent_id = rank == 0 ? "agent-1" : "agent-2";
    r.slot = 0;
    r.state = v1::RankStatus::TRAINING;
  }
  EXPECT_EQ(run.AwaitAgent("agent-1", "node-a", 77), std::vector<int>{0});
  EXPECT_EQ(run.AwaitAgent("agent-2", "node-b", 88), std::vector<int>{1});
  EXPECT_TRUE(run.AwaitingRanks());
  EXPECT_EQ(run.ranks()[1].state, v1::RankStatus::LOST);
  EXPECT_EQ(run.ranks()[1].recover_host, "node-b");
  EXPECT_EQ(run.ranks()[1].recover_agent_pid, 88);
  run.AwaitLostAgent({"agent-1", "node-a", {0}, absl::Seconds(10)}, now + absl::Seconds(10));
  run.AwaitLostAgent({"agent-2", "node-b", {1}, absl::Seconds(10)}, now + absl::Seconds(10));
  RankOf(run, 0).agent_id = "agent-3";  // node-a's agent is back
  EXPECT_EQ(CheckRecovery(run, now + absl::Seconds(9)).failure, "");
  EXPECT_EQ(CheckRecovery(run, now + absl::Seconds(10)).failure,
            "lost contact with the agent on node-b (agent-2), which ran ranks of this job; 1 of 2 "
            "rank(s) did not come back within 10s");

  RankOf(run, 1).agent_id = "agent-4";
  const RecoveryProgress back = CheckRecovery(run, now + absl::Seconds(10));
  EXPECT_TRUE(back.all_back);
  EXPECT_EQ(back.back, "every rank is back: the agents on node-a, node-b reconnected");
  EXPECT_TRUE(run.wait_cause().lost_agents.empty());
}

}  // namespace
}  // namespace chorus
