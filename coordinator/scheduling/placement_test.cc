#include "coordinator/scheduling/placement.h"

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace chorus {
namespace {

QueuedJob Job(const std::string& id, int min_ranks, int max_ranks,
              v1::ResourceSpec::Device device = v1::ResourceSpec::CPU) {
  QueuedJob job;
  job.job_id = id;
  job.resources.set_min_ranks(min_ranks);
  job.resources.set_max_ranks(max_ranks);
  job.resources.set_device(device);
  return job;
}

AgentSlots Agent(const std::string& id, std::vector<int> free,
                 v1::ResourceSpec::Device device = v1::ResourceSpec::CPU) {
  return AgentSlots{id, device, std::move(free)};
}

TEST(PlacementTest, TakesUpToMaxRanksInAgentThenSlotOrder) {
  const std::vector<JobPlacement> placed =
      PlaceJobs({Job("big", 3, 4)}, {Agent("agent-1", {0, 1}), Agent("agent-2", {0, 1, 2})});
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].job_id, "big");
  ASSERT_EQ(placed[0].ranks.size(), 4u);
  const std::vector<std::pair<std::string, int>> expected = {
      {"agent-1", 0}, {"agent-1", 1}, {"agent-2", 0}, {"agent-2", 1}};
  for (size_t r = 0; r < expected.size(); ++r) {
    EXPECT_EQ(placed[0].ranks[r].agent_id, expected[r].first) << "rank " << r;
    EXPECT_EQ(placed[0].ranks[r].slot, expected[r].second) << "rank " << r;
  }
  // Local ranks count the job's ranks on the same agent.
  EXPECT_EQ(placed[0].ranks[1].local_rank, 1);
  EXPECT_EQ(placed[0].ranks[1].local_world_size, 2);
  EXPECT_EQ(placed[0].ranks[2].local_rank, 0);
  EXPECT_EQ(placed[0].ranks[2].local_world_size, 2);
}

TEST(PlacementTest, StrictFifoTheSmallJobWaitsBehindTheBigOne) {
  AgentSlots agent = Agent("agent-1", {0, 1});
  agent.total_slots = 4;  // two run other jobs
  const std::vector<JobPlacement> placed =
      PlaceJobs({Job("big", 3, 4), Job("small", 1, 1)}, {agent});
  EXPECT_TRUE(placed.empty()) << "the small job must not overtake the big one";
}

TEST(PlacementTest, LaterJobsTakeWhatEarlierOnesLeft) {
  const std::vector<JobPlacement> placed =
      PlaceJobs({Job("first", 1, 2), Job("second", 1, 2), Job("third", 1, 1)},
                {Agent("agent-1", {1, 3}), Agent("agent-2", {0})});
  ASSERT_EQ(placed.size(), 2u) << "the third job finds no slot left";
  ASSERT_EQ(placed[0].ranks.size(), 2u);
  EXPECT_EQ(placed[0].ranks[1].slot, 3);
  ASSERT_EQ(placed[1].ranks.size(), 1u);
  EXPECT_EQ(placed[1].job_id, "second");
  EXPECT_EQ(placed[1].ranks[0].agent_id, "agent-2");
  EXPECT_EQ(placed[1].ranks[0].local_world_size, 1);
}

TEST(PlacementTest, DevicesMustMatch) {
  EXPECT_TRUE(
      PlaceJobs({Job("cpu", 1, 1)}, {Agent("gpu-node", {0, 1}, v1::ResourceSpec::CUDA)}).empty());
  const std::vector<JobPlacement> placed =
      PlaceJobs({Job("gpu", 2, 8, v1::ResourceSpec::CUDA)},
                {Agent("agent-1", {0, 1}), Agent("agent-2", {0, 1, 2}, v1::ResourceSpec::CUDA)});
  ASSERT_EQ(placed.size(), 1u);
  ASSERT_EQ(placed[0].ranks.size(), 3u);
  for (const RankSlot& rank : placed[0].ranks) EXPECT_EQ(rank.agent_id, "agent-2");
}

TEST(PlacementTest, NothingQueuedOrNothingFree) {
  EXPECT_TRUE(PlaceJobs({}, {Agent("agent-1", {0})}).empty());
  EXPECT_TRUE(PlaceJobs({Job("j", 1, 1)}, {}).empty());
  EXPECT_TRUE(PlaceJobs({Job("j", 1, 1)}, {Agent("agent-1", {})}).empty());
}

AgentSlots AgentWithMemory(const std::string& id, std::vector<int> free, int64_t memory_bytes) {
  AgentSlots agent = Agent(id, std::move(free));
  agent.memory_bytes = memory_bytes;
  agent.host = id + ".example";
  return agent;
}

QueuedJob JobNeeding(const std::string& id, int min_ranks, int max_ranks, int64_t rank_bytes) {
  QueuedJob job = Job(id, min_ranks, max_ranks);
  job.rank_bytes = rank_bytes;
  return job;
}

