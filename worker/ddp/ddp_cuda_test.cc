// DDP on CUDA tensors over NCCL, one rank per GPU (as many ranks as GPUs, at
// most 2): the same parameters as PyTorch DDP with NCCL from the same start on
// the same data, and the same parameters as one process training the whole
// batch on the CPU, within float tolerance.
//
// Runs only with --config=cuda (or the CMake build in tests/gpu), a CUDA
// LibTorch and a GPU; elsewhere each case skips and says what is missing.
// The PyTorch reference needs a python3 with a CUDA PyTorch: $CHORUS_TEST_PYTHON,
// or python3 on PATH.

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "chorus/distributed_data_parallel.h"
#include "gtest/gtest.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/require_gpus.h"
#include "worker/ddp/reference_files.h"

namespace chorus {
namespace {

constexpr int kSteps = 12;
constexpr int kBatch = 4;

// The reference script's MLP: 10-32-32-3 with ReLU and Tanh.
torch::nn::Sequential MakeModel() {
  return torch::nn::Sequential(torch::nn::Linear(10, 32), torch::nn::ReLU(),
                               torch::nn::Linear(32, 32), torch::nn::Tanh(),
                               torch::nn::Linear(32, 3));
}

void LoadFlat(torch::nn::Module& model, const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : model.parameters()) {
    p.copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  ASSERT_EQ(offset, flat.numel());
}

torch::Tensor Flat(torch::nn::Module& model) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : model.parameters()) parts.push_back(p.detach().cpu().reshape({-1}));
  return torch::cat(parts);
}

// Trains `world` ranks (threads, GPU r for rank r) with Chorus DDP over NCCL
// from `initial` on x[step] / y[step], rank r taking rows [r*B, (r+1)*B);
// returns each rank's final parameters.
std::vector<torch::Tensor> TrainOnGpus(int world, const torch::Tensor& initial,
                                       const torch::Tensor& x, const torch::Tensor& y) {
  std::vector<torch::Tensor> finals(world);
  RunNcclRanks(world, [&](int rank, Communicator& comm) {
    const torch::Device device(torch::kCUDA, rank);
    torch::nn::Sequential model = MakeModel();
    LoadFlat(*model, initial);
    model->to(device);
    auto ddp = DistributedDataParallel::ForModule(*model, comm, DdpOptions());
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    const torch::Tensor xs = x.to(device);
    const torch::Tensor ys = y.to(device);
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      ASSERT_TRUE((*ddp)->PrepareForBackward().ok());
      torch::Tensor logits = model->forward(xs[s].narrow(0, rank * kBatch, kBatch));
      torch::nn::functional::cross_entropy(logits, ys[s].narrow(0, rank * kBatch, kBatch))
          .backward();
      absl::Status sync = (*ddp)->FinishGradientSync();
      ASSERT_TRUE(sync.ok()) << sync;
      opt.step();
    }
    finals[rank] = Flat(*model);
  });
  return finals;
}

TEST(DdpCudaTest, SameParametersAsPytorchDdpWithNccl) {
  REQUIRE_GPUS(1);
  const int world = std::min(UsableGpus(), 2);
  const char* python = std::getenv("CHORUS_TEST_PYTHON");
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string out = std::string(tmp != nullptr ? tmp : "/tmp") + "/ddp_cuda_parity";
  const std::string command = std::string(python != nullptr ? python : "python3") +
                              " worker/ddp/testdata/pytorch_ddp_reference.py " + out + " " +
                              std::to_string(kSteps) + " --device cuda --world " +
                              std::to_string(world) + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0)
      << "the PyTorch reference run failed: " << command
      << " (needs a python3 with a CUDA PyTorch; set CHORUS_TEST_PYTHON)";

  std::vector<float> init = ReadReferenceArray<float>(out + "/initial.bin");
  std::vector<float> xs = ReadReferenceArray<float>(out + "/x.bin");
  std::vector<int64_t> ys = ReadReferenceArray<int64_t>(out + "/y.bin");
  std::vector<float> want = ReadReferenceArray<float>(out + "/final.bin");
  ASSERT_EQ(xs.size(), static_cast<size_t>(kSteps * world * kBatch * 10));
  const torch::Tensor initial =
      torch::from_blob(init.data(), {static_cast<int64_t>(init.size())}).clone();
  const torch::Tensor x = torch::from_blob(xs.data(), {kSteps, world * kBatch, 10}).clone();
  const torch::Tensor y =
      torch::from_blob(ys.data(), {kSteps, world * kBatch}, torch::kLong).clone();
  const torch::Tensor reference =
      torch::from_blob(want.data(), {static_cast<int64_t>(want.size())}).clone();

  std::vector<torch::Tensor> finals = TrainOnGpus(world, initial, x, y);
  for (int rank = 0; rank < world; ++rank) {
    ASSERT_TRUE(finals[rank].defined());
    ASSERT_EQ(finals[rank].numel(), reference.numel());
    const double max_rel =
        ((finals[rank] - reference).abs() / (reference.abs() + 1e-3)).max().item<double>();
    std::cout << "rank " << rank << " of " << world
              << ": max relative difference to PyTorch DDP (NCCL) " << max_rel << "\n";
    EXPECT_TRUE(torch::allclose(finals[rank], reference, 1e-5, 1e-6))
        << "rank " << rank << " max relative difference " << max_rel;
  }
}

TEST(DdpCudaTest, MatchesCpuTrainingWithinFloatTolerance) {
  REQUIRE_GPUS(1);
  const int world = std::min(UsableGpus(), 2);
  torch::manual_seed(7);
  torch::nn::Sequential reference = MakeModel();
  const torch::Tensor initial = Flat(*reference);
  const torch::Tensor x = torch::randn({kSteps, world * kBatch, 10});
  const torch::Tensor y = torch::randint(0, 3, {kSteps, world * kBatch}, torch::kLong);

  // One process on the CPU, the whole batch: what DDP's average stands for.
  torch::optim::SGD opt(reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x[s]), y[s]).backward();
    opt.step();
  }
  const torch::Tensor want = Flat(*reference);
  ASSERT_FALSE(torch::equal(want, initial)) << "training did not move the parameters";

  std::vector<torch::Tensor> finals = TrainOnGpus(world, initial, x, y);
  for (int rank = 0; rank < world; ++rank) {
    ASSERT_TRUE(finals[rank].defined());
    const double max_abs = (finals[rank] - want).abs().max().item<double>();
    std::cout << "rank " << rank << " of " << world << ": max absolute difference to CPU training "
              << max_abs << "\n";
    EXPECT_TRUE(torch::allclose(finals[rank], want, 1e-4, 1e-5))
        << "rank " << rank << " max absolute difference " << max_abs;
  }
}

}  // namespace
}  // namespace chorus
