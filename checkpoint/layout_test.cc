#include "checkpoint/layout.h"

#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(LayoutTest, RankZeroUsesThePlainNames) {
  EXPECT_EQ(ModelFileName(0), "model.pt");
  EXPECT_EQ(TrainStateFileName(0), "train_state.pt");
  EXPECT_EQ(ModelFileName(0), kModelFile);
  EXPECT_EQ(TrainStateFileName(0), kTrainStateFile);
}

TEST(LayoutTest, OtherRanksCarryTheirRankInTheName) {
  EXPECT_EQ(ModelFileName(1), "model.rank1.pt");
  EXPECT_EQ(TrainStateFileName(1), "train_state.rank1.pt");
  EXPECT_EQ(ModelFileName(12), "model.rank12.pt");
  EXPECT_EQ(TrainStateFileName(12), "train_state.rank12.pt");
}

}  // namespace
}  // namespace chorus
