#include "worker/replica/bucket_assignment.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;

TEST(AssignBucketsTest, FirstBucketSmallThenCap) {
  std::vector<BucketInput> params(6, BucketInput{100, 0});
  std::vector<size_t> order = {5, 4, 3, 2, 1, 0};
  auto buckets = AssignBuckets(params, order, /*first=*/100, /*cap=*/250);
  EXPECT_THAT(buckets, ElementsAre(ElementsAre(5), ElementsAre(4, 3, 2), ElementsAre(1, 0)));
}

TEST(AssignBucketsTest, DtypesNeverShareABucket) {
  std::vector<BucketInput> params = {{40, 0}, {40, 1}, {40, 0}, {40, 1}};
  auto buckets = AssignBuckets(params, {0, 1, 2, 3}, 1000, 1000);
  EXPECT_THAT(buckets, ElementsAre(ElementsAre(0, 2), ElementsAre(1, 3)));
}

TEST(AssignBucketsTest, EveryParameterOnceAndOrderedByFirstReady) {
  std::vector<BucketInput> params = {{10, 0}, {500, 0}, {10, 0}, {10, 0}};
  auto buckets = AssignBuckets(params, {2, 1, 3, 0}, 1, 100);
  EXPECT_THAT(buckets, ElementsAre(ElementsAre(2), ElementsAre(1), ElementsAre(3, 0)));
}

TEST(AssignBucketsTest, EmptyInput) { EXPECT_TRUE(AssignBuckets({}, {}, 1, 1).empty()); }

}  // namespace
}  // namespace chorus
