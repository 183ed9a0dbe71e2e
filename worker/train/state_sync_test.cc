#include "worker/train/state_sync.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <memory>
#include <optional>
#include <vector>

#include "worker/comm/rank_threads.h"

namespace chorus {
namespace {

// One linear layer and a buffer, initialized from `seed`.
class SmallModel : public Model {
 public:
  explicit SmallModel(int seed) {
    torch::manual_seed(seed);
    weight_ = torch::randn({6, 4}).requires_grad_();
    bias_ = torch::randn({6}).requires_grad_();
    count_ = torch::full({2}, static_cast<float>(seed));
  }
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& input) override {
    return torch::addmm(bias_, input, weight_.t());
  }
  std::vector<NamedTensor> NamedParameters() override {
    return {{"fc.weight", weight_}, {"fc.bias", bias_}};
  }
  std::vector<NamedTensor> NamedBuffers() override { return {{"count", count_}}; }
  void SetTraining(bool) override {}

 private:
  at::Tensor weight_, bias_, count_;
};

at::Tensor Momentum(torch::optim::SGD& sgd, const at::Tensor& param) {
  const std::string key = c10::guts::to_string(param.unsafeGetTensorImpl());
  return static_cast<torch::optim::SGDParamState&>(*sgd.state().at(key)).momentum_buffer();
}

// Ranks 0 and 1 survived holding steps 5 and 7 (with momentum); rank 2 is
// a newcomer holding nothing. Rank 1's state wins and lands on every rank.
TEST(StateSyncTest, TheNewestStateGoesFromTheLowestRankHoldingItToEveryMember) {
  std::vector<std::vector<at::Tensor>> params(3);
  std::vector<at::Tensor> momentum(3);
  std::vector<absl::StatusOr<std::optional<SharedState>>> shared(3,
                                                                 absl::UnknownError("not run"));
  at::Tensor expected_weight, expected_momentum;
  RunGlooRanks(3, [&](int rank, Communicator& comm) {
    SmallModel model(/*seed=*/10 + rank);
    auto sgd = std::make_unique<torch::optim::SGD>(model.Parameters(),
                                                   torch::optim::SGDOptions(0.1).momentum(0.9));
    std::optional<Snapshot> held;
    if (rank < 2) {
      (*model.Forward(torch::ones({3, 4}))).sum().backward();
      sgd->step();
      TrainingPosition position;
      position.step = rank == 0 ? 5 : 7;
      position.epoch = 1;
      position.epoch_offset = rank == 0 ? 320 : 448;
      position.world_size = 3;
      held = TakeSnapshot(model, {sgd.get()}, position);
      if (rank == 1) {
        expected_weight = model.Parameters()[0].detach().clone();
        expected_momentum = Momentum(*sgd, model.Parameters()[0]).clone();
      }
    }
    // The new generation builds its optimizer afresh (no momentum yet), as
    // the strategy does.
    sgd = std::make_unique<torch::optim::SGD>(model.Parameters(),
                                              torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::NoGradGuard no_grad;
    shared[rank] = ShareNewestState(comm, model, {sgd.get()}, held ? &*held : nullptr,
                                    absl::Now() + absl::Seconds(30));
    for (const at::Tensor& p : model.Parameters()) params[rank].push_back(p.detach().clone());
    params[rank].push_back(model.NamedBuffers()[0].tensor.clone());
    if (shared[rank].ok() && shared[rank]->has_value()) {
      momentum[rank] = Momentum(*sgd, model.Parameters()[0]).clone();
    }
  });
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(shared[rank].ok()) << "rank " << rank << ": " << shared[rank].status();
    ASSERT_TRUE(shared[rank]->has_value()) << "rank " << rank;
    const SharedState& state = **shared[rank];
    EXPECT_EQ(state.source, 1);
    EXPECT_GT(state.bytes, 6 * 4 * 4);
    EXPECT_EQ(state.position.step, 7);
    EXPECT_EQ(state.position.epoch, 1);
    EXPECT_EQ(state.position.epoch_offset, 448);
    EXPECT_EQ(state.position.world_size, 3);
    EXPECT_TRUE(torch::equal(params[rank][0], expected_weight)) << "rank " << rank;
    for (size_t i = 0; i < params[rank].size(); ++i) {
      EXPECT_TRUE(torch::equal(params[rank][i], params[1][i]))
          << "rank " << rank << " tensor " << i;
    }
    EXPECT_EQ(params[rank][2][0].item<float>(), 11.0f) << "rank 1's buffer";
    EXPECT_TRUE(torch::equal(momentum[rank], expected_momentum)) << "rank " << rank;
  }
}

// No member holds state (every survivor was lost, or none had completed a
// step): every member hears so from the same all-reduce, and nothing is
// loaded, so each keeps its model for the generation to start over
// (Note [Starting over] in trainer.cc).
TEST(StateSyncTest, WhenNoMemberHoldsStateNothingIsSharedAndEveryMemberSaysSo) {
  std::vector<absl::StatusOr<std::optional<SharedState>>> shared(
      2, absl::UnknownError("not run"));
  std::vector<bool> unchanged(2, false);
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    SmallModel model(/*seed=*/30 + rank);
    const at::Tensor before = model.Parameters()[0].detach().clone();
    torch::optim::SGD sgd(model.Parameters(), torch::optim::SGDOptions(0.1));
    shared[rank] = ShareNewestState(comm, model, {&sgd}, nullptr, absl::Now() + absl::Seconds(30));
    unchanged[rank] = torch::equal(model.Parameters()[0], before);
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(shared[rank].ok()) << "rank " << rank << ": " << shared[rank].status();
    EXPECT_FALSE(shared[rank]->has_value()) << "rank " << rank;
    EXPECT_TRUE(unchanged[rank]) << "rank " << rank << "'s model was touched";
  }
}

