#include "coordinator/checkpoint/checkpoint_skip_warning.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

v1::Metrics Skipped(int64_t step, double skipped) {
  v1::Metrics m;
  m.set_step(step);
  (*m.mutable_values())["checkpoints_skipped_busy"] = 4;
  (*m.mutable_values())[kCheckpointsSkippedUnreachable] = skipped;
  return m;
}

TEST(SkippedCheckpointsWarningTest, AnIncreaseIsAWarningNamingRankStepAndCounts) {
  std::optional<v1::JobEvent> warning =
      SkippedCheckpointsWarning(Skipped(100, 1), Skipped(180, 3), 0);
  ASSERT_TRUE(warning.has_value());
  EXPECT_EQ(warning->message(),
            "warning: rank 0 skipped 2 checkpoint(s) by step 180: it could not reach the "
            "coordinator to store them (was it restarting?) within "
            "checkpoint.unreachable_retry_seconds; training went on "
            "(checkpoints_skipped_unreachable 3 so far)");
}

TEST(SkippedCheckpointsWarningTest, TheFirstReportAfterARestartComparesWithNothing) {
  std::optional<v1::JobEvent> warning = SkippedCheckpointsWarning(v1::Metrics(), Skipped(60, 1), 2);
  ASSERT_TRUE(warning.has_value());
  EXPECT_THAT(warning->message(), ::testing::StartsWith("warning: rank 2 skipped 1 checkpoint(s)"));
}

TEST(SkippedCheckpointsWarningTest, NoIncreaseNoWarning) {
  EXPECT_FALSE(SkippedCheckpointsWarning(Skipped(100, 2), Skipped(120, 2), 0).has_value());
  EXPECT_FALSE(SkippedCheckpointsWarning(v1::Metrics(), v1::Metrics(), 0).has_value());
  // Ranks that do not store report no such metric.
  EXPECT_FALSE(SkippedCheckpointsWarning(Skipped(100, 2), v1::Metrics(), 0).has_value());
}

}  // namespace
}  // namespace chorus
