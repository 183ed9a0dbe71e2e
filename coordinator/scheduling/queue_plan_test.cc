#include "coordinator/scheduling/queue_plan.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "coordinator/scheduling/fair_share.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

QueueEntry Job(const std::string& id, int min_ranks, int max_ranks, const std::string& owner = "",
               v1::JobSpec::Priority priority = v1::JobSpec::NORMAL,
               v1::ResourceSpec::Device device = v1::ResourceSpec::CPU) {
  QueueEntry entry;
  entry.job.job_id = id;
  entry.job.resources.set_min_ranks(min_ranks);
  entry.job.resources.set_max_ranks(max_ranks);
  entry.job.resources.set_device(device);
  entry.owner = owner;
  entry.priority = priority;
  return entry;
}

AgentSlots Agent(const std::string& id, std::vector<int> free, int total,
                 v1::ResourceSpec::Device device = v1::ResourceSpec::CPU) {
  AgentSlots agent{id, device, std::move(free)};
  agent.total_slots = total;
  return agent;
}

std::vector<std::string> Placed(const QueuePlan& plan) {
  std::vector<std::string> ids;
  for (const JobPlacement& p : plan.placed) ids.push_back(p.job_id);
  return ids;
}

std::string ReasonOf(const QueuePlan& plan, const std::string& id) {
  for (const WaitingJob& w : plan.waiting) {
    if (w.job_id == id) return w.reason;
  }
  return "(not waiting)";
}

SchedulingPolicy Policy(const std::string& text) {
  absl::StatusOr<SchedulingPolicy> policy = ParseSchedulingPolicy(text, "test");
  EXPECT_TRUE(policy.ok()) << policy.status();
  return policy.ok() ? *policy : SchedulingPolicy();
}

TEST(QueuePlanTest, HighBeforeNormalBeforeLowThenSubmitOrder) {
  const QueuePlan plan =
      PlanQueue({Job("low", 1, 1, "a", v1::JobSpec::LOW), Job("normal-1", 1, 1, "a"),
                 Job("high", 1, 1, "a", v1::JobSpec::HIGH), Job("normal-2", 1, 1, "a")},
                {Agent("agent-1", {0, 1}, 2)}, QueueUsage(), SchedulingPolicy());
  EXPECT_THAT(plan.order, ElementsAre("high", "normal-1", "normal-2", "low"));
  EXPECT_THAT(Placed(plan), ElementsAre("high", "normal-1"));
  EXPECT_EQ(ReasonOf(plan, "normal-2"),
            "waiting for 1 free CPU slot; 1 agent has 0 free; it is first in line for the CPU "
            "slots that free next (reservation): only a HIGH job can come before it");
  EXPECT_EQ(ReasonOf(plan, "low"),
            "waiting for 1 CPU slot behind normal-2, which comes first and holds the "
            "reservation of free CPU slots");
}

TEST(QueuePlanTest, WithinAPriorityTheLeastRecentUsageGoesFirst) {
  QueueUsage usage;
  usage.fair_share = {{"alice", 5000}, {"bob", 10}};
  const QueuePlan plan =
      PlanQueue({Job("alice-1", 1, 1, "alice"), Job("carol-1", 1, 1, "carol"),
                 Job("bob-1", 1, 1, "bob"), Job("alice-high", 1, 1, "alice", v1::JobSpec::HIGH)},
                {Agent("agent-1", {0, 1, 2}, 3)}, usage, SchedulingPolicy());
  // carol has no usage at all; alice's HIGH job still beats every NORMAL one.
  EXPECT_THAT(plan.order, ElementsAre("alice-high", "carol-1", "bob-1", "alice-1"));
  EXPECT_THAT(Placed(plan), ElementsAre("alice-high", "carol-1", "bob-1"));
}

TEST(QueuePlanTest, OverQuotaWaitsWithTheReasonAndBlocksNobody) {
  QueueUsage usage;
  usage.slots_in_use["alice"][v1::ResourceSpec::CPU] = 6;
  const QueuePlan plan =
      PlanQueue({Job("alice-big", 4, 4, "alice", v1::JobSpec::HIGH), Job("alice-2", 2, 4, "alice"),
                 Job("bob-1", 1, 1, "bob")},
                {Agent("agent-1", {0, 1, 2, 3, 4, 5}, 16)}, usage, Policy("default cpu_slots=8"));
  EXPECT_EQ(ReasonOf(plan, "alice-big"), "alice uses 6 of 8 CPU slots (quota); the job needs 4");
  // alice-2 takes only the 2 slots her quota leaves (not max_ranks 4).
  ASSERT_THAT(Placed(plan), ElementsAre("alice-2", "bob-1"));
  EXPECT_EQ(plan.placed[0].ranks.size(), 2u);
  EXPECT_THAT(plan.reservation_holders, IsEmpty());
}

