#include "coordinator/scheduling/cluster_reads.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/job_spec.h"
#include "coordinator/scheduling/placement.h"
#include "coordinator/state/state_store.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

v1::AgentHello Hello(const std::string& host, int slots) {
  v1::AgentHello hello;
  hello.set_host(host);
  hello.set_slots(slots);
  return hello;
}

// A ClusterState filled by hand (as the Scheduler would leave it) and the
// reads of it, over a real job store.
class ClusterReadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/reads_" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    store_ = *StateStore::Open(dir);
    jobs_ = *JobManager::Create(*store_, &clock_);
    reads_ = std::make_unique<ClusterReads>(state_, *jobs_, logs_, &clock_);
  }

  v1::Job Submit(int ranks, const std::string& owner) {
    auto spec = ParseJobSpec(absl::StrCat("model { mlp {} } data { synthetic {} } resources { "
                                          "max_ranks: ",
                                          ranks, " }"),
                             SpecFormat::kTextProto, "test");
    EXPECT_TRUE(spec.ok()) << spec.status();
    auto job = jobs_->Submit(*spec, "", owner);
    EXPECT_TRUE(job.ok()) << job.status();
    return *job;
  }

  // `job` runs with one rank on each of `slots` (agent, slot).
  void Run(const v1::Job& job,
           const std::vector<std::pair<std::string, int>>& slots) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    RunningJob run(job, static_cast<int>(slots.size()), /*generation=*/1);
    for (const auto& [agent, slot] : slots) {
      run.AddRank(RankState::At({agent, slot, 0, 1}));
      state_.agents.SetBusy(agent, slot, true);
    }
    state_.running.emplace(job.job_id(), std::move(run));
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<JobManager> jobs_;
  LogStore logs_;
  ClusterState state_{SchedulingPolicy(), clock_.Now()};
  std::unique_ptr<ClusterReads> reads_;
};

// An agent's state follows from draining and its busy slots, and lists the
// jobs with ranks on it; the free slots are every agent's.
TEST_F(ClusterReadsTest, AgentsShowTheirSlotsStateAndJobs) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  ASSERT_EQ(*state_.agents.Add(Hello("node-a", 2), nullptr), "agent-1");
  ASSERT_EQ(*state_.agents.Add(Hello("node-b", 2), nullptr), "agent-2");
  ASSERT_EQ(*state_.agents.Add(Hello("node-c", 1), nullptr), "agent-3");
  Run(Submit(2, "ann"), {{"agent-1", 0}, {"agent-2", 1}});
  state_.agents.SetDraining("agent-2");
  state_.agents.SetDraining("agent-3");

  const std::vector<v1::AgentInfo> agents = reads_->ListAgents();
  ASSERT_EQ(agents.size(), 3u);
  struct Want {
    const char* id;
    const char* host;
    int busy;
    v1::AgentInfo::State state;
    int jobs;
  };
  const Want want[] = {{"agent-1", "node-a", 1, v1::AgentInfo::ACTIVE, 1},
                       {"agent-2", "node-b", 1, v1::AgentInfo::DRAINING, 1},
                       {"agent-3", "node-c", 0, v1::AgentInfo::DRAINED, 0}};
  for (size_t i = 0; i < agents.size(); ++i) {
    SCOPED_TRACE(want[i].id);
    EXPECT_EQ(agents[i].agent_id(), want[i].id);
    EXPECT_EQ(agents[i].host(), want[i].host);
    EXPECT_EQ(agents[i].busy_slots(), want[i].busy);
    EXPECT_EQ(agents[i].state(), want[i].state);
    EXPECT_EQ(agents[i].jobs_size(), want[i].jobs);
  }
  // Draining agents offer no slot: agent-1's second one is the only free.
  EXPECT_EQ(reads_->free_slots(), 1);
}

