#include "coordinator/state/leadership.h"

#include <thread>

#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(SoleLeadershipTest, LeadsFromCampaignUntilResign) {
  SoleLeadership leadership({.id = "c1", .address = "127.0.0.1:29650"});
  EXPECT_FALSE(leadership.IsLeader());
  EXPECT_FALSE(leadership.Leader().has_value());
  ASSERT_TRUE(leadership.Campaign().ok());
  EXPECT_TRUE(leadership.IsLeader());
  ASSERT_TRUE(leadership.Leader().has_value());
  EXPECT_EQ(leadership.Leader()->address, "127.0.0.1:29650");
  EXPECT_NE(leadership.Leader()->since, absl::InfinitePast());
  leadership.Resign();
  EXPECT_FALSE(leadership.IsLeader());
  leadership.WaitUntilLost();  // returns at once: not leading
}

TEST(SoleLeadershipTest, StopWakesAWaiterAndRefusesANewCampaign) {
  SoleLeadership leadership({.id = "c1", .address = "127.0.0.1:29650"});
  ASSERT_TRUE(leadership.Campaign().ok());
  std::thread waiter([&] { leadership.WaitUntilLost(); });
  leadership.Stop();
  waiter.join();
  EXPECT_FALSE(leadership.IsLeader());
  EXPECT_EQ(leadership.Campaign().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace chorus
