#include "coordinator/scheduling/cluster_state.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/job_spec.h"
#include "coordinator/scheduling/running_job_test_peer.h"
#include "coordinator/state/state_store.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

v1::AgentHello Hello(const std::string& host, int slots) {
  v1::AgentHello hello;
  hello.set_host(host);
  hello.set_slots(slots);
  hello.set_device(v1::ResourceSpec::CPU);
  return hello;
}

// Checkpoints whose newest committed step is `step`, for every job.
JobResume Newest(int64_t step) {
  return JobResume(
      [step](const std::string& job_id,
             std::vector<std::string>*) -> absl::StatusOr<v1::CheckpointManifest> {
        v1::CheckpointManifest manifest;
        manifest.set_job_id(job_id);
        manifest.set_step(step);
        return manifest;
      },
      nullptr);
}

// The queries the Scheduler makes of its state, on states filled by hand.
// The analysis of the lock is off: one thread, no lock needed.
class ClusterStateTest : public ::testing::Test {
 protected:
  ClusterStateTest() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    EXPECT_EQ(*state_.agents.Add(Hello("node-a", 4), nullptr), "agent-1");
  }

  // A job of `owner` running `ranks` ranks on agent-1 from `first_slot` on;
  // `elastic`; `formed`: every rank has joined its generation.
  RunningJob& Run(const std::string& job_id, const std::string& owner, int ranks, int first_slot,
                  bool elastic, bool formed = true, bool preemptible = false,
                  bool program = false) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    v1::Job job;
    job.set_job_id(job_id);
    job.set_owner(owner);
    job.mutable_spec()->mutable_resources()->set_min_ranks(1);
    job.mutable_spec()->mutable_resources()->set_device(v1::ResourceSpec::CPU);
    if (elastic) job.mutable_spec()->mutable_elastic();
    job.mutable_spec()->mutable_resources()->set_preemptible(preemptible);
    if (program) job.mutable_spec()->mutable_program()->add_argv("/usr/bin/python3");
    RunningJob run(job, ranks, /*generation=*/1);
    for (int r = 0; r < ranks; ++r) {
      run.AddRank(RankState::At({"agent-1", first_slot + r, r, ranks}));
      state_.agents.SetBusy("agent-1", first_slot + r, true);
    }
    Rendezvous::Answers answers;
    for (int r = 0; formed && r < ranks; ++r) {
      run.mutable_rendezvous().Join(
          r, kStart + absl::Seconds(10), [](absl::StatusOr<v1::JoinResponse>) {},
          [](int) { return v1::JoinResponse(); }, answers);
    }
    return state_.running.emplace(job_id, std::move(run)).first->second;
  }

  ClusterState state_{SchedulingPolicy(), kStart};
};

TEST_F(ClusterStateTest, UnreservedSlotsLeaveOutWhatTheQueuesReservationHolds)
ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Run("job-000001", "ann", 1, /*first_slot=*/0, /*elastic=*/true);
  state_.plan.reserved["agent-1"] = {2};
  const std::vector<AgentSlots> free = state_.UnreservedSlots();
  ASSERT_EQ(free.size(), 1u);
  EXPECT_EQ(free[0].free_slots, (std::vector<int>{1, 3}));
}

// A growth is capped by the owner's quota on the device, counting the
// owner's other jobs; never below what the job runs with or min_ranks.
TEST_F(ClusterStateTest, AQuotaCapsARunningJobsGrowth) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  RunningJob& run = Run("job-000001", "ann", 2, 0, /*elastic=*/true);
  Run("job-000002", "ann", 1, 2, /*elastic=*/false);
  Run("job-000003", "bob", 1, 3, /*elastic=*/false);
  v1::JobSpec spec;
  spec.mutable_resources()->set_min_ranks(1);
  spec.mutable_resources()->set_max_ranks(8);
  struct Row {
    const char* name;
    std::optional<int> quota;
    int max_ranks;
  };
  const Row rows[] = {
      {"no quota", std::nullopt, 8},
      {"a quota of 5 less ann's other rank", 5, 4},
      {"a quota below what it runs with", 2, 2},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    state_.policy.users["ann"].max_slots.clear();
    if (row.quota) state_.policy.users["ann"].max_slots[v1::ResourceSpec::CPU] = *row.quota;
    EXPECT_EQ(state_.QuotaCapped("job-000001", spec, run).resources.max_ranks(), row.max_ranks);
  }
}