// Note [Re-formed gossip]: ranks 0 and 2 survived with models of their
// own, rank 1 is a newcomer. Every member ends with the mean of the two
// survivors' parameters and float buffers, the same bits on every rank; an
// integer buffer keeps its value.
class ModelWithStepCounter : public SmallModel {
 public:
  explicit ModelWithStepCounter(int seed) : SmallModel(seed) {
    steps_ = torch::full({1}, seed, torch::kLong);
  }
  std::vector<NamedTensor> NamedBuffers() override {
    std::vector<NamedTensor> buffers = SmallModel::NamedBuffers();
    buffers.push_back({"steps", steps_});
    return buffers;
  }

 private:
  at::Tensor steps_;
};

TEST(StateSyncTest, EveryMemberGetsTheMeanOfTheSurvivorsModels) {
  std::vector<std::vector<at::Tensor>> before(3), after(3);
  std::vector<absl::StatusOr<int>> averaged(3, absl::UnknownError("not run"));
  RunGlooRanks(3, [&](int rank, Communicator& comm) {
    ModelWithStepCounter model(/*seed=*/20 + rank);
    for (const NamedTensor& t : model.NamedParameters()) before[rank].push_back(t.tensor.clone());
    for (const NamedTensor& t : model.NamedBuffers()) before[rank].push_back(t.tensor.clone());
    std::optional<Snapshot> held;
    if (rank != 1) {
      TrainingPosition position;
      position.step = 9;
      held = TakeSnapshot(model, {}, position);
      // Training goes on after the snapshot was taken (a step cut short):
      // the held model, not the live one, is what counts.
      torch::NoGradGuard no_grad;
      model.Parameters()[0].add_(100.0);
    }
    averaged[rank] =
        AverageHeldModels(comm, model, held ? &*held : nullptr, absl::Now() + absl::Seconds(30));
    for (const NamedTensor& t : model.NamedParameters()) after[rank].push_back(t.tensor.clone());
    for (const NamedTensor& t : model.NamedBuffers()) after[rank].push_back(t.tensor.clone());
  });
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(averaged[rank].ok()) << "rank " << rank << ": " << averaged[rank].status();
    EXPECT_EQ(*averaged[rank], 2);
    ASSERT_EQ(after[rank].size(), 4u);
    for (size_t i = 0; i < 3; ++i) {  // weight, bias, the float buffer
      const at::Tensor mean =
          ((before[0][i].to(at::kDouble) + before[2][i].to(at::kDouble)) / 2).to(at::kFloat);
      EXPECT_TRUE(torch::equal(after[rank][i], mean)) << "rank " << rank << " tensor " << i;
      EXPECT_TRUE(torch::equal(after[rank][i], after[0][i])) << "rank " << rank << " tensor " << i;
    }
    EXPECT_FALSE(torch::equal(after[rank][0], before[0][0])) << "a mean, not rank 0's model";
    EXPECT_EQ(after[rank][3].item<int64_t>(), 20 + rank) << "integer buffers are left alone";
  }
}

TEST(StateSyncTest, AveragingWithNoHeldModelIsAnError) {
  std::vector<absl::Status> status(2);
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    SmallModel model(rank);
    status[rank] =
        AverageHeldModels(comm, model, nullptr, absl::Now() + absl::Seconds(30)).status();
  });
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  }
}

}  // namespace
}  // namespace chorus
