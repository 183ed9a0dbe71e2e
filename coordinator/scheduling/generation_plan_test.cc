#include "coordinator/scheduling/generation_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace chorus {
namespace {

RankSlot At(const std::string& agent, int slot) {
  RankSlot r;
  r.agent_id = agent;
  r.slot = slot;
  return r;
}

AgentSlots Free(const std::string& agent, std::vector<int> slots,
                v1::ResourceSpec::Device device = v1::ResourceSpec::CPU) {
  AgentSlots a;
  a.agent_id = agent;
  a.device = device;
  a.free_slots = std::move(slots);
  return a;
}

QueuedJob Job(int min_ranks, int max_ranks) {
  QueuedJob job;
  job.job_id = "job-000001";
  job.resources.set_min_ranks(min_ranks);
  job.resources.set_max_ranks(max_ranks);
  job.resources.set_device(v1::ResourceSpec::CPU);
  return job;
}

std::vector<std::string> Where(const NextGeneration& next) {
  std::vector<std::string> out;
  for (const RankSlot& r : next.ranks) {
    out.push_back(r.agent_id + "/" + std::to_string(r.slot) + " local " +
                  std::to_string(r.local_rank) + "/" + std::to_string(r.local_world_size));
  }
  return out;
}

TEST(GenerationPlanTest, ALostRankIsReplacedUnderItsNumber) {
  const std::vector<RankSlot> current = {At("a", 0), At("a", 1), At("a", 2), At("a", 3)};
  absl::StatusOr<NextGeneration> next =
      PlanNextGeneration(current, {false, true, false, false}, {Free("a", {1, 4})}, Job(4, 4));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT(Where(*next), testing::ElementsAre("a/0 local 0/4", "a/1 local 1/4", "a/2 local 2/4",
                                                 "a/3 local 3/4"));
  EXPECT_THAT(next->old_rank, testing::ElementsAre(0, -1, 2, 3));
  EXPECT_EQ(next->newcomers(), 1);
}

TEST(GenerationPlanTest, WithHotSparesSurvivorsComeFirstAndTheNewcomerLast) {
  // One-peer exponential at 3 ranks: 0 and 1 train, 2 is the spare. Rank 1
  // is lost: the spare becomes rank 1 and the newcomer the spare.
  const std::vector<RankSlot> current = {At("a", 0), At("a", 1), At("a", 2)};
  QueuedJob job = Job(2, 3);
  job.survivors_first = true;
  absl::StatusOr<NextGeneration> next =
      PlanNextGeneration(current, {false, true, false}, {Free("a", {1})}, job);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT(Where(*next),
              testing::ElementsAre("a/0 local 0/3", "a/2 local 1/3", "a/1 local 2/3"));
  EXPECT_THAT(next->old_rank, testing::ElementsAre(0, 2, -1));
}

TEST(GenerationPlanTest, ToQueuedJobSetsSurvivorsFirstForJobsWithHotSpares) {
  v1::JobSpec spec;
  spec.mutable_resources()->set_min_ranks(2);
  spec.mutable_resources()->set_max_ranks(3);
  spec.mutable_strategy()->mutable_decentralized()->set_topology(
      v1::DecentralizedStrategy::ONE_PEER_EXPONENTIAL);
  EXPECT_FALSE(ToQueuedJob("j", spec).survivors_first) << "not elastic: no re-formation";
  spec.mutable_elastic();
  EXPECT_TRUE(ToQueuedJob("j", spec).survivors_first) << "3 ranks: 2 train, 1 spare";
  spec.mutable_resources()->set_max_ranks(2);
  EXPECT_FALSE(ToQueuedJob("j", spec).survivors_first) << "2 is served";
  spec.mutable_resources()->set_max_ranks(4);
  spec.mutable_strategy()->mutable_decentralized()->set_topology(
      v1::DecentralizedStrategy::COMPLETE);
  EXPECT_FALSE(ToQueuedJob("j", spec).survivors_first) << "complete serves every size";
}

TEST(GenerationPlanTest, WithoutAFreeSlotTheJobShrinksDownToMinRanks) {
  const std::vector<RankSlot> current = {At("a", 0), At("b", 0), At("b", 1)};
  absl::StatusOr<NextGeneration> next =
      PlanNextGeneration(current, {false, true, false}, {}, Job(2, 3));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT(Where(*next), testing::ElementsAre("a/0 local 0/1", "b/1 local 0/1"));
  EXPECT_THAT(next->old_rank, testing::ElementsAre(0, 2));
  EXPECT_EQ(next->newcomers(), 0);
}

TEST(GenerationPlanTest, BelowMinRanksIsAnErrorWithTheFigures) {
  const std::vector<RankSlot> current = {At("a", 0), At("a", 1)};
  absl::StatusOr<NextGeneration> next = PlanNextGeneration(
      current, {true, false}, {Free("gpu", {0}, v1::ResourceSpec::CUDA)}, Job(2, 2));
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(next.status().message(),
            "1 surviving rank(s) and 0 free CPU slot(s) are fewer than resources.min_ranks 2");
}

TEST(GenerationPlanTest, FreeSlotsBeyondTheLostRanksGrowTheJobUpToMaxRanks) {
  const std::vector<RankSlot> current = {At("a", 0), At("a", 1)};
  absl::StatusOr<NextGeneration> next =
      PlanNextGeneration(current, {false, true}, {Free("a", {1}), Free("b", {0, 1, 2})}, Job(1, 3));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT(Where(*next),
              testing::ElementsAre("a/0 local 0/2", "a/1 local 1/2", "b/0 local 0/1"));
  EXPECT_THAT(next->old_rank, testing::ElementsAre(0, -1, -1));
}

}  // namespace
}  // namespace chorus