// Preemption may shrink steady elastic jobs with no rank leaving, and
// re-queue steady jobs that are not elastic and not already on their way.
TEST_F(ClusterStateTest, WhichRunningJobsMayBePreempted) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Run("job-000001", "ann", 1, 0, /*elastic=*/true);
  Run("job-000002", "ann", 1, 1, /*elastic=*/true, /*formed=*/false);
  RunningJob& leaving = Run("job-000003", "ann", 1, 2, /*elastic=*/true);
  leaving.mutable_leaving().Yield("agent-1", 2);
  RunningJob& fixed = Run("job-000004", "bob", 1, 3, /*elastic=*/false, /*formed=*/true,
                          /*preemptible=*/true);

  const std::vector<ElasticRun> shrinkable = state_.Preemptible();
  ASSERT_EQ(shrinkable.size(), 1u);
  EXPECT_EQ(shrinkable[0].job_id, "job-000001");
  EXPECT_EQ(shrinkable[0].ranks.size(), 1u);

  std::vector<RequeueRun> requeueable = state_.Requeueable();
  ASSERT_EQ(requeueable.size(), 1u);
  EXPECT_EQ(requeueable[0].job_id, "job-000004");
  EXPECT_TRUE(requeueable[0].preemptible);
  EXPECT_TRUE(requeueable[0].checkpointable);  // the built-in trainer
  fixed.mutable_requeue().Begin("preempted", 0, 0, kStart, absl::Seconds(60));
  EXPECT_TRUE(state_.Requeueable().empty());
}

// What a reservation holder short of slots still needs is its min_ranks
// less the slots already on their way to it: reserved, leaving, held by a
// job checkpointing to be re-queued, or of a re-queued job's ranks that
// have not exited. A slot of another device does not count.
TEST_F(ClusterStateTest, SlotsComingToAWaitingJob) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  v1::AgentHello gpu = Hello("node-b", 2);
  gpu.set_device(v1::ResourceSpec::CUDA);
  ASSERT_EQ(*state_.agents.Add(gpu, nullptr), "agent-2");
  EXPECT_EQ(state_.SlotsComing(v1::ResourceSpec::CPU), 0);

  state_.plan.reserved["agent-1"] = {3};
  state_.plan.reserved["agent-2"] = {0, 1};
  EXPECT_EQ(state_.SlotsComing(v1::ResourceSpec::CPU), 1);
  EXPECT_EQ(state_.SlotsComing(v1::ResourceSpec::CUDA), 2);

  RunningJob& shrinking = Run("job-000001", "ann", 1, 0, /*elastic=*/true);
  shrinking.mutable_leaving().Yield("agent-1", 0);
  RunningJob& checkpointing = Run("job-000002", "bob", 2, 1, /*elastic=*/false);
  checkpointing.mutable_requeue().Begin("preempted", 0, 0, kStart, absl::Seconds(60));
  EXPECT_EQ(state_.SlotsComing(v1::ResourceSpec::CPU), 1 + 1 + 2);

  // Re-queued: its ranks were told to stop and their slots stay busy; their
  // exits free them, once, and only for that job.
  state_.running.erase("job-000002");
  state_.StopForRequeue("job-000002", {{"agent-1", {1, 2}}});
  EXPECT_EQ(state_.SlotsComing(v1::ResourceSpec::CPU), 1 + 1 + 2);
  EXPECT_TRUE(state_.agents.Find("agent-1")->busy[1]);
  EXPECT_FALSE(state_.StoppedRankExited("agent-1", 1, "job-000009"));
  EXPECT_TRUE(state_.StoppedRankExited("agent-1", 1, "job-000002"));
  EXPECT_FALSE(state_.agents.Find("agent-1")->busy[1]);
  EXPECT_FALSE(state_.StoppedRankExited("agent-1", 1, "job-000002"));
  EXPECT_EQ(state_.SlotsComing(v1::ResourceSpec::CPU), 1 + 1 + 1);

  // Its agent gone, the other stopping slot is gone with it.
  state_.RemoveAgent("agent-1");
  EXPECT_TRUE(state_.stopping.empty());
  EXPECT_EQ(state_.agents.Find("agent-1"), nullptr);
}

