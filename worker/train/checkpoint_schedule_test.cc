#include "worker/train/checkpoint_schedule.h"

#include <vector>

#include "gtest/gtest.h"

namespace chorus {
namespace {

// The steps of a run of `total` steps after which a checkpoint is due, with
// requests agreed after the steps in `requested_at`.
std::vector<int64_t> DueSteps(const CheckpointSchedule& schedule, int64_t total,
                              const std::vector<int64_t>& requested_at = {}) {
  std::vector<int64_t> out;
  for (int64_t step = 1; step <= total; ++step) {
    bool requested = false;
    for (int64_t r : requested_at) requested = requested || r == step;
    if (schedule.AfterStep(step, total, requested).checkpoint) out.push_back(step);
  }
  return out;
}

TEST(CheckpointScheduleTest, PeriodicEveryStepsButNotAtTheLastStep) {
  CheckpointSchedule schedule(/*every_steps=*/30, /*at_end=*/true);
  EXPECT_EQ(DueSteps(schedule, 100), (std::vector<int64_t>{30, 60, 90}));
  EXPECT_EQ(DueSteps(schedule, 90), (std::vector<int64_t>{30, 60}))
      << "step 90 is the final checkpoint's";
  EXPECT_FALSE(schedule.AfterStep(60, 100, false).force);
  EXPECT_TRUE(schedule.periodic());
}

TEST(CheckpointScheduleTest, NoPeriodicCheckpointsWithoutEverySteps) {
  CheckpointSchedule schedule(0, true);
  EXPECT_TRUE(DueSteps(schedule, 50).empty());
  EXPECT_FALSE(schedule.periodic());
  EXPECT_EQ(DueSteps(schedule, 50, {7, 50}), (std::vector<int64_t>{7}));
}

TEST(CheckpointScheduleTest, RequestedCheckpointsAreForced) {
  CheckpointSchedule schedule(30, true);
  EXPECT_EQ(DueSteps(schedule, 100, {45, 60, 100}), (std::vector<int64_t>{30, 45, 60, 90}));
  const CheckpointSchedule::Due at_45 = schedule.AfterStep(45, 100, true);
  EXPECT_TRUE(at_45.checkpoint);
  EXPECT_TRUE(at_45.force);
  EXPECT_TRUE(schedule.AfterStep(60, 100, true).force) << "periodic and requested: forced";
  const CheckpointSchedule::Due at_end = schedule.AfterStep(100, 100, true);
  EXPECT_FALSE(at_end.checkpoint);
  EXPECT_FALSE(at_end.force);
}

TEST(CheckpointScheduleTest, EachNewRequestCountTriggersOnce) {
  CheckpointSchedule schedule(0, true);
  EXPECT_FALSE(schedule.NewRequest(std::nullopt)) << "not checked at this step";
  EXPECT_FALSE(schedule.NewRequest(0));
  EXPECT_TRUE(schedule.NewRequest(1));
  EXPECT_FALSE(schedule.NewRequest(1));
  EXPECT_FALSE(schedule.NewRequest(std::nullopt));
  EXPECT_TRUE(schedule.NewRequest(4)) << "three requests between checks: one checkpoint";
  EXPECT_FALSE(schedule.NewRequest(4));
  EXPECT_FALSE(schedule.NewRequest(3));
  EXPECT_TRUE(schedule.NewRequest(5));
}

TEST(CheckpointScheduleTest, BusyWritersSkipOnlyPlainPeriodicCheckpoints) {
  EXPECT_TRUE(CheckpointSchedule::TakeNow(/*final=*/false, /*force=*/false, /*writer_busy=*/false));
  EXPECT_FALSE(CheckpointSchedule::TakeNow(false, false, true));
  EXPECT_TRUE(CheckpointSchedule::TakeNow(false, true, true));
  EXPECT_TRUE(CheckpointSchedule::TakeNow(true, false, true));
}

TEST(CheckpointScheduleTest, FromTheSpecAtEndDefaultsToTrue) {
  v1::CheckpointSpec spec;
  spec.set_every_steps(25);
  EXPECT_TRUE(CheckpointSchedule(spec).at_end());
  EXPECT_EQ(DueSteps(CheckpointSchedule(spec), 60), (std::vector<int64_t>{25, 50}));
  spec.set_at_end(false);
  EXPECT_FALSE(CheckpointSchedule(spec).at_end());
  spec.set_at_end(true);
  EXPECT_TRUE(CheckpointSchedule(spec).at_end());
}

}  // namespace
}  // namespace chorus
