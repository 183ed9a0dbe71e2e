#include "common/cpu_binding.h"

#include <sched.h>

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(SlotCpusTest, SlotsSplitTheCpusIntoContiguousSharesWithoutOverlap) {
  const std::vector<int> eight = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_THAT(SlotCpus(eight, 0, 2), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(SlotCpus(eight, 1, 2), ElementsAre(4, 5, 6, 7));
  // 8 CPUs among 3 slots: 3, 3, 2.
  EXPECT_THAT(SlotCpus(eight, 0, 3), ElementsAre(0, 1, 2));
  EXPECT_THAT(SlotCpus(eight, 1, 3), ElementsAre(3, 4, 5));
  EXPECT_THAT(SlotCpus(eight, 2, 3), ElementsAre(6, 7));
  EXPECT_THAT(SlotCpus(eight, 0, 1), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
}

TEST(SlotCpusTest, SharesAreTakenFromTheAllowedCpusNotFromZero) {
  // An agent under taskset -c 2,3,6,7 (or a Slurm cpuset).
  const std::vector<int> allowed = {2, 3, 6, 7};
  EXPECT_THAT(SlotCpus(allowed, 0, 2), ElementsAre(2, 3));
  EXPECT_THAT(SlotCpus(allowed, 1, 2), ElementsAre(6, 7));
  EXPECT_THAT(SlotCpus(allowed, 3, 4), ElementsAre(7));
}

TEST(SlotCpusTest, NothingIsBoundWithMoreSlotsThanCpusOrASlotOutOfRange) {
  const std::vector<int> two = {0, 1};
  EXPECT_THAT(SlotCpus(two, 0, 4), IsEmpty());
  EXPECT_THAT(SlotCpus(two, 2, 2), IsEmpty());
  EXPECT_THAT(SlotCpus(two, -1, 2), IsEmpty());
  EXPECT_THAT(SlotCpus(two, 0, 0), IsEmpty());
  EXPECT_THAT(SlotCpus({}, 0, 1), IsEmpty());
}

TEST(CpuListTest, FormatsRangesAndParsesThemBack) {
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({5, 1, 0, 1}), "0-1,5");
  EXPECT_EQ(FormatCpuList({}), "");
  EXPECT_THAT(*ParseCpuList("0-3,8,10-11"), ElementsAre(0, 1, 2, 3, 8, 10, 11));
  EXPECT_THAT(*ParseCpuList(" 4 , 2-3"), ElementsAre(2, 3, 4));
  for (const char* bad : {"", "a", "3-1", "-1", "1-", "0-5000", "1,,2", "1-2-3", "+1"}) {
    absl::StatusOr<std::vector<int>> parsed = ParseCpuList(bad);
    ASSERT_FALSE(parsed.ok()) << "\"" << bad << "\" parsed";
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr("bad item"));
  }
}

TEST(BindThisThreadTest, BindsTheCallingThreadAndWhatItStartsButNotOtherThreads) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  std::vector<int> in_thread, in_child, outside;
  std::thread bound([&] {
    ASSERT_TRUE(BindThisThread({allowed.back()}).ok());
    in_thread = AllowedCpus();
    std::thread child([&] { in_child = AllowedCpus(); });
    child.join();
  });
  bound.join();
  outside = AllowedCpus();
  EXPECT_THAT(in_thread, ElementsAre(allowed.back()));
  EXPECT_THAT(in_child, ElementsAre(allowed.back()));
  EXPECT_EQ(outside, allowed);
}

TEST(BindThisThreadTest, RefusesNoCpusAndCpusOutOfRangeNamingThem) {
  EXPECT_EQ(BindThisThread({}).code(), absl::StatusCode::kInvalidArgument);
  absl::Status out_of_range = BindThisThread({CPU_SETSIZE + 3});
  EXPECT_EQ(out_of_range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out_of_range.message(), HasSubstr("1027"));
  // A CPU the machine does not have (the kernel refuses an empty effective set).
  absl::Status missing = BindThisThread({CPU_SETSIZE - 1});
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(), HasSubstr("binding to CPUs 1023"));
}

}  // namespace
}  // namespace chorus
