#include "chorus/topology.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Product of the mixing matrices of steps [0, steps).
std::vector<double> Product(const Topology& topo, int steps) {
  const int n = topo.world_size();
  std::vector<double> p(n * n, 0.0);
  for (int i = 0; i < n; ++i) p[i * n + i] = 1;
  for (int t = 0; t < steps; ++t) {
    const std::vector<double> w = topo.MixingMatrix(t);
    std::vector<double> next(n * n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < n; ++k)
        for (int j = 0; j < n; ++j) next[i * n + j] += w[i * n + k] * p[k * n + j];
    p = next;
  }
  return p;
}

void ExpectPartitions(const Topology& topo) {
  for (int t = 0; t < topo.period(); ++t) {
    std::vector<int> seen(topo.world_size(), 0);
    for (const auto& group : topo.Step(t)) {
      for (int r : group) ++seen[r];
    }
    for (int r = 0; r < topo.world_size(); ++r)
      EXPECT_EQ(seen[r], 1) << "step " << t << " rank " << r;
    // Doubly stochastic: rows and columns sum to 1.
    const std::vector<double> w = topo.MixingMatrix(t);
    const int n = topo.world_size();
    for (int i = 0; i < n; ++i) {
      double row = 0, col = 0;
      for (int j = 0; j < n; ++j) {
        row += w[i * n + j];
        col += w[j * n + i];
      }
      EXPECT_NEAR(row, 1.0, 1e-12);
      EXPECT_NEAR(col, 1.0, 1e-12);
    }
  }
}

TEST(TopologyTest, RingAlternatesNeighbourPairs) {
  Topology ring = *Topology::Create({TopologyKind::kRing}, 6);
  ASSERT_EQ(ring.period(), 2);
  ExpectPartitions(ring);
  EXPECT_THAT(ring.GroupOf(0, 2), ElementsAre(2, 3));
  EXPECT_THAT(ring.GroupOf(1, 2), ElementsAre(1, 2));
  EXPECT_THAT(ring.GroupOf(1, 5), ElementsAre(0, 5));
  EXPECT_THAT(ring.GroupOf(7, 0), ElementsAre(0, 5));
}

TEST(TopologyTest, OnePeerExponentialReachesTheExactMeanInLog2Steps) {
  Topology topo = *Topology::Create({TopologyKind::kOnePeerExponential}, 8);
  ASSERT_EQ(topo.period(), 3);
  ExpectPartitions(topo);
  EXPECT_THAT(topo.GroupOf(0, 5), ElementsAre(4, 5));
  EXPECT_THAT(topo.GroupOf(1, 5), ElementsAre(5, 7));
  EXPECT_THAT(topo.GroupOf(2, 5), ElementsAre(1, 5));
  for (double v : Product(topo, 3)) EXPECT_NEAR(v, 1.0 / 8, 1e-12);
}

TEST(TopologyTest, AlternatingExponentialRingAveragesNodesThenPairsThem) {
  TopologyConfig config{TopologyKind::kAlternatingExponentialRing, /*local_world_size=*/2};
  Topology topo = *Topology::Create(config, 8);  // 4 nodes of 2
  ASSERT_EQ(topo.period(), 4);
  ExpectPartitions(topo);
  EXPECT_THAT(topo.GroupOf(0, 5), ElementsAre(4, 5));  // its node
  EXPECT_THAT(topo.GroupOf(1, 5), ElementsAre(5, 7));  // node 2 <-> node 3, local rank 1
  EXPECT_THAT(topo.GroupOf(3, 5), ElementsAre(1, 5));  // node 2 <-> node 0
  for (double v : Product(topo, 4)) EXPECT_NEAR(v, 1.0 / 8, 1e-12);
  // One node: intra-node averaging only; one rank per node: inter-node pairs only.
  EXPECT_EQ(Topology::Create({TopologyKind::kAlternatingExponentialRing, 4}, 4)->period(), 1);
  EXPECT_EQ(Topology::Create({TopologyKind::kAlternatingExponentialRing, 1}, 4)->period(), 2);
}

TEST(TopologyTest, CompleteIsOneGroup) {
  Topology topo = *Topology::Create({TopologyKind::kComplete}, 3);
  EXPECT_THAT(topo.GroupOf(5, 1), ElementsAre(0, 1, 2));
  EXPECT_NEAR(topo.MixingMatrix(0)[1], 1.0 / 3, 1e-12);
}

