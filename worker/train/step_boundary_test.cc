#include "worker/train/step_boundary.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(StepBoundaryTest, PackedRequestsOrderByGenerationThenWorld) {
  const ReformRequest r = UnpackReformRequest(PackReformRequest(7, 3));
  EXPECT_EQ(r.generation, 7);
  EXPECT_EQ(r.world_size, 3);
  EXPECT_GT(PackReformRequest(8, 0), PackReformRequest(7, 1000)) << "the newest generation wins";
  EXPECT_EQ(UnpackReformRequest(std::max(PackReformRequest(5, 2), PackReformRequest(5, 0)))
                .world_size,
            2)
      << "a rank that knows the world beats one that does not";
  EXPECT_EQ(UnpackReformRequest(PackReformRequest(2, 1 << 20)).world_size, 0) << "too large";
  EXPECT_EQ(UnpackReformRequest(0).generation, 0) << "no request";
}

TEST(StepBoundaryTest, AKnownPlannedWorldGivesItsGlobalBatch) {
  // 16 samples a rank per step, 4096 an epoch.
  EXPECT_EQ(BoundarySamples(2, 4, 3, 16, 4096), 48);
  EXPECT_EQ(BoundarySamples(2, 4, 2, 16, 4096), 32);
  EXPECT_EQ(BoundarySamples(1, 8, 5, 16, 4096), 80) << "a wide range does not matter";
  EXPECT_EQ(BoundarySamples(1, 8, 300, 16, 4096), 4097) << "past the epoch: its start only";
}

TEST(StepBoundaryTest, AnUnknownWorldTakesEveryWorldOfTheRange) {
  EXPECT_EQ(BoundarySamples(2, 4, 0, 16, 4096), 12 * 16);
  EXPECT_EQ(BoundarySamples(4, 4, 0, 16, 4096), 64);
  EXPECT_EQ(BoundarySamples(1, 8, 0, 16, 4096), 4097) << "lcm(1..8) = 840 batches: too many";
}

}  // namespace
}  // namespace chorus
