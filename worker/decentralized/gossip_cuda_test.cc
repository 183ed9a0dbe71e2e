// Gossip averaging on CUDA tensors over NCCL, one rank per GPU: each rank's
// parameters after a few steps equal the closed form of the topology's mixing
// (x_{t+1} = W_t x_t - lr * grad, as decentralized_data_parallel_test checks
// on the CPU), they stay on the rank's GPU, and GlobalAverage gives the mean
// over the ranks. One GPU runs the device path alone (a ring of one); two
// run the exchanges themselves (NCCL send/recv between the GPUs).
//
// Runs only with --config=cuda (or the CMake build in tests/gpu), a CUDA
// LibTorch and GPUs; elsewhere each case skips and says what is missing.

#include <torch/cuda.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "chorus/decentralized_data_parallel.h"
#include "chorus/topology.h"
#include "gtest/gtest.h"
#include "worker/comm/require_gpus.h"

namespace chorus {
namespace {

// Rank r trains w1[3], w2[2,2], w3[5] on 0.5 * ||w - a_r||^2 with SGD; the
// gradient w - a_r lets the test follow every step in closed form.
constexpr int kDim = 12;
constexpr int kSteps = 6;
constexpr double kLr = 0.1;
const std::vector<std::vector<int64_t>> kShapes = {{3}, {2, 2}, {5}};

double Initial(int rank, int k) { return rank + 0.1 * k + 0.01 * k * k; }
double Target(int rank, int k) { return std::cos(1.3 * rank + k); }

// The rank's parameters (or targets, with `target`) on `device`.
std::vector<at::Tensor> Tensors(int rank, bool target, const torch::Device& device) {
  std::vector<at::Tensor> out;
  int k = 0;
  for (const std::vector<int64_t>& shape : kShapes) {
    at::Tensor t = torch::empty(shape, torch::kFloat);
    auto flat = t.view({-1});
    for (int64_t j = 0; j < t.numel(); ++j, ++k) {
      flat[j] = target ? Target(rank, k) : Initial(rank, k);
    }
    out.push_back(t.to(device));
  }
  return out;
}

// x_{t+1,i} = sum_j W_t[i][j] x_{t,j} - lr * (x_{t,i} - a_i), W_0 = I.
std::vector<std::vector<double>> ClosedForm(const TopologyConfig& config, int n) {
  const Topology topology = *Topology::Create(config, n);
  std::vector<std::vector<double>> x(n, std::vector<double>(kDim));
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < kDim; ++k) x[r][k] = Initial(r, k);
  }
  for (int t = 0; t < kSteps; ++t) {
    std::vector<double> w(n * n, 0.0);
    if (t == 0) {
      for (int i = 0; i < n; ++i) w[i * n + i] = 1;
    } else {
      w = topology.MixingMatrix(t);
    }
    std::vector<std::vector<double>> next(n, std::vector<double>(kDim, 0.0));
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < kDim; ++k) {
        for (int j = 0; j < n; ++j) next[i][k] += w[i * n + j] * x[j][k];
        next[i][k] -= kLr * (x[i][k] - Target(i, k));
      }
    }
    x = next;
  }
  return x;
}

std::vector<double> Flat(const std::vector<NamedTensor>& params) {
  std::vector<double> out;
  for (const NamedTensor& p : params) {
    const at::Tensor f = p.tensor.detach().reshape({-1}).to(torch::kCPU, torch::kDouble);
    for (int64_t j = 0; j < f.numel(); ++j) out.push_back(f[j].item<double>());
  }
  return out;
}

struct RankResult {
  std::vector<double> trained;   // after kSteps
  std::vector<double> averaged;  // after GlobalAverage
  bool on_device = false;
};

// Trains `world` ranks (threads, GPU r for rank r) with gossip over NCCL.
std::vector<RankResult> TrainOnGpus(int world, const TopologyConfig& topology) {
  std::vector<RankResult> results(world);
  RunNcclRanks(world, [&](int rank, Communicator& comm) {
    const torch::Device device(torch::kCUDA, rank);
    std::vector<NamedTensor> params;
    std::vector<at::Tensor> initial = Tensors(rank, /*target=*/false, device);
    for (size_t i = 0; i < initial.size(); ++i) {
      params.push_back({"w" + std::to_string(i + 1), initial[i].set_requires_grad(true)});
    }
    const std::vector<at::Tensor> targets = Tensors(rank, /*target=*/true, device);
    DecentralizedOptions options;
    options.topology = topology;
    options.bucket_cap_mb = 1e-6;  // one parameter per bucket: several exchanges a step
    auto engine = DecentralizedDataParallel::Create(
        params, {}, comm,
        [](const std::vector<at::Tensor>& p) {
          return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(kLr));
        },
        nullptr, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (int t = 0; t < kSteps; ++t) {
      torch::Tensor loss = torch::zeros({}, torch::TensorOptions(device));
      for (size_t i = 0; i < params.size(); ++i) {
        loss = loss + 0.5 * (params[i].tensor - targets[i]).pow(2).sum();
      }
      loss.backward();
      absl::Status s = (*engine)->FinishStep();
      ASSERT_TRUE(s.ok()) << s;
    }
    RankResult& out = results[rank];
    out.on_device = std::all_of(params.begin(), params.end(),
                                [&](const NamedTensor& p) { return p.tensor.device() == device; });
    out.trained = Flat(params);
    absl::Status s = (*engine)->GlobalAverage();
    ASSERT_TRUE(s.ok()) << s;
    out.averaged = Flat(params);
  });
  return results;
}

void ExpectMatchesClosedForm(int world) {
  TopologyConfig topology;
  topology.kind = TopologyKind::kRing;
  const std::vector<std::vector<double>> want = ClosedForm(topology, world);
  const std::vector<RankResult> got = TrainOnGpus(world, topology);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(got[r].on_device) << "rank " << r << "'s parameters left GPU " << r;
    ASSERT_EQ(got[r].trained.size(), static_cast<size_t>(kDim)) << "rank " << r;
    ASSERT_EQ(got[r].averaged.size(), static_cast<size_t>(kDim)) << "rank " << r;
    for (int k = 0; k < kDim; ++k) {
      EXPECT_NEAR(got[r].trained[k], want[r][k], 1e-5 * std::max(1.0, std::abs(want[r][k])))
          << "rank " << r << " element " << k;
      double mean = 0;
      for (int j = 0; j < world; ++j) mean += want[j][k] / world;
      EXPECT_NEAR(got[r].averaged[k], mean, 1e-5 * std::max(1.0, std::abs(mean)))
          << "rank " << r << " element " << k << " after GlobalAverage";
    }
  }
}

TEST(GossipCudaTest, OneGpuTrainsOnTheDeviceAsTheClosedFormSays) {
  REQUIRE_GPUS(1);
  ExpectMatchesClosedForm(1);
}

TEST(GossipCudaTest, TwoGpusGossipOverNcclAsTheClosedFormSays) {
  REQUIRE_GPUS(2);
  ExpectMatchesClosedForm(2);
}

}  // namespace
}  // namespace chorus