// A HIGH job holding the reservation for 3 CPU slots takes them from NORMAL
// jobs: a rank of an elastic job (down to its min_ranks), then whole jobs:
// a preemptible program at once, a checkpointable one after its checkpoint.
TEST_F(ClusterStateTest, AReservationHolderPreemptsLowerPriorityJobs)
ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Run("job-000001", "ann", 2, 0, /*elastic=*/true);
  RunningJob& trainer = Run("job-000002", "bob", 1, 2, /*elastic=*/false);
  RankOf(trainer, 0).last_heartbeat.set_step(120);
  Run("job-000003", "cy", 1, 3, /*elastic=*/false, /*formed=*/true, /*preemptible=*/true,
      /*program=*/true);
  QueueEntry holder;
  holder.job.job_id = "job-000009";
  holder.job.resources.set_min_ranks(3);
  holder.job.resources.set_max_ranks(3);
  holder.job.resources.set_device(v1::ResourceSpec::CPU);
  holder.owner = "dee";
  holder.priority = v1::JobSpec::HIGH;
  state_.queue_entries["job-000009"] = holder;
  state_.plan.reservation_holders[v1::ResourceSpec::CPU] = "job-000009";

  const PreemptionOrders orders = state_.Preempt(kStart, Newest(100), absl::Seconds(60));
  std::vector<std::string> events;
  for (const auto& [job_id, text] : orders.events) events.push_back(job_id + ": " + text);
  EXPECT_EQ(events,
            (std::vector<std::string>{
                "job-000009: preempting rank(s) 1 of job-000001 (priority NORMAL) at its next "
                "step boundary to make room for this job",
                "job-000009: preempting job-000003 (priority NORMAL): it goes back to the queue "
                "to make room for this job",
                "job-000009: preempting job-000002 (priority NORMAL): it goes back to the queue "
                "to make room for this job",
                "job-000002: preempted by job-000009 (HIGH, dee): checkpointing at the next step "
                "boundary (step 120 or later), then back to the queue"}));
  ASSERT_EQ(orders.shrink.size(), 1u);
  EXPECT_EQ(orders.shrink[0].first, "job-000001");
  EXPECT_EQ(orders.shrink[0].second,
            "job-000009 (priority HIGH, dee) preempted rank(s) 1 of this NORMAL job: they leave, "
            "nothing is lost");
  EXPECT_EQ(state_.running.at("job-000001").leaving().size(), 1u);
  EXPECT_TRUE(state_.running.at("job-000002").requeue().active());
  ASSERT_EQ(orders.requeue.size(), 1u);
  EXPECT_EQ(orders.requeue[0].first, "job-000003");
  EXPECT_EQ(orders.requeue[0].second,
            "preempted by job-000009 (HIGH, dee); starts again from scratch "
            "(resources.preemptible)");

  // What is on its way now counts (the program re-queued as the Scheduler
  // does it): nothing more is taken.
  state_.running.erase("job-000003");
  state_.StopForRequeue("job-000003", {{"agent-1", {3}}});
  const PreemptionOrders again = state_.Preempt(kStart, Newest(100), absl::Seconds(60));
  EXPECT_TRUE(again.events.empty());

  // The checkpointing job goes back to the queue once step 120 commits, or
  // when its wait is over without it.
  EXPECT_TRUE(state_.RequeuesDue(kStart + absl::Seconds(30), Newest(100)).empty());
  auto due = state_.RequeuesDue(kStart + absl::Seconds(30), Newest(120));
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].first, "job-000002");
  EXPECT_EQ(due[0].second.resume_step, 120);
  EXPECT_FALSE(due[0].second.warning.has_value());
}

// A job waiting below min_ranks tries again on every pass, but one still
// awaiting a rank after a restart waits for it until its wait is over.
TEST_F(ClusterStateTest, WaitingJobsRetryUnlessStillAwaitingRanks) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Run("job-000001", "ann", 1, 0, /*elastic=*/true);  // steady
  RunningJob& waiting = Run("job-000002", "ann", 1, 1, /*elastic=*/true);
  waiting.mutable_phase().BeginWaiting("rank 1 exited", ReformKind::kRankLost, kStart,
                                       kStart + absl::Seconds(60));
  RunningJob& recovered = Run("job-000003", "bob", 2, 2, /*elastic=*/true);
  recovered.mutable_phase().BeginWaiting("the coordinator restarted", ReformKind::kRankLost, kStart,
                                         kStart + absl::Seconds(60));
  RankOf(recovered, 1).agent_id.clear();  // not back yet
  EXPECT_EQ(state_.RetryableWaits(kStart), std::vector<std::string>{"job-000002"});
  EXPECT_EQ(state_.RetryableWaits(kStart + absl::Seconds(60)),
            (std::vector<std::string>{"job-000002", "job-000003"}));
}

