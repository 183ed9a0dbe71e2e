// Parity with PyTorch DDP itself: Debian's PyTorch writes a TorchScript model,
// its data, and the parameters PyTorch DDP (gloo, 2 processes) reaches after
// K steps; Chorus DDP trains the same TorchScript module from the same start
// on the same data and must land on the same parameters.

#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/script.h>
#include <torch/types.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "chorus/distributed_data_parallel.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"
#include "worker/ddp/reference_files.h"

namespace chorus {
namespace {

constexpr int kSteps = 12;
constexpr int kWorld = 2;
constexpr int kBatch = 4;

TEST(PytorchParityTest, SameParametersAsPytorchDdp) {
  const std::string out = std::string(std::getenv("TEST_TMPDIR")) + "/parity";
  const std::string script = "worker/ddp/testdata/pytorch_ddp_reference.py";
  const std::string command =
      "/usr/bin/python3 " + script + " " + out + " " + std::to_string(kSteps) + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0)
      << "the PyTorch reference run failed (needs Debian's python3-torch; run deploy/setup.sh)";

  std::vector<float> xs = ReadReferenceArray<float>(out + "/x.bin");
  std::vector<int64_t> ys = ReadReferenceArray<int64_t>(out + "/y.bin");
  std::vector<float> want = ReadReferenceArray<float>(out + "/final.bin");
  ASSERT_EQ(xs.size(), static_cast<size_t>(kSteps * kWorld * kBatch * 10));
  torch::Tensor x = torch::from_blob(xs.data(), {kSteps, kWorld * kBatch, 10}).clone();
  torch::Tensor y = torch::from_blob(ys.data(), {kSteps, kWorld * kBatch}, torch::kLong).clone();

  MemoryStore store;
  std::vector<torch::Tensor> finals(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      at::set_num_threads(1);
      GlooOptions options;
      options.rank = rank;
      options.size = kWorld;
      auto comm = CreateGlooCommunicator(options, store);
      ASSERT_TRUE(comm.ok()) << comm.status();
      torch::jit::Module module = torch::jit::load(out + "/model.pt");
      module.train();
      auto ddp = DistributedDataParallel::ForScriptModule(module, **comm, DdpOptions());
      ASSERT_TRUE(ddp.ok()) << ddp.status();
      std::vector<torch::Tensor> params;
      for (const auto& p : module.parameters()) params.push_back(p);
      torch::optim::SGD opt(params, torch::optim::SGDOptions(0.05).momentum(0.9));
      for (int s = 0; s < kSteps; ++s) {
        opt.zero_grad();
        ASSERT_TRUE((*ddp)->PrepareForBackward().ok());
        torch::Tensor input = x[s].narrow(0, rank * kBatch, kBatch);
        torch::Tensor logits = module.forward({input}).toTensor();
        torch::nn::functional::cross_entropy(logits, y[s].narrow(0, rank * kBatch, kBatch))
            .backward();
        absl::Status sync = (*ddp)->FinishGradientSync();
        ASSERT_TRUE(sync.ok()) << sync;
        opt.step();
      }
      std::vector<torch::Tensor> flat;
      for (const auto& item : module.named_parameters())
        flat.push_back(item.value.detach().reshape({-1}));
      finals[rank] = torch::cat(flat);
    });
  }
  for (auto& t : threads) t.join();
  torch::Tensor reference =
      torch::from_blob(want.data(), {static_cast<int64_t>(want.size())}).clone();
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_TRUE(finals[rank].defined());
    ASSERT_EQ(finals[rank].numel(), reference.numel());
    const double max_rel =
        ((finals[rank] - reference).abs() / (reference.abs() + 1e-3)).max().item<double>();
    EXPECT_TRUE(torch::allclose(finals[rank], reference, 1e-5, 1e-6))
        << "rank " << rank << " max relative difference " << max_rel;
  }
}

}  // namespace
}  // namespace chorus
