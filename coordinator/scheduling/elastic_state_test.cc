#include "coordinator/scheduling/elastic_state.h"

#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

struct KindCase {
  ReformKind kind;
  const char* name;  // the metrics label and the saved record's value
  bool failure;
};

// The names are part of chorus_generations_total and of the state database:
// this table pins them.
constexpr KindCase kKinds[] = {
    {ReformKind::kRankLost, "rank_lost", true},       {ReformKind::kAgentLost, "agent_lost", true},
    {ReformKind::kHangRestart, "hang_restart", true}, {ReformKind::kDrain, "drain", false},
    {ReformKind::kScaleUp, "scale_up", false},        {ReformKind::kPreempt, "preempt", false},
};

TEST(ReformKindTest, NamesFailuresAndParsingAgree) {
  for (const KindCase& c : kKinds) {
    EXPECT_EQ(ReformKindName(c.kind), c.name);
    EXPECT_EQ(IsFailure(c.kind), c.failure) << c.name;
    std::optional<ReformKind> parsed = ParseReformKind(c.name);
    ASSERT_TRUE(parsed.has_value()) << c.name;
    EXPECT_EQ(*parsed, c.kind) << c.name;
  }
}

TEST(ReformKindTest, UnknownNamesDoNotParse) {
  EXPECT_FALSE(ParseReformKind("").has_value());
  EXPECT_FALSE(ParseReformKind("recovered").has_value());
  EXPECT_FALSE(ParseReformKind("RANK_LOST").has_value());
}

const absl::Time kT0 = absl::FromUnixSeconds(1000);

absl::Time At(int seconds) { return kT0 + absl::Seconds(seconds); }

TEST(ElasticPhaseTest, PlannedChangeIsMadeByFormingAndTheFormedGenerationEndsIt) {
  ElasticPhase phase;
  EXPECT_TRUE(phase.steady());
  EXPECT_FALSE(phase.started().has_value());
  ASSERT_TRUE(phase.Plan({"agent a1 was drained", ReformKind::kDrain, 3}));
  EXPECT_TRUE(phase.steady()) << "a planned change is no phase: it waits for the step boundary";
  phase.BeginForming(ReformKind::kDrain, At(5), At(65));
  EXPECT_FALSE(phase.planned().has_value()) << "forming makes the planned change";
  ASSERT_NE(phase.forming(), nullptr);
  EXPECT_EQ(phase.forming()->kind, ReformKind::kDrain);
  EXPECT_EQ(phase.forming()->started, At(5));
  EXPECT_EQ(phase.forming()->deadline, At(65));
  std::optional<ElasticPhase::Forming> formed = phase.GenerationFormed();
  ASSERT_TRUE(formed.has_value());
  EXPECT_EQ(formed->started, At(5));
  EXPECT_TRUE(phase.steady());
  EXPECT_FALSE(phase.GenerationFormed().has_value()) << "a steady job has nothing forming";
}

// The change's start carries over from phase to phase until its generation
// forms: recovery_seconds counts from the failure, not from the last phase.
TEST(ElasticPhaseTest, StartOfTheChangeCarriesOverEveryTransition) {
  ElasticPhase phase;
  phase.BeginRestarting("rank 1 exited with code 1", ReformKind::kRankLost, At(1), At(61));
  ASSERT_NE(phase.restarting(), nullptr);
  phase.BeginWaiting("rank 1 exited with code 1", ReformKind::kRankLost, At(4), At(64));
  ASSERT_NE(phase.waiting(), nullptr);
  EXPECT_FALSE(phase.waiting()->unformed.has_value()) << "a restart-all leaves nothing forming";
  phase.BeginForming(ReformKind::kRankLost, At(9), At(69));
  phase.BeginForming(ReformKind::kAgentLost, At(12), At(72));
  ASSERT_NE(phase.forming(), nullptr);
  EXPECT_EQ(phase.forming()->kind, ReformKind::kAgentLost) << "the latest change";
  EXPECT_EQ(phase.forming()->deadline, At(72)) << "the latest generation's deadline";
  EXPECT_EQ(phase.started(), At(1)) << "the first failure of the change";
}

// A further failure while g forms, with no free slot: the job waits for
// slots and g keeps its deadline; g may still form (its lost rank had
// joined), which ends the forming but not the wait.
TEST(ElasticPhaseTest, WaitBegunWhileFormingKeepsTheUnformedGeneration) {
  ElasticPhase phase;
  phase.BeginForming(ReformKind::kRankLost, At(0), At(60));
  phase.BeginWaiting("rank 2 exited with code 1", ReformKind::kRankLost, At(10), At(70));
  const ElasticPhase::Waiting* wait = phase.waiting();
  ASSERT_NE(wait, nullptr);
  EXPECT_EQ(wait->until, At(70));
  EXPECT_EQ(wait->started, At(0));
  ASSERT_TRUE(wait->unformed.has_value());
  EXPECT_EQ(wait->unformed->deadline, At(60));
  ASSERT_TRUE(phase.GenerationFormed().has_value());
  ASSERT_NE(phase.waiting(), nullptr) << "still below resources.min_ranks";
  EXPECT_FALSE(phase.waiting()->unformed.has_value());
  EXPECT_FALSE(phase.GenerationFormed().has_value());
}

TEST(ElasticPhaseTest, DrainIsNotReplacedByOtherPlannedChanges) {
  struct Case {
    ReformKind first;
    ReformKind second;
    bool taken;
  };
  const Case cases[] = {
      {ReformKind::kDrain, ReformKind::kScaleUp, false},
      {ReformKind::kDrain, ReformKind::kPreempt, false},
      {ReformKind::kDrain, ReformKind::kDrain, true},
      {ReformKind::kScaleUp, ReformKind::kDrain, true},
      {ReformKind::kScaleUp, ReformKind::kPreempt, true},
      {ReformKind::kPreempt, ReformKind::kScaleUp, true},
  };
  for (const Case& c : cases) {
    ElasticPhase phase;
    ASSERT_TRUE(phase.Plan({"first", c.first, 4}));
    EXPECT_EQ(phase.Plan({"second", c.second, std::nullopt}), c.taken)
        << ReformKindName(c.first) << " then " << ReformKindName(c.second);
    ASSERT_TRUE(phase.planned().has_value());
    EXPECT_EQ(phase.planned()->cause, c.taken ? "second" : "first");
    EXPECT_EQ(phase.planned()->world, c.taken ? std::nullopt : std::optional<int>(4));
  }
}

}  // namespace
}  // namespace chorus
