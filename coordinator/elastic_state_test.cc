#include "coordinator/elastic_state.h"

#include <string>

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
    {ReformKind::kRankLost, "rank_lost", true},   {ReformKind::kAgentLost, "agent_lost", true},
    {ReformKind::kHangRestart, "hang_restart", true}, {ReformKind::kDrain, "drain", false},
    {ReformKind::kScaleUp, "scale_up", false},     {ReformKind::kPreempt, "preempt", false},
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

}  // namespace
}  // namespace chorus
