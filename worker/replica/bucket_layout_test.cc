#include "worker/replica/bucket_layout.h"

#include <torch/types.h>

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;

TEST(BucketLayoutTest, CapBytesFromMegabytes) {
  EXPECT_EQ(BucketCapBytes(25), 25 * 1024 * 1024);
  EXPECT_EQ(BucketCapBytes(0.5), 512 * 1024);
  EXPECT_EQ(BucketCapBytes(1e-9), 1);
}

TEST(BucketLayoutTest, AssignsByBytesAndDtype) {
  // 400, 400, 200 and 800 bytes; the third is a double tensor.
  std::vector<at::Tensor> tensors = {torch::zeros({100}), torch::zeros({10, 10}),
                                     torch::zeros({25}, torch::kDouble), torch::zeros({200})};
  EXPECT_THAT(AssignTensorBuckets(tensors, {3, 2, 1, 0}, 800, 800),
              ElementsAre(ElementsAre(3), ElementsAre(2), ElementsAre(1, 0)));
  EXPECT_THAT(AssignTensorBuckets(tensors, {1, 0}, 1000, 1000), ElementsAre(ElementsAre(1, 0)));
  EXPECT_EQ(TotalElements(tensors), 425);
}

TEST(BucketLayoutTest, ViewsShareTheFlatBlockBackToBack) {
  std::vector<at::Tensor> members = {torch::ones({2, 3}), torch::ones({4}), torch::ones({1, 1, 2})};
  at::Tensor flat = torch::arange(12, torch::kFloat);
  std::vector<at::Tensor> views = FlatViews(flat, members);
  ASSERT_EQ(views.size(), 3u);
  EXPECT_EQ(views[0].sizes(), members[0].sizes());
  EXPECT_EQ(views[1].sizes(), members[1].sizes());
  EXPECT_EQ(views[2].sizes(), members[2].sizes());
  EXPECT_EQ(views[0][1][2].item<float>(), 5);
  EXPECT_EQ(views[1][0].item<float>(), 6);
  EXPECT_EQ(views[2][0][0][1].item<float>(), 11);
  views[1].fill_(-1);
  EXPECT_EQ(flat[5].item<float>(), 5);
  EXPECT_EQ(flat[6].item<float>(), -1);
  EXPECT_EQ(flat[9].item<float>(), -1);
  EXPECT_EQ(flat[10].item<float>(), 10);
  flat.zero_();
  EXPECT_EQ(views[2].sum().item<float>(), 0);
}

TEST(BucketLayoutTest, ViewsStartAtTheBlocksOwnOffset) {
  at::Tensor storage = torch::arange(10, torch::kFloat);
  at::Tensor flat = storage.narrow(0, 4, 6);
  std::vector<at::Tensor> views = FlatViews(flat, {torch::ones({3}), torch::ones({3})});
  EXPECT_EQ(views[0][0].item<float>(), 4);
  EXPECT_EQ(views[1][2].item<float>(), 9);
}

TEST(BucketLayoutTest, ViewsAreNotAutogradViews) {
  // A parameter's gradient may be a view of a bucket, and LibTorch's
  // Optimizer::zero_grad detaches gradients in place.
  at::Tensor flat = torch::zeros({6});
  at::Tensor param = torch::zeros({2, 3}).requires_grad_(true);
  std::vector<at::Tensor> views = FlatViews(flat, {param});
  EXPECT_FALSE(views[0].is_view());
  EXPECT_FALSE(views[0].requires_grad());
  param.mutable_grad() = views[0];
  param.mutable_grad().detach_();
  param.mutable_grad().add_(1);
  EXPECT_EQ(flat.sum().item<float>(), 6);
}

}  // namespace
}  // namespace chorus
