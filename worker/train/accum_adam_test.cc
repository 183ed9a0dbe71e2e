#include "worker/train/accum_adam.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace chorus {
namespace {

// Gradient of step t for element j: a fixed, varied sequence.
double Grad(int t, int j) { return std::sin(0.7 * t + j) + 0.1 * j; }

// The update rule of accum_adam.h in plain doubles.
std::vector<double> Reference(int steps, int accum_iter, double lr, double wd, bool decoupled) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  std::vector<double> p = {0.5, -0.25, 1.0}, m(3, 0), v(3, 0), acc(3, 0);
  int count = 0, committed = 0;
  for (int t = 0; t < steps; ++t) {
    ++count;
    std::vector<double> nm(3), nv(3);
    for (int j = 0; j < 3; ++j) {
      double g = Grad(t, j);
      if (wd != 0 && decoupled) p[j] *= 1 - lr * wd;
      if (wd != 0 && !decoupled) g += wd * p[j];
      acc[j] += g;
      const double mean = acc[j] / count;
      nm[j] = b1 * m[j] + (1 - b1) * mean;
      nv[j] = b2 * v[j] + (1 - b2) * mean * mean;
      const double k = committed + 1;
      p[j] -= lr / (1 - std::pow(b1, k)) * nm[j] / (std::sqrt(nv[j] / (1 - std::pow(b2, k))) + eps);
    }
    if (count == accum_iter) {
      m = nm;
      v = nv;
      acc.assign(3, 0);
      count = 0;
      ++committed;
    }
  }
  return p;
}

std::vector<double> Train(int steps, int accum_iter, double lr, double wd, bool decoupled) {
  torch::Tensor p = torch::tensor({0.5, -0.25, 1.0}, torch::kDouble).set_requires_grad(true);
  AccumAdam opt({p}, AccumAdamOptions(lr)
                         .accum_iter(accum_iter)
                         .weight_decay(wd)
                         .decoupled_weight_decay(decoupled));
  for (int t = 0; t < steps; ++t) {
    p.mutable_grad() = torch::tensor({Grad(t, 0), Grad(t, 1), Grad(t, 2)}, torch::kDouble);
    opt.step();
  }
  return {p[0].item<double>(), p[1].item<double>(), p[2].item<double>()};
}

TEST(AccumAdamTest, FollowsItsUpdateRule) {
  for (int accum : {1, 3}) {
    for (bool decoupled : {false, true}) {
      std::vector<double> got = Train(10, accum, 0.01, 0.1, decoupled);
      std::vector<double> want = Reference(10, accum, 0.01, 0.1, decoupled);
      for (int j = 0; j < 3; ++j) EXPECT_NEAR(got[j], want[j], 1e-12) << accum << " " << decoupled;
    }
  }
}

TEST(AccumAdamTest, WithAccumIterOneItIsAdamAndAdamW) {
  for (bool decoupled : {false, true}) {
    torch::Tensor a = torch::tensor({0.5, -0.25, 1.0}, torch::kDouble).set_requires_grad(true);
    torch::Tensor b = a.detach().clone().set_requires_grad(true);
    AccumAdam ours(
        {a},
        AccumAdamOptions(0.01).accum_iter(1).weight_decay(0.1).decoupled_weight_decay(decoupled));
    std::unique_ptr<torch::optim::Optimizer> theirs;
    if (decoupled) {
      theirs = std::make_unique<torch::optim::AdamW>(
          std::vector<torch::Tensor>{b}, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
    } else {
      theirs = std::make_unique<torch::optim::Adam>(
          std::vector<torch::Tensor>{b}, torch::optim::AdamOptions(0.01).weight_decay(0.1));
    }
    for (int t = 0; t < 8; ++t) {
      torch::Tensor g = torch::tensor({Grad(t, 0), Grad(t, 1), Grad(t, 2)}, torch::kDouble);
      a.mutable_grad() = g.clone();
      b.mutable_grad() = g.clone();
      ours.step();
      theirs->step();
    }
    EXPECT_TRUE(torch::allclose(a, b, 1e-10, 1e-12)) << decoupled << "\n" << a << "\n" << b;
  }
}

TEST(AccumAdamTest, MomentsAdvanceOnlyAtTheEndOfAWindow) {
  torch::Tensor p = torch::zeros({2}).set_requires_grad(true);
  AccumAdam opt({p}, AccumAdamOptions(0.1).accum_iter(4));
  for (int t = 0; t < 3; ++t) {
    p.mutable_grad() = torch::ones({2});
    opt.step();
  }
  auto& s = static_cast<AccumAdamParamState&>(*opt.state().begin()->second);
  EXPECT_EQ(s.step(), 0);
  EXPECT_EQ(s.count(), 3);
  EXPECT_TRUE(torch::equal(s.exp_avg(), torch::zeros({2})));
  p.mutable_grad() = torch::ones({2});
  opt.step();
  EXPECT_EQ(s.step(), 1);
  EXPECT_EQ(s.count(), 0);
  EXPECT_TRUE(torch::allclose(s.exp_avg(), torch::full({2}, 0.1)));
}

}  // namespace
}  // namespace chorus
