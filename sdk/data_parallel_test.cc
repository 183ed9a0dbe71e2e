#include "chorus/data_parallel.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <mutex>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/rank_threads.h"

namespace chorus {
namespace {

// An agent as an RL program has it: two networks trained together, a
// target network that is never trained or synchronized.
struct AgentImpl : torch::nn::Module {
  AgentImpl()
      : actor(register_module("actor", torch::nn::Linear(4, 2))),
        critic(register_module("critic", torch::nn::Linear(4, 1))),
        target(register_module("target", torch::nn::Linear(4, 1))) {}
  torch::nn::Linear actor, critic, target;
};
TORCH_MODULE(Agent);

TEST(DataParallelTest, PrefixesSelectParameters) {
  Agent agent;
  absl::StatusOr<std::vector<NamedTensor>> params = NamedParameters(*agent, {"actor.", "critic."});
  ASSERT_TRUE(params.ok()) << params.status();
  std::vector<std::string> names;
  for (const NamedTensor& t : *params) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"actor.weight", "actor.bias", "critic.weight",
                                             "critic.bias"}));
  EXPECT_EQ(NamedParameters(*agent)->size(), 6u);
}

TEST(DataParallelTest, PrefixMatchingNothingIsNamed) {
  Agent agent;
  absl::StatusOr<std::vector<NamedTensor>> params = NamedParameters(*agent, {"policy."});
  EXPECT_EQ(params.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(params.status().message().rfind("parameter prefix 'policy.' matches no parameter", 0),
            0u)
      << params.status();
  EXPECT_NE(params.status().message().find("actor.weight"), std::string::npos);
}

// DDP on the actor and critic only, with a branch (the critic) that only
// rank 0 uses: the trained networks end identical, the target networks keep
// their own (different) values.
TEST(DataParallelTest, SubsetStaysInSyncAndTheRestStaysLocal) {
  constexpr int kRanks = 2;
  std::mutex mu;
  std::vector<std::vector<at::Tensor>> trained(kRanks), target(kRanks);
  RunGlooRanks(kRanks, [&](int rank, Communicator& comm) {
    torch::manual_seed(100 + rank);  // different initial values everywhere
    Agent agent;
    DdpOptions options;
    options.find_unused_parameters = true;
    auto ddp = DistributedDataParallelFor(*agent, {"actor.", "critic."}, comm, options);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    ASSERT_TRUE((*ddp)->BroadcastParameters(0).ok());
    torch::optim::SGD sgd(agent->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      ASSERT_TRUE((*ddp)->PrepareForBackward().ok());
      sgd.zero_grad();
      at::Tensor x = torch::randn({8, 4});
      at::Tensor loss = agent->actor->forward(x).pow(2).mean();
      if (rank == 0) loss = loss + agent->critic->forward(x).pow(2).mean();
      loss.backward();
      absl::Status synced = (*ddp)->FinishGradientSync();
      ASSERT_TRUE(synced.ok()) << synced;
      sgd.step();
    }
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& p : agent->named_parameters()) {
      if (p.key().rfind("target.", 0) == 0) {
        target[rank].push_back(p.value().detach().clone());
      } else {
        trained[rank].push_back(p.value().detach().clone());
      }
    }
  });
  ASSERT_EQ(trained[0].size(), 4u);
  for (size_t i = 0; i < trained[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(trained[0][i], trained[1][i])) << "parameter " << i;
  }
  ASSERT_EQ(target[0].size(), 2u);
  EXPECT_FALSE(torch::equal(target[0][0], target[1][0]));
}

}  // namespace
}  // namespace chorus