// A drained agent takes no new ranks; an elastic job with ranks there
// re-forms without them, any other keeps them there.
TEST_F(ClusterStateTest, ADrainSaysWhatEachJobDoes) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Run("job-000001", "ann", 2, 0, /*elastic=*/true);
  Run("job-000002", "bob", 1, 2, /*elastic=*/false);
  EXPECT_EQ(state_.JobsOn("agent-1"), (std::vector<std::string>{"job-000001", "job-000002"}));
  EXPECT_TRUE(state_.JobsOn("agent-2").empty());
  std::vector<std::pair<std::string, AgentDrain>> drained = state_.Drain("agent-1");
  EXPECT_TRUE(state_.agents.Find("agent-1")->draining);
  EXPECT_EQ(state_.agents.free_slots(), 0);
  ASSERT_EQ(drained.size(), 2u);
  EXPECT_EQ(drained[0].first, "job-000001");
  EXPECT_EQ(drained[0].second.kind, AgentDrain::Kind::kReform);
  EXPECT_NE(drained[0].second.text.find("agent agent-1 (node-a)"), std::string::npos)
      << drained[0].second.text;
  EXPECT_EQ(drained[1].second.kind, AgentDrain::Kind::kStays);
  EXPECT_TRUE(state_.Drain("agent-9").empty());
}

TEST_F(ClusterStateTest, FairShareCountsEachOwnersSlotSeconds) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Run("job-000001", "ann", 2, 0, /*elastic=*/false);
  Run("job-000002", "ann", 1, 2, /*elastic=*/false);
  Run("job-000003", "bob", 1, 3, /*elastic=*/false);
  state_.AdvanceFairShare(kStart + absl::Seconds(10));
  const QueueUsage usage = state_.Usage();
  // 3 and 1 slots for 10 s, decayed by 10 s of a 1 h half-life.
  EXPECT_NEAR(usage.fair_share.at("ann"), 30, 0.1);
  EXPECT_NEAR(usage.fair_share.at("bob"), 10, 0.1);
  EXPECT_EQ((usage.slots_in_use.at("ann").at(v1::ResourceSpec::CPU)), 3);
}

// The queue as the plan sees it: PENDING jobs in submit order, less the
// ones started here or whose start or end is being written.
TEST_F(ClusterStateTest, TheQueueLeavesOutJobsStartedOrSettling) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/queue";
  std::unique_ptr<StateStore> store = *StateStore::Open(dir);
  FakeClock clock(kStart);
  std::unique_ptr<JobManager> jobs = *JobManager::Create(*store, &clock);
  std::vector<std::string> ids;
  for (const char* owner : {"ann", "bob", "cy", "dee"}) {
    auto spec = ParseJobSpec("model { mlp {} } data { synthetic {} } resources { max_ranks: 2 }",
                             SpecFormat::kTextProto, "test");
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto job = jobs->Submit(*spec, "", owner);
    ASSERT_TRUE(job.ok()) << job.status();
    ids.push_back(job->job_id());
  }
  Run(ids[1], "bob", 1, 0, /*elastic=*/false);  // started here; the store still says PENDING
  state_.Settle(ids[2]);                        // its end is being written

  std::vector<QueueEntry> queued = state_.RefreshQueue(*jobs);
  ASSERT_EQ(queued.size(), 2u);
  EXPECT_EQ(queued[0].job.job_id, ids[0]);
  EXPECT_EQ(queued[0].owner, "ann");
  EXPECT_EQ(queued[0].job.resources.max_ranks(), 2);
  EXPECT_EQ(queued[1].job.job_id, ids[3]);
  EXPECT_EQ(queued[1].owner, "dee");
  EXPECT_EQ(state_.queue_entries.size(), 2u);

  // Once written, the settled job is queued again, in its place.
  state_.Settled(ids[2]);
  queued = state_.RefreshQueue(*jobs);
  ASSERT_EQ(queued.size(), 3u);
  EXPECT_EQ(queued[1].job.job_id, ids[2]);
  EXPECT_EQ(queued[1].owner, "cy");
}

}  // namespace
}  // namespace chorus