TEST(PlacementTest, AnAgentTakesOnlyTheRanksItsMemoryHolds) {
  // 10 GB ranks: agent-1 (16 GB) holds one, agent-2 (4 GB) none, agent-3
  // (memory unknown) is not limited.
  const std::vector<JobPlacement> placed =
      PlaceJobs({JobNeeding("big", 3, 4, 10'000'000'000)},
                {AgentWithMemory("agent-1", {0, 1, 2}, 16'000'000'000),
                 AgentWithMemory("agent-2", {0, 1}, 4'000'000'000), Agent("agent-3", {0, 1})});
  ASSERT_EQ(placed.size(), 1u);
  ASSERT_EQ(placed[0].ranks.size(), 3u);
  EXPECT_EQ(placed[0].ranks[0].agent_id, "agent-1");
  EXPECT_EQ(placed[0].ranks[1].agent_id, "agent-3");
  EXPECT_EQ(placed[0].ranks[2].agent_id, "agent-3");
  EXPECT_EQ(placed[0].ranks[0].local_world_size, 1);
}

TEST(PlacementTest, AJobNoAgentCanHoldWaits) {
  const std::vector<AgentSlots> agents = {AgentWithMemory("agent-1", {0, 1}, 4'000'000'000)};
  const QueuedJob job = JobNeeding("big", 1, 1, 10'000'000'000);
  EXPECT_TRUE(PlaceJobs({job}, agents).empty());
  EXPECT_EQ(PendingReason(job, agents),
            "waiting for agents that can hold 1 CPU rank: the 1 connected could hold 0 even when "
            "idle (about 10.0 GB a rank); later jobs start meanwhile");
  EXPECT_EQ(RanksThatFit(job, agents[0]), 0);
  EXPECT_EQ(RanksThatFit(Job("unknown", 1, 1), agents[0]), INT_MAX);
}

// A CUDA job on a CPU-only cluster once kept every later job PENDING.
TEST(PlacementTest, AJobNoConnectedAgentCouldEverHoldDoesNotBlockTheQueue) {
  AgentSlots cpu = AgentWithMemory("agent-1", {1}, 8'000'000'000);
  cpu.total_slots = 2;  // slot 0 is busy
  const std::vector<JobPlacement> placed =
      PlaceJobs({Job("cuda", 1, 1, v1::ResourceSpec::CUDA), Job("too-wide", 3, 3),
                 JobNeeding("too-big", 1, 1, 10'000'000'000), Job("cpu", 1, 1)},
                {AgentWithMemory("agent-0", {}, 4'000'000'000), cpu});
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].job_id, "cpu");
  EXPECT_EQ(placed[0].ranks[0].agent_id, "agent-1");
  EXPECT_EQ(placed[0].ranks[0].slot, 1);

  // A job that fits the cluster but not its free slots still blocks (FIFO).
  EXPECT_TRUE(PlaceJobs({Job("two", 2, 2), Job("one", 1, 1)}, {cpu}).empty());
  EXPECT_FALSE(FitsIdleAgents(Job("three", 3, 3), {cpu}));
  EXPECT_TRUE(FitsIdleAgents(Job("two", 2, 2), {cpu}));
  // Once an agent that can hold it connects, it is placed first again.
  const std::vector<JobPlacement> with_gpu =
      PlaceJobs({Job("cuda", 1, 1, v1::ResourceSpec::CUDA), Job("cpu", 1, 1)},
                {cpu, Agent("gpu", {0}, v1::ResourceSpec::CUDA)});
  ASSERT_EQ(with_gpu.size(), 2u);
  EXPECT_EQ(with_gpu[0].job_id, "cuda");
  EXPECT_EQ(with_gpu[1].job_id, "cpu");
}

TEST(PlacementTest, PendingReasons) {
  EXPECT_EQ(PendingReason(Job("j", 1, 1), {}),
            "waiting for a node agent with CPU slots (none is connected); later jobs start "
            "meanwhile");
  EXPECT_EQ(PendingReason(Job("j", 3, 3), {Agent("agent-1", {0}), Agent("agent-2", {1})}),
            "waiting for agents that can hold 3 CPU ranks: the 2 connected could hold 2 even "
            "when idle; later jobs start meanwhile");
  AgentSlots busy = Agent("agent-1", {0});
  busy.total_slots = 4;  // three slots run other jobs
  EXPECT_EQ(PendingReason(Job("j", 3, 3), {busy, Agent("agent-2", {1})}),
            "waiting for 3 free CPU slots; 2 agents have 2 free");
  EXPECT_EQ(PendingReason(Job("j", 1, 1), {Agent("agent-1", {0})}),
            "waiting for older queued jobs to start first (placement is first in, first out)");
}

}  // namespace
}  // namespace chorus