TEST(QueuePlanTest, QuotaCountsJobsPlacedBeforeInThePlan) {
  const QueuePlan plan = PlanQueue({Job("a-1", 2, 2, "alice"), Job("a-2", 1, 1, "alice")},
                                   {Agent("agent-1", {0, 1, 2, 3}, 4)}, QueueUsage(),
                                   Policy("user alice cpu_slots=2"));
  EXPECT_THAT(Placed(plan), ElementsAre("a-1"));
  EXPECT_EQ(ReasonOf(plan, "a-2"), "alice uses 2 of 2 CPU slots (quota); the job needs 1");
}

TEST(QueuePlanTest, AJobBeyondItsOwnersQuotaSaysSo) {
  const QueuePlan plan = PlanQueue({Job("huge", 4, 4, "")}, {Agent("agent-1", {0, 1, 2, 3}, 4)},
                                   QueueUsage(), Policy("default cpu_slots=2"));
  EXPECT_THAT(Placed(plan), IsEmpty());
  EXPECT_EQ(ReasonOf(plan, "huge"),
            "the job needs 4 CPU slots, more than anonymous's quota of 2 (scheduling policy); "
            "it starts only if the quota is raised");
}

TEST(QueuePlanTest, TheFirstBlockedJobReservesTheFreeSlotsItCanUse) {
  // 3 free CPU slots: "big" needs 4, so it reserves the 3; "small" waits
  // behind it although it would fit; the CUDA job is not held up.
  const QueuePlan plan =
      PlanQueue({Job("big", 4, 4), Job("small", 1, 1),
                 Job("gpu", 1, 1, "", v1::JobSpec::NORMAL, v1::ResourceSpec::CUDA)},
                {Agent("agent-1", {1, 2}, 4), Agent("agent-2", {3}, 4),
                 Agent("gpu-1", {0}, 1, v1::ResourceSpec::CUDA)},
                QueueUsage(), SchedulingPolicy());
  EXPECT_THAT(Placed(plan), ElementsAre("gpu"));
  EXPECT_EQ(plan.reservation_holders.at(v1::ResourceSpec::CPU), "big");
  EXPECT_THAT(plan.reserved.at("agent-1"), ElementsAre(1, 2));
  EXPECT_THAT(plan.reserved.at("agent-2"), ElementsAre(3));
  EXPECT_EQ(ReasonOf(plan, "big"),
            "waiting for 4 free CPU slots; 2 agents have 3 free; it is first in line for CPU "
            "slots and holds the 3 free that it can use (reservation): only a HIGH job can come "
            "before it");
  EXPECT_EQ(ReasonOf(plan, "small"),
            "waiting for 1 CPU slot behind big, which comes first and holds the reservation of "
            "free CPU slots");
}

TEST(QueuePlanTest, BackfillTakesSlotsTheHolderCannotUse) {
  // "fat" ranks fit only on the large agent; the small agent's free slot
  // is no use to it, so a later job takes it.
  QueueEntry fat = Job("fat", 2, 2);
  fat.job.rank_bytes = 6'000'000'000;
  AgentSlots large = Agent("large", {0}, 2);
  large.memory_bytes = 16'000'000'000;
  AgentSlots small = Agent("small", {0}, 1);
  small.memory_bytes = 4'000'000'000;
  const QueuePlan plan =
      PlanQueue({fat, Job("later", 1, 1)}, {large, small}, QueueUsage(), SchedulingPolicy());
  EXPECT_THAT(Placed(plan), ElementsAre("later"));
  EXPECT_EQ(plan.placed[0].ranks[0].agent_id, "small");
  EXPECT_THAT(plan.reserved.at("large"), ElementsAre(0));
  EXPECT_FALSE(plan.reserved.count("small") > 0);
}