// The queue lists PENDING jobs in the last plan's order with its reasons;
// a job submitted since goes last, with the reason placement would give.
TEST_F(ClusterReadsTest, TheQueueFollowsTheLastPlanThenTheSubmitOrder)
ABSL_NO_THREAD_SAFETY_ANALYSIS {
  ASSERT_TRUE(state_.agents.Add(Hello("node-a", 1), nullptr).ok());
  const v1::Job first = Submit(4, "ann");
  const v1::Job second = Submit(2, "bob");
  const v1::Job later = Submit(3, "cy");
  state_.plan.order = {second.job_id(), first.job_id()};
  state_.plan.waiting = {{second.job_id(), "waits for 2 slots", WaitClass::kFreeSlots},
                         {first.job_id(), "waits behind the reservation", WaitClass::kFreeSlots}};
  state_.plan.reservation_holders[v1::ResourceSpec::CPU] = second.job_id();

  const v1::GetQueueResponse queue = reads_->Queue();
  ASSERT_EQ(queue.jobs_size(), 3);
  EXPECT_EQ(queue.jobs(0).job_id(), second.job_id());
  EXPECT_EQ(queue.jobs(0).owner(), "bob");
  EXPECT_EQ(queue.jobs(0).reason(), "waits for 2 slots");
  EXPECT_TRUE(queue.jobs(0).holds_reservation());
  EXPECT_EQ(queue.jobs(1).job_id(), first.job_id());
  EXPECT_FALSE(queue.jobs(1).holds_reservation());
  EXPECT_EQ(queue.jobs(2).job_id(), later.job_id());
  EXPECT_EQ(queue.jobs(2).reason(),
            PendingReason(ToQueuedJob(later.job_id(), later.spec()), state_.agents.FreeSlots()));
}

// A PENDING job's status says why it waits, after why it was sent back to
// the queue; a running job's status has a row per rank.
TEST_F(ClusterReadsTest, StatusSaysWhyAJobWaitsOrWhereItsRanksRun) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  ASSERT_TRUE(state_.agents.Add(Hello("node-a", 2), nullptr).ok());
  const v1::Job waiting = Submit(4, "ann");
  state_.plan.waiting = {{waiting.job_id(), "waits for 4 slots", WaitClass::kFreeSlots}};
  v1::JobStatus status;
  *status.mutable_job() = waiting;
  status.mutable_job()->set_reason("preempted by job-000009");
  reads_->FillStatus(waiting.job_id(), status);
  EXPECT_EQ(status.pending_reason(), "preempted by job-000009; waits for 4 slots");

  const v1::Job running = Submit(2, "bob");
  Run(running, {{"agent-1", 0}, {"agent-1", 1}});
  v1::JobStatus run_status;
  *run_status.mutable_job() = running;
  reads_->FillStatus(running.job_id(), run_status);
  EXPECT_EQ(run_status.pending_reason(), "");
  EXPECT_EQ(run_status.ranks_size(), 2);
}

// /metrics' snapshot: slots by device, running jobs per user, and the queue
// by wait class.
TEST_F(ClusterReadsTest, TheSnapshotCountsSlotsUsersAndTheQueue) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  ASSERT_TRUE(state_.agents.Add(Hello("node-a", 3), nullptr).ok());
  const v1::Job running = Submit(2, "ann");
  Run(running, {{"agent-1", 0}, {"agent-1", 2}});
  const v1::Job queued = Submit(5, "bob");
  state_.plan.waiting = {{queued.job_id(), "waits for 5 slots", WaitClass::kFreeSlots}};
  state_.queue_entries[queued.job_id()].owner = "bob";

  ClusterSnapshot snapshot;
  reads_->Snapshot(snapshot);
  EXPECT_EQ(snapshot.agents, 1);
  EXPECT_EQ(snapshot.slots_by_device[v1::ResourceSpec::CPU].free, 1);
  EXPECT_EQ(snapshot.slots_by_device[v1::ResourceSpec::CPU].used, 2);
  ASSERT_EQ(snapshot.running.size(), 1u);
  EXPECT_EQ(snapshot.running[0].job().job_id(), running.job_id());
  EXPECT_EQ(snapshot.running[0].ranks_size(), 2);
  EXPECT_EQ(snapshot.users["ann"].running_jobs, 1);
  EXPECT_EQ(snapshot.users["ann"].slots_in_use[v1::ResourceSpec::CPU], 2);
  EXPECT_EQ(snapshot.users["bob"].queued_jobs, 1);
  EXPECT_EQ(snapshot.queued_by_wait[WaitClassName(WaitClass::kFreeSlots)], 1);
}

// Checkpoint uploads and logs of a job that is not running here.
TEST_F(ClusterReadsTest, UploadsAndLogsOfAJobThatIsNotRunning) {
  const v1::Job job = Submit(1, "ann");
  absl::StatusOr<UploadGrant> grant = reads_->GrantUpload(job.job_id(), 1, 0);
  EXPECT_EQ(grant.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(grant.status().message().find(job.job_id()), std::string::npos);

  v1::GetLogsRequest request;
  request.set_job_id("job-999999");
  EXPECT_EQ(reads_->GetLogs(request).status().code(), absl::StatusCode::kNotFound);
  request.set_job_id(job.job_id());
  absl::StatusOr<v1::GetLogsResponse> logs = reads_->GetLogs(request);
  ASSERT_TRUE(logs.ok()) << logs.status();
  EXPECT_FALSE(logs->complete());  // PENDING: more output may come
}

}  // namespace
}  // namespace chorus
