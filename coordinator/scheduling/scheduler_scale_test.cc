// The Scheduler at the size one coordinator is meant to hold: a job of
// 16,384 ranks in 2,048 agents of 8 slots (docs/benchmarks.md has the same
// over gRPC). What must not grow faster than the ranks does here.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "coordinator/http/coordinator_metrics.h"
#include "coordinator/scheduling/scheduler.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

constexpr int kAgents = 2048;
constexpr int kSlotsPerAgent = 8;
constexpr int kRanks = kAgents * kSlotsPerAgent;

struct FakeAgent {
  std::string id;
  std::vector<v1::CoordinatorMessage> received;
};

struct JoinResult {
  bool called = false;
  absl::StatusOr<v1::JoinResponse> result = absl::UnknownError("not called");
};

class SchedulerScaleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/scale_" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    state_ = *StateStore::Open(dir);
    jobs_ = *JobManager::Create(*state_, &clock_);
    scheduler_ = std::make_unique<Scheduler>(*jobs_, &clock_, SchedulerOptions{"127.0.0.1:1"});
    agents_.resize(kAgents);
    for (int a = 0; a < kAgents; ++a) {
      v1::AgentHello hello;
      hello.set_host(absl::StrCat("node-", a));
      hello.set_slots(kSlotsPerAgent);
      FakeAgent* agent = &agents_[a];
      absl::StatusOr<std::string> id = scheduler_->AddAgent(
          hello, [agent](const v1::CoordinatorMessage& m) { agent->received.push_back(m); });
      ASSERT_TRUE(id.ok()) << id.status();
      agent->id = *id;
    }
  }

  std::string Submit(const std::string& extra) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(
        absl::StrCat("model { mlp {} } data { synthetic {} } resources { min_ranks: ", kRanks,
                     " max_ranks: ", kRanks, " } ", extra),
        SpecFormat::kTextProto, "test");
    EXPECT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<v1::Job> job = jobs_->Submit(*spec, "");
    EXPECT_TRUE(job.ok()) << job.status();
    scheduler_->Schedule();
    return job->job_id();
  }

  // Every launched rank of `generation` joins; returns the answers by the
  // order of the joins (agents in order, then their launch order).
  std::vector<JoinResult> JoinAll(const std::string& job, int64_t generation) {
    std::vector<JoinResult> joins;
    joins.reserve(kRanks);
    for (const FakeAgent& agent : agents_) {
      for (const v1::CoordinatorMessage& m : agent.received) {
        if (!m.has_launch() || m.launch().generation() != generation) continue;
        for (const v1::RankLaunch& launch : m.launch().ranks()) {
          v1::JoinRequest request;
          request.set_job_id(job);
          request.set_agent_id(agent.id);
          request.set_slot(launch.slot());
          request.set_generation(generation);
          request.set_pid(1000 + static_cast<int64_t>(joins.size()));
          JoinResult* result = &joins.emplace_back();
          scheduler_->Join(request, clock_.Now() + absl::Minutes(5),
                           [result](absl::StatusOr<v1::JoinResponse> r) {
                             result->called = true;
                             result->result = std::move(r);
                           });
        }
      }
    }
    return joins;
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  std::unique_ptr<StateStore> state_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<FakeAgent> agents_;
};

// Note [Rendezvous is O(ranks)] in rendezvous.h: every join copied the
// job (16,384 placements) and every answer numbered the agents by a scan;
// at this size that was hours, not the seconds allowed here.
TEST_F(SchedulerScaleTest, SixteenThousandRanksFormInTimeLinearInTheRanks) {
  const std::string job = Submit("");
  ASSERT_EQ(jobs_->Get(job)->state(), v1::Job::RUNNING);
  const absl::Time start = absl::Now();
  const std::vector<JoinResult> joins = JoinAll(job, 1);
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(joins.size(), static_cast<size_t>(kRanks));
  for (size_t i = 0; i < joins.size(); ++i) {
    ASSERT_TRUE(joins[i].called) << "join " << i;
    ASSERT_TRUE(joins[i].result.ok()) << joins[i].result.status();
    const v1::JoinResponse& r = *joins[i].result;
    ASSERT_EQ(r.rank(), static_cast<int>(i)) << "ranks follow agents, then slots";
    ASSERT_EQ(r.world_size(), kRanks);
    ASSERT_EQ(r.group_rank(), static_cast<int>(i) / kSlotsPerAgent) << "rank " << i;
    ASSERT_EQ(r.group_world_size(), kAgents);
    ASSERT_EQ(r.local_rank(), static_cast<int>(i) % kSlotsPerAgent);
  }
  EXPECT_LT(took, absl::Seconds(20)) << kRanks << " joins took " << took;

  // What a scrape and a status request see (docs/observability.md, "Large
  // jobs"): a summary of every rank, rows only for a page.
  ClusterSnapshot snapshot;
  scheduler_->reads().Snapshot(snapshot, CoordinatorMetrics::kDefaultMaxRankSeries);
  ASSERT_EQ(snapshot.running.size(), 1u);
  EXPECT_EQ(snapshot.running[0].ranks_size(), 0);
  EXPECT_EQ(snapshot.running[0].rank_summary().ranks(), kRanks);
  EXPECT_EQ(snapshot.running[0].rank_summary().by_state().at("TRAINING"), kRanks);
  v1::JobStatus status;
  StatusRows page;
  page.offset = kRanks - 10;
  page.limit = kDefaultStatusRankRows;
  scheduler_->reads().FillStatus(job, status, page);
  ASSERT_EQ(status.ranks_size(), 10);
  EXPECT_EQ(status.ranks(9).rank(), kRanks - 1);
}

}  // namespace
}  // namespace chorus
