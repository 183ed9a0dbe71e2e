#include "worker/replica/gradient_clipping.h"

#include <torch/types.h>
#include <torch/utils.h>

// Not self-contained: needs torch/types.h first.
#include <torch/nn/utils/clip_grad.h>

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace chorus {
namespace {

// Parameters with gradients drawn from a fixed seed, scaled by `scale`;
// `with_grad[i]` false leaves parameter i without a gradient.
std::vector<torch::Tensor> Params(double scale, const std::vector<bool>& with_grad) {
  torch::manual_seed(7);
  const std::vector<std::vector<int64_t>> shapes = {{4, 3}, {3}, {2, 5, 2}, {1}};
  std::vector<torch::Tensor> params;
  for (size_t i = 0; i < shapes.size(); ++i) {
    torch::Tensor p = torch::randn(shapes[i]).requires_grad_(true);
    torch::Tensor g = torch::randn(shapes[i]) * scale;
    if (with_grad[i]) p.mutable_grad() = g;
    params.push_back(p);
  }
  return params;
}

std::vector<torch::Tensor> Grads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : params)
    out.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return out;
}

TEST(ClipGradientNormTest, MatchesClipGradNorm) {
  const std::vector<bool> all = {true, true, true, true};
  const std::vector<bool> some = {true, false, true, false};
  for (const std::vector<bool>& with_grad : {all, some}) {
    for (double scale : {0.01, 1.0, 30.0}) {
      for (double max_norm : {0.5, 2.0, 1000.0}) {
        std::vector<torch::Tensor> ours = Params(scale, with_grad);
        std::vector<torch::Tensor> theirs = Params(scale, with_grad);
        const double our_norm = ClipGradientNorm(ours, max_norm);
        const double their_norm = torch::nn::utils::clip_grad_norm_(theirs, max_norm);
        EXPECT_NEAR(our_norm, their_norm, 1e-5 * their_norm) << scale << " " << max_norm;
        const std::vector<torch::Tensor> a = Grads(ours);
        const std::vector<torch::Tensor> b = Grads(theirs);
        for (size_t i = 0; i < a.size(); ++i) {
          ASSERT_EQ(a[i].defined(), b[i].defined()) << i;
          if (!a[i].defined()) continue;
          EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-7))
              << "parameter " << i << " scale " << scale << " max_norm " << max_norm << "\n"
              << a[i] << "\n"
              << b[i];
        }
      }
    }
  }
}

TEST(ClipGradientNormTest, ScalesToTheMaxNormAndReturnsTheNormBefore) {
  torch::Tensor w = torch::zeros({3}).requires_grad_(true);
  torch::Tensor b = torch::zeros({1}).requires_grad_(true);
  w.mutable_grad() = torch::tensor({3.0f, 0.0f, 0.0f});
  b.mutable_grad() = torch::tensor({4.0f});
  EXPECT_DOUBLE_EQ(ClipGradientNorm({w, b}, 1.0), 5.0);
  const double factor = 1.0 / (5.0 + 1e-6);
  EXPECT_NEAR(w.grad()[0].item<double>(), 3 * factor, 1e-7);
  EXPECT_NEAR(b.grad()[0].item<double>(), 4 * factor, 1e-7);
  EXPECT_NEAR(std::hypot(w.grad()[0].item<double>(), b.grad()[0].item<double>()), 1.0, 1e-6);
}

TEST(ClipGradientNormTest, LeavesSmallGradientsAndMissingOnesAlone) {
  torch::Tensor w = torch::zeros({2}).requires_grad_(true);
  torch::Tensor unused = torch::zeros({2}).requires_grad_(true);
  w.mutable_grad() = torch::tensor({0.3f, 0.4f});
  EXPECT_NEAR(ClipGradientNorm({w, unused}, 1.0), 0.5, 1e-7);
  EXPECT_EQ(w.grad()[0].item<float>(), 0.3f);
  EXPECT_EQ(w.grad()[1].item<float>(), 0.4f);
  EXPECT_FALSE(unused.grad().defined());
  EXPECT_EQ(ClipGradientNorm({unused}, 1.0), 0.0);
}

}  // namespace
}  // namespace chorus
