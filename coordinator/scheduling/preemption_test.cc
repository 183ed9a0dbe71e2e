#include "coordinator/scheduling/preemption.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

QueueEntry Holder(int min_ranks, v1::JobSpec::Priority priority = v1::JobSpec::HIGH) {
  QueueEntry e;
  e.job.job_id = "high";
  e.job.resources.set_min_ranks(min_ranks);
  e.job.resources.set_max_ranks(min_ranks);
  e.job.resources.set_device(v1::ResourceSpec::CPU);
  e.priority = priority;
  return e;
}

// A job of `world` ranks, rank r on `agent` slot r.
ElasticRun Elastic(const std::string& id, v1::JobSpec::Priority priority, int min_ranks, int world,
                   const std::string& agent = "agent-1") {
  ElasticRun run;
  run.job_id = id;
  run.priority = priority;
  run.min_ranks = min_ranks;
  for (int r = 0; r < world; ++r) run.ranks.push_back(RankSlot{agent, r, r, world});
  return run;
}

std::vector<AgentSlots> Agents() {
  AgentSlots a{"agent-1", v1::ResourceSpec::CPU, {}};
  a.total_slots = 8;
  AgentSlots b{"agent-2", v1::ResourceSpec::CPU, {}};
  b.total_slots = 8;
  return {a, b};
}

TEST(PreemptionTest, TakesExactlyTheSlotsNeededFromTheHighestRanks) {
  const std::vector<Preemption> plan =
      PlanPreemption(Holder(2), 2, {Elastic("low", v1::JobSpec::LOW, 2, 4)}, Agents());
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].job_id, "low");
  EXPECT_THAT(plan[0].ranks, ElementsAre(2, 3));
}

TEST(PreemptionTest, NeverBelowMinRanksNorFromAnEqualOrHigherPriority) {
  EXPECT_THAT(PlanPreemption(Holder(2), 2, {Elastic("low", v1::JobSpec::LOW, 3, 4)}, Agents()),
              IsEmpty())
      << "only 1 rank above min_ranks: not enough, so nothing is taken";
  EXPECT_THAT(PlanPreemption(Holder(2), 2, {Elastic("peer", v1::JobSpec::HIGH, 1, 4)}, Agents()),
              IsEmpty());
  EXPECT_THAT(PlanPreemption(Holder(1, v1::JobSpec::NORMAL), 1,
                             {Elastic("normal", v1::JobSpec::NORMAL, 1, 4)}, Agents()),
              IsEmpty());
}

TEST(PreemptionTest, LowestPriorityThenNewestGiveFirstAcrossJobs) {
  const std::vector<Preemption> plan =
      PlanPreemption(Holder(4), 4,
                     {Elastic("normal-old", v1::JobSpec::NORMAL, 1, 3, "agent-1"),
                      Elastic("low-old", v1::JobSpec::LOW, 1, 2, "agent-2"),
                      Elastic("low-new", v1::JobSpec::LOW, 1, 3, "agent-2")},
                     Agents());
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].job_id, "low-new");
  EXPECT_THAT(plan[0].ranks, ElementsAre(1, 2));
  EXPECT_EQ(plan[1].job_id, "low-old");
  EXPECT_THAT(plan[1].ranks, ElementsAre(1));
  EXPECT_EQ(plan[2].job_id, "normal-old");
  EXPECT_THAT(plan[2].ranks, ElementsAre(2));
}

TEST(PreemptionTest, SkipsRanksOnAgentsThatCannotHoldTheWaitingJobsRanks) {
  QueueEntry holder = Holder(1);
  holder.job.rank_bytes = 8'000'000'000;
  std::vector<AgentSlots> agents = Agents();
  agents[0].memory_bytes = 4'000'000'000;   // too small
  agents[1].memory_bytes = 64'000'000'000;  // fits
  ElasticRun run = Elastic("low", v1::JobSpec::LOW, 1, 4);
  run.ranks[1].agent_id = "agent-2";
  const std::vector<Preemption> plan = PlanPreemption(holder, 1, {run}, agents);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_THAT(plan[0].ranks, ElementsAre(1)) << "ranks 2 and 3 run where it would not fit";
}