TEST(QueuePlanTest, AHigherPriorityJobTakesTheReservation) {
  const QueuePlan plan = PlanQueue({Job("old", 3, 3), Job("urgent", 2, 2, "", v1::JobSpec::HIGH)},
                                   {Agent("agent-1", {0}, 4)}, QueueUsage(), SchedulingPolicy());
  EXPECT_EQ(plan.reservation_holders.at(v1::ResourceSpec::CPU), "urgent");
  EXPECT_EQ(ReasonOf(plan, "old"),
            "waiting for 3 CPU slots behind urgent, which comes first and holds the reservation "
            "of free CPU slots");
}

// Issue 57: a large job of alice (much usage) holds the reservation; bob
// (little usage) submits small jobs after it, and slots free one by one.
// Fair share alone put bob's jobs first, and they took every slot that
// freed while the large job was told it was first in line.
TEST(QueuePlanTest, AHolderGetsTheFreedSlotsBeforeLaterJobsOfOwnersWithLessUsage) {
  QueueUsage usage;
  usage.fair_share = {{"alice", 50000}, {"bob", 10}};
  const QueueEntry large = Job("large", 4, 4, "alice");
  const QueuePlan first = PlanQueue({large}, {Agent("agent-1", {0}, 4)}, usage, SchedulingPolicy());
  ASSERT_EQ(first.reservation_holders.at(v1::ResourceSpec::CPU), "large");
  EXPECT_THAT(first.reservations_held, ElementsAre("large"));

  usage.reservations_held = first.reservations_held;
  const std::vector<QueueEntry> queued = {large, Job("bob-1", 1, 1, "bob"),
                                          Job("bob-2", 2, 2, "bob")};
  const QueuePlan freed =
      PlanQueue(queued, {Agent("agent-1", {0, 1}, 4)}, usage, SchedulingPolicy());
  EXPECT_THAT(freed.order, ElementsAre("large", "bob-1", "bob-2"));
  EXPECT_THAT(Placed(freed), IsEmpty());
  EXPECT_THAT(freed.reserved.at("agent-1"), ElementsAre(0, 1));
  EXPECT_EQ(ReasonOf(freed, "large"),
            "waiting for 4 free CPU slots; 1 agent has 2 free; it is first in line for CPU slots "
            "and holds the 2 free that it can use (reservation): only a HIGH job can come "
            "before it");
  EXPECT_EQ(ReasonOf(freed, "bob-1"),
            "waiting for 1 CPU slot behind large, which comes first and holds the reservation "
            "of free CPU slots");

  usage.reservations_held = freed.reservations_held;
  const QueuePlan all =
      PlanQueue(queued, {Agent("agent-1", {0, 1, 2, 3}, 4)}, usage, SchedulingPolicy());
  EXPECT_THAT(Placed(all), ElementsAre("large"));
  EXPECT_THAT(all.reservations_held, ElementsAre("bob-1"));

  // Without the claim (the first plan of a new leader) fair share decides.
  usage.reservations_held.clear();
  const QueuePlan fresh =
      PlanQueue(queued, {Agent("agent-1", {0, 1}, 4)}, usage, SchedulingPolicy());
  EXPECT_THAT(Placed(fresh), ElementsAre("bob-1"));
}

TEST(QueuePlanTest, AHolderPassedByAHigherPriorityJobIsFirstAgainOnceItStarts) {
  QueueUsage usage;
  usage.fair_share = {{"alice", 50000}, {"bob", 10}};
  usage.reservations_held = {"large"};
  const QueueEntry large = Job("large", 4, 4, "alice");
  const QueueEntry urgent = Job("urgent", 2, 2, "carol", v1::JobSpec::HIGH);
  const QueueEntry small = Job("bob-1", 1, 1, "bob");
  const QueuePlan passed =
      PlanQueue({large, urgent, small}, {Agent("agent-1", {0}, 4)}, usage, SchedulingPolicy());
  EXPECT_EQ(passed.reservation_holders.at(v1::ResourceSpec::CPU), "urgent");
  EXPECT_EQ(ReasonOf(passed, "urgent"),
            "waiting for 2 free CPU slots; 1 agent has 1 free; it is first in line for CPU slots "
            "and holds the 1 free that it can use (reservation): no job can come before it");
  EXPECT_THAT(passed.reservations_held, ElementsAre("large", "urgent"));

  // urgent started; the slot it did not need frees.
  usage.reservations_held = passed.reservations_held;
  const QueuePlan after =
      PlanQueue({large, small}, {Agent("agent-1", {3}, 4)}, usage, SchedulingPolicy());
  EXPECT_THAT(Placed(after), IsEmpty());
  EXPECT_EQ(after.reservation_holders.at(v1::ResourceSpec::CPU), "large");
  EXPECT_THAT(after.reservations_held, ElementsAre("large"));
}

