#include "worker/train/metrics_window.h"

#include "gtest/gtest.h"

namespace chorus {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(MetricsWindowTest, PerStepFiguresOfOneWindow) {
  MetricsWindow window(kStart);
  // Two steps of two micro-batches (losses already halved).
  window.AddMicroBatch(0.5, 0.25);
  window.AddMicroBatch(1.5, 0.0);
  window.EndStep();
  window.AddMicroBatch(1.0, 0.5);
  window.AddMicroBatch(1.0, 0.25);
  window.EndStep();
  const MetricsWindow::Summary s = window.Close(kStart + absl::Seconds(4), 64);
  EXPECT_EQ(s.steps, 2);
  EXPECT_DOUBLE_EQ(s.loss, 2.0);
  EXPECT_DOUBLE_EQ(s.step_seconds, 2.0);
  EXPECT_DOUBLE_EQ(s.wait_seconds, 0.5);
  EXPECT_DOUBLE_EQ(s.compute_seconds, 1.5);
  EXPECT_DOUBLE_EQ(s.samples_per_second, 32.0);  // 2 steps x 64 samples in 4 s
}

TEST(MetricsWindowTest, ClosingStartsAFreshWindowAtThatTime) {
  MetricsWindow window(kStart);
  window.AddMicroBatch(3.0, 1.0);
  window.EndStep();
  window.Close(kStart + absl::Seconds(10), 8);
  EXPECT_EQ(window.start(), kStart + absl::Seconds(10));
  window.AddMicroBatch(0.25, 0.0);
  window.EndStep();
  const MetricsWindow::Summary s = window.Close(kStart + absl::Seconds(11), 8);
  EXPECT_EQ(s.steps, 1);
  EXPECT_DOUBLE_EQ(s.loss, 0.25);
  EXPECT_DOUBLE_EQ(s.step_seconds, 1.0);
  EXPECT_DOUBLE_EQ(s.compute_seconds, 1.0);
  EXPECT_DOUBLE_EQ(s.wait_seconds, 0.0);
  EXPECT_DOUBLE_EQ(s.samples_per_second, 8.0);
}

TEST(MetricsWindowTest, AWindowWithoutStepsDividesByOne) {
  MetricsWindow window(kStart);
  window.AddMicroBatch(0.75, 0.5);
  const MetricsWindow::Summary s = window.Close(kStart + absl::Seconds(2), 16);
  EXPECT_EQ(s.steps, 0);
  EXPECT_DOUBLE_EQ(s.loss, 0.75);
  EXPECT_DOUBLE_EQ(s.step_seconds, 2.0);
  EXPECT_DOUBLE_EQ(s.compute_seconds, 1.5);
  EXPECT_DOUBLE_EQ(s.samples_per_second, 0.0);
}

TEST(MetricsWindowTest, AnEmptyInstantDoesNotDivideByZero) {
  MetricsWindow window(kStart);
  window.EndStep();
  const MetricsWindow::Summary s = window.Close(kStart, 10);
  EXPECT_DOUBLE_EQ(s.step_seconds, 0.0);
  EXPECT_DOUBLE_EQ(s.samples_per_second, 10 / 1e-9);
}

}  // namespace
}  // namespace chorus
