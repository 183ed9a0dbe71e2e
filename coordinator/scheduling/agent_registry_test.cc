#include "coordinator/scheduling/agent_registry.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace chorus {
namespace {

v1::AgentHello Hello(const std::string& host, int slots,
                     v1::ResourceSpec::Device device = v1::ResourceSpec::DEVICE_UNSPECIFIED) {
  v1::AgentHello hello;
  hello.set_host(host);
  hello.set_slots(slots);
  hello.set_device(device);
  return hello;
}

TEST(AgentRegistryTest, IdsAreNeverReusedAndDeviceDefaultsToCpu) {
  AgentRegistry agents;
  absl::StatusOr<std::string> first = agents.Add(Hello("node-a", 2), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "agent-1");
  EXPECT_EQ(agents.Find("agent-1")->hello.device(), v1::ResourceSpec::CPU);
  EXPECT_TRUE(agents.Remove("agent-1"));
  EXPECT_FALSE(agents.Remove("agent-1"));
  EXPECT_EQ(agents.Find("agent-1"), nullptr);
  EXPECT_EQ(*agents.Add(Hello("node-a", 2), nullptr), "agent-2");
}

TEST(AgentRegistryTest, RejectsHellosWithoutSlots) {
  AgentRegistry agents;
  EXPECT_EQ(agents.Add(Hello("node-a", 0), nullptr).status().message(),
            "agent hello: slots must be in [1, 1024], got 0");
  EXPECT_EQ(agents.Add(Hello("node-a", 1025), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The host labels metrics series and status rows: bounded and printable.
TEST(AgentRegistryTest, RejectsHostNamesThatAreNoHostNames) {
  AgentRegistry agents;
  EXPECT_EQ(agents.Add(Hello(std::string(254, 'h'), 1), nullptr).status().message(),
            "agent hello: host must be at most 253 printable characters, got 254 bytes; start "
            "the agent with --host NAME");
  EXPECT_EQ(agents.Add(Hello("node\n-a", 1), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(agents.Add(Hello(std::string(253, 'h'), 1), nullptr).ok());
}

TEST(AgentRegistryTest, FreeSlotsFollowRegistrationOrder) {
  AgentRegistry agents;
  // Ten agents, so that "agent-10" sorts before "agent-2" as a string.
  for (int i = 0; i < 10; ++i)
    ASSERT_TRUE(agents.Add(Hello("node", 2, v1::ResourceSpec::CUDA), nullptr).ok());
  agents.SetBusy("agent-1", 0, true);
  agents.SetBusy("agent-unknown", 0, true);  // ignored
  agents.SetBusy("agent-2", 7, true);        // ignored
  const std::vector<AgentSlots> free = agents.FreeSlots();
  ASSERT_EQ(free.size(), 10u);
  EXPECT_EQ(free[1].agent_id, "agent-2");
  EXPECT_EQ(free[9].agent_id, "agent-10");
  EXPECT_EQ(free[0].free_slots, std::vector<int>{1});
  EXPECT_EQ(free[0].device, v1::ResourceSpec::CUDA);
  EXPECT_EQ(agents.free_slots(), 19);
  agents.SetBusy("agent-1", 0, false);
  EXPECT_EQ(agents.free_slots(), 20);
}

TEST(AgentRegistryTest, SlotsAreCountedByDeviceFreeAndUsed) {
  AgentRegistry agents;
  ASSERT_TRUE(agents.Add(Hello("gpu-node", 4, v1::ResourceSpec::CUDA), nullptr).ok());
  ASSERT_TRUE(agents.Add(Hello("cpu-node", 3), nullptr).ok());
  agents.SetBusy("agent-1", 0, true);
  agents.SetBusy("agent-1", 3, true);
  agents.SetBusy("agent-2", 2, true);
  EXPECT_EQ(agents.size(), 2);
  auto slots = agents.SlotsByDevice();
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[v1::ResourceSpec::CUDA].used, 2);
  EXPECT_EQ(slots[v1::ResourceSpec::CUDA].free, 2);
  EXPECT_EQ(slots[v1::ResourceSpec::CPU].used, 1);
  EXPECT_EQ(slots[v1::ResourceSpec::CPU].free, 2);
  agents.Remove("agent-1");
  EXPECT_EQ(agents.SlotsByDevice().count(v1::ResourceSpec::CUDA), 0u);
}

TEST(AgentRegistryTest, FreeSlotsCarryTheAgentsMemoryAndHost) {
  AgentRegistry agents;
  v1::AgentHello big = Hello("node-big", 1);
  big.set_memory_bytes(int64_t{512} << 30);
  ASSERT_TRUE(agents.Add(big, nullptr).ok());
  ASSERT_TRUE(agents.Add(Hello("node-old", 1), nullptr).ok());  // reports no memory
  const std::vector<AgentSlots> free = agents.FreeSlots();
  ASSERT_EQ(free.size(), 2u);
  EXPECT_EQ(free[0].memory_bytes, int64_t{512} << 30);
  EXPECT_EQ(free[0].host, "node-big");
  EXPECT_EQ(free[1].memory_bytes, 0);
}

TEST(AgentRegistryTest, StopMessageNamesJobSlotsAndReason) {
  const v1::CoordinatorMessage m = StopRanksMessage("job-000002", {0, 3}, "rank 1 failed");
  ASSERT_TRUE(m.has_stop());
  EXPECT_EQ(m.stop().job_id(), "job-000002");
  ASSERT_EQ(m.stop().slots_size(), 2);
  EXPECT_EQ(m.stop().slots(1), 3);
  EXPECT_EQ(m.stop().grace_seconds(), 10);
  EXPECT_EQ(m.stop().reason(), "rank 1 failed");
}

// An agent process connecting again while its old stream is open here is
// known by the id it was welcomed with, its host and its pid together.
TEST(AgentRegistryTest, AnAgentStillOpenIsKnownByItsIdHostAndPid) {
  AgentRegistry agents;
  v1::AgentHello first = Hello("node-a", 2);
  first.set_pid(77);
  ASSERT_EQ(*agents.Add(first, nullptr), "agent-1");
  v1::AgentHello again = first;
  again.set_agent_id("agent-1");
  EXPECT_EQ(agents.StillOpen(again), "agent-1");
  v1::AgentHello other_pid = again;  // another agent in another pid namespace
  other_pid.set_pid(78);
  EXPECT_EQ(agents.StillOpen(other_pid), std::nullopt);
  v1::AgentHello other_host = again;
  other_host.set_host("node-b");
  EXPECT_EQ(agents.StillOpen(other_host), std::nullopt);
  EXPECT_EQ(agents.StillOpen(first), std::nullopt);  // a first hello names no id
  agents.Remove("agent-1");
  EXPECT_EQ(agents.StillOpen(again), std::nullopt);  // its stream has ended
}

}  // namespace
}  // namespace chorus