TEST(QueuePlanTest, AHolderThatComesToWaitForItsQuotaGivesItsClaimUp) {
  QueueUsage usage;
  usage.fair_share = {{"alice", 50000}, {"bob", 10}};
  usage.reservations_held = {"large"};
  usage.slots_in_use["alice"][v1::ResourceSpec::CPU] = 6;
  const QueuePlan plan =
      PlanQueue({Job("large", 4, 4, "alice"), Job("bob-1", 3, 3, "bob")},
                {Agent("agent-1", {0, 1}, 8)}, usage, Policy("user alice cpu_slots=8"));
  EXPECT_EQ(plan.reservation_holders.at(v1::ResourceSpec::CPU), "bob-1");
  EXPECT_THAT(plan.reservations_held, ElementsAre("bob-1"));
}

TEST(QueuePlanTest, AJobNoAgentCouldHoldBlocksNobody) {
  const QueuePlan plan = PlanQueue({Job("giant", 9, 9, "", v1::JobSpec::HIGH), Job("small", 1, 1)},
                                   {Agent("agent-1", {0, 1}, 4)}, QueueUsage(), SchedulingPolicy());
  EXPECT_THAT(Placed(plan), ElementsAre("small"));
  EXPECT_THAT(plan.reservation_holders, IsEmpty());
  EXPECT_EQ(ReasonOf(plan, "giant"),
            "waiting for agents that can hold 9 CPU ranks: the 1 connected could hold 4 even "
            "when idle; later jobs start meanwhile");
}

TEST(QueuePlanTest, EachWaitingJobHasTheClassOfItsReason) {
  // One waiting job of each class: over quota, the reservation holder
  // (free slots), one behind it, one no agent could hold.
  const QueuePlan plan = PlanQueue(
      {Job("over", 1, 1, "alice"), Job("holder", 3, 3), Job("behind", 2, 2), Job("giant", 9, 9)},
      {Agent("agent-1", {0}, 4)}, QueueUsage(), Policy("user alice cpu_slots=0"));
  std::map<std::string, std::string> classes;
  for (const WaitingJob& w : plan.waiting) classes[w.job_id] = WaitClassName(w.wait);
  EXPECT_THAT(classes,
              ElementsAre(std::pair<const std::string, std::string>("behind", "reservation"),
                          std::pair<const std::string, std::string>("giant", "no_agent"),
                          std::pair<const std::string, std::string>("holder", "free_slots"),
                          std::pair<const std::string, std::string>("over", "quota")));
}

TEST(FairShareTest, UsageIntegratesSlotsAndHalvesEveryHalfLife) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  FairShare share(absl::Hours(1), t0);
  share.Advance(t0 + absl::Seconds(10), {{"alice", 8}});
  // 8 slots for 10 s: just under 80 slot-seconds (a little decayed).
  EXPECT_NEAR(share.usage().at("alice"), 80.0, 0.1);
  share.Advance(t0 + absl::Seconds(10) + absl::Hours(1), {});
  EXPECT_NEAR(share.usage().at("alice"), 40.0, 0.05);
  share.Advance(t0 + absl::Hours(40), {});
  EXPECT_FALSE(share.usage().count("alice") > 0);  // decayed to nothing
  share.Advance(t0, {{"bob", 1}});                 // time going back counts as none
  EXPECT_FALSE(share.usage().count("bob") > 0);
}

TEST(FairShareTest, LongRunsConvergeToSlotsTimesHalfLifeOverLn2) {
  const absl::Time t0 = absl::FromUnixSeconds(0);
  FairShare share(absl::Minutes(1), t0);
  for (int i = 1; i <= 600; ++i) share.Advance(t0 + absl::Seconds(i), {{"alice", 2}});
  EXPECT_NEAR(share.usage().at("alice"), 2 * 60 / std::log(2.0), 0.5);
}

}  // namespace
}  // namespace chorus