// A job that is not elastic, of `world` ranks on `agent` slots 0...
RequeueRun Whole(const std::string& id, v1::JobSpec::Priority priority, int world,
                 bool checkpointable, bool preemptible = false,
                 const std::string& agent = "agent-1") {
  RequeueRun run;
  run.job_id = id;
  run.priority = priority;
  run.checkpointable = checkpointable;
  run.preemptible = preemptible;
  for (int r = 0; r < world; ++r) run.ranks.push_back(RankSlot{agent, r, r, world});
  return run;
}

TEST(PreemptionTest, ElasticRanksGiveFirstThenWholeCheckpointableJobs) {
  const std::vector<Preemption> plan =
      PlanPreemption(Holder(3), 3, {Elastic("elastic", v1::JobSpec::NORMAL, 1, 2)}, Agents(),
                     {Whole("low-ckpt", v1::JobSpec::LOW, 2, /*checkpointable=*/true)});
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].job_id, "elastic");
  EXPECT_FALSE(plan[0].requeue);
  EXPECT_THAT(plan[0].ranks, ElementsAre(1));
  EXPECT_EQ(plan[1].job_id, "low-ckpt");
  EXPECT_TRUE(plan[1].requeue);
  EXPECT_THAT(plan[1].ranks, ElementsAre(0, 1));
}

TEST(PreemptionTest, NoJobIsRequeuedWhenShrinkingIsEnough) {
  const std::vector<Preemption> plan =
      PlanPreemption(Holder(2), 2, {Elastic("elastic", v1::JobSpec::LOW, 1, 4)}, Agents(),
                     {Whole("low-ckpt", v1::JobSpec::LOW, 2, true)});
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].job_id, "elastic");
  EXPECT_FALSE(plan[0].requeue);
}

TEST(PreemptionTest, RequeuesTheLowestPriorityThenNewestWholeJob) {
  const std::vector<Preemption> plan = PlanPreemption(
      Holder(2), 2, {}, Agents(),
      {Whole("low-old", v1::JobSpec::LOW, 2, true), Whole("normal", v1::JobSpec::NORMAL, 2, true),
       Whole("low-new", v1::JobSpec::LOW, 2, true, false, "agent-2")});
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].job_id, "low-new");
  EXPECT_TRUE(plan[0].requeue);
}

TEST(PreemptionTest, NeverRequeuesAJobThatIsNeitherCheckpointableNorPreemptible) {
  EXPECT_THAT(PlanPreemption(Holder(2), 2, {}, Agents(),
                             {Whole("program", v1::JobSpec::LOW, 2, /*checkpointable=*/false)}),
              IsEmpty());
  const std::vector<Preemption> plan =
      PlanPreemption(Holder(2), 2, {}, Agents(),
                     {Whole("program", v1::JobSpec::LOW, 2, false, /*preemptible=*/true)});
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].job_id, "program");
  EXPECT_THAT(
      PlanPreemption(Holder(2), 2, {}, Agents(), {Whole("peer", v1::JobSpec::HIGH, 2, true, true)}),
      IsEmpty())
      << "never an equal priority";
}

TEST(PreemptionTest, AllOrNoneAcrossElasticAndRequeuedJobs) {
  EXPECT_THAT(PlanPreemption(Holder(6), 6, {Elastic("elastic", v1::JobSpec::LOW, 1, 3)}, Agents(),
                             {Whole("low-ckpt", v1::JobSpec::LOW, 2, true)}),
              IsEmpty())
      << "2 elastic ranks and 2 ranks of a whole job do not make 6: nothing is taken";
}

}  // namespace
}  // namespace chorus