TEST(TopologyTest, CustomStepsAreUsedInTurn) {
  TopologyConfig config{TopologyKind::kCustom, 1, {{{0, 1, 2}, {3}}, {{0}, {3, 1}, {2}}}};
  Topology topo = *Topology::Create(config, 4);
  ExpectPartitions(topo);
  EXPECT_THAT(topo.GroupOf(0, 3), ElementsAre(3));
  EXPECT_THAT(topo.GroupOf(1, 3), ElementsAre(1, 3));
  EXPECT_THAT(topo.GroupOf(2, 2), ElementsAre(0, 1, 2));
}

TEST(TopologyTest, ServedWorldSizeIsTheLargestServedSizeUpToTheWorld) {
  EXPECT_EQ(*ServedWorldSize({TopologyKind::kOnePeerExponential}, 3), 2);
  EXPECT_EQ(*ServedWorldSize({TopologyKind::kOnePeerExponential}, 7), 4);
  EXPECT_EQ(*ServedWorldSize({TopologyKind::kOnePeerExponential}, 8), 8);
  EXPECT_EQ(*ServedWorldSize({TopologyKind::kRing}, 5), 4);
  EXPECT_EQ(*ServedWorldSize({TopologyKind::kRing}, 1), 1);
  EXPECT_EQ(*ServedWorldSize({TopologyKind::kComplete}, 5), 5);
  EXPECT_EQ(*ServedWorldSize({TopologyKind::kAlternatingExponentialRing, 2}, 7), 4);
  TopologyConfig custom{TopologyKind::kCustom, 1, {{{0, 1}, {2, 3}}}};
  EXPECT_EQ(*ServedWorldSize(custom, 5), 4);
  EXPECT_THAT(std::string(ServedWorldSize(custom, 3).status().message()),
              HasSubstr("cover 4 ranks, the world has 3"));
  EXPECT_THAT(
      std::string(
          ServedWorldSize({TopologyKind::kAlternatingExponentialRing, 4}, 3).status().message()),
      HasSubstr("not a multiple of local_world_size 4"));
  EXPECT_FALSE(ServedWorldSize({TopologyKind::kComplete}, 0).ok());
}

TEST(TopologyTest, UnservableSizesNameTheReasonAndTheNearestSizes) {
  EXPECT_THAT(std::string(CheckWorldSize({TopologyKind::kRing}, 5).message()),
              HasSubstr("even number of ranks, got 5; nearest world sizes that work: 4 and 6"));
  EXPECT_THAT(
      std::string(CheckWorldSize({TopologyKind::kOnePeerExponential}, 6).message()),
      HasSubstr("power-of-two number of ranks, got 6; nearest world sizes that work: 4 and 8"));
  EXPECT_THAT(
      std::string(CheckWorldSize({TopologyKind::kAlternatingExponentialRing, 4}, 12).message()),
      HasSubstr("power-of-two number of nodes, got 3 (12 ranks / local_world_size 4); "
                "nearest world sizes that work: 8 and 16"));
  EXPECT_THAT(
      std::string(CheckWorldSize({TopologyKind::kAlternatingExponentialRing, 4}, 6).message()),
      HasSubstr("not a multiple of local_world_size 4; nearest world sizes that work: 4 and 8"));
  TopologyConfig custom{TopologyKind::kCustom, 1, {{{0, 1}, {2, 3}}}};
  EXPECT_THAT(std::string(CheckWorldSize(custom, 3).message()),
              HasSubstr("cover 4 ranks, the world has 3; nearest world sizes that work: 4"));
  TopologyConfig overlapping{TopologyKind::kCustom, 1, {{{0, 1}, {1, 2}}}};
  EXPECT_EQ(CheckWorldSize(overlapping, 4).message(),
            "custom step 0: rank 1 is in more than one group");
  EXPECT_THAT(std::string(Topology::Create({TopologyKind::kRing}, 3).status().message()),
              HasSubstr("topology ring: "));
  EXPECT_TRUE(CheckWorldSize({TopologyKind::kRing}, 1).ok());
  EXPECT_TRUE(CheckWorldSize({TopologyKind::kComplete}, 7).ok());
}

}  // namespace
}  // namespace chorus
