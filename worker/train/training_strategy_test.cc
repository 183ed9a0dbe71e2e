#include "worker/train/training_strategy.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/rank_threads.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

// y = w x + b with w [1, 3]; every rank starts from rank-dependent values
// (the strategy broadcasts rank 0's).
class TinyModel : public Model {
 public:
  explicit TinyModel(int rank)
      : weight_(torch::full({1, 3}, 1.0f + rank).requires_grad_(true)),
        bias_(torch::full({1}, -1.0f * rank).requires_grad_(true)) {}
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& x) override {
    return torch::addmm(bias_, x, weight_.t());
  }
  std::vector<NamedTensor> NamedParameters() override {
    return {{"fc.weight", weight_}, {"fc.bias", bias_}};
  }
  std::vector<NamedTensor> NamedBuffers() override { return {}; }
  void SetTraining(bool) override {}

  std::vector<float> Values() const {
    std::vector<float> out;
    for (const at::Tensor& t : {weight_, bias_}) {
      at::Tensor flat = t.detach().reshape({-1});
      for (int64_t i = 0; i < flat.numel(); ++i) out.push_back(flat[i].item<float>());
    }
    return out;
  }
  void Add(float v) {
    torch::NoGradGuard no_grad;
    weight_.add_(v);
    bias_.add_(v);
  }

 private:
  at::Tensor weight_;
  at::Tensor bias_;
};

v1::JobSpec DdpSpec(int grad_accum_steps) {
  v1::JobSpec spec;
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_lr(0.5);
  v1::DdpStrategy& d = *spec.mutable_strategy()->mutable_ddp();
  d.set_bucket_cap_mb(25);
  d.set_first_bucket_mb(1);
  d.set_grad_accum_steps(grad_accum_steps);
  return spec;
}

v1::JobSpec DecentralizedSpec(v1::DecentralizedStrategy::Topology topology, bool per_rank) {
  v1::JobSpec spec;
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_lr(0.5);
  v1::DecentralizedStrategy& d = *spec.mutable_strategy()->mutable_decentralized();
  d.set_topology(topology);
  d.set_bucket_cap_mb(25);
  spec.mutable_checkpoint()->set_per_rank(per_rank);
  return spec;
}

absl::Status CreateOn(int ranks, const v1::JobSpec& spec) {
  std::vector<absl::Status> statuses(ranks);
  RunGlooRanks(ranks, [&](int rank, Communicator& comm) {
    TinyModel model(rank);
    TrainingProgress progress;
    statuses[rank] = CreateTrainingStrategy(spec, model, comm, progress).status();
  });
  for (int r = 1; r < ranks; ++r) EXPECT_EQ(statuses[r].code(), statuses[0].code()) << "rank " << r;
  return statuses[0];
}

TEST(TrainingStrategyTest, FactoryErrorsNameTheField) {
  absl::Status accum = CreateOn(1, DdpSpec(0));
  EXPECT_EQ(accum.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(accum.message(), "job spec: strategy.ddp.grad_accum_steps must be >= 1, got 0");

  v1::JobSpec cap = DdpSpec(1);
  cap.mutable_strategy()->mutable_ddp()->set_bucket_cap_mb(-3);
  absl::Status ddp_cap = CreateOn(1, cap);
  EXPECT_EQ(ddp_cap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ddp_cap.message()),
              HasSubstr("bucket_cap_mb and first_bucket_mb must be > 0, got -3"));

  v1::JobSpec dec_cap = DecentralizedSpec(v1::DecentralizedStrategy::RING, false);
  dec_cap.mutable_strategy()->mutable_decentralized()->set_bucket_cap_mb(0);
  absl::Status dec = CreateOn(1, dec_cap);
  EXPECT_EQ(dec.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dec.message()),
              HasSubstr("decentralized: bucket_cap_mb must be > 0, got 0"));
}

TEST(TrainingStrategyTest, FactoryRefusesATopologyThatCannotServeTheWorld) {
  absl::Status ring = CreateOn(3, DecentralizedSpec(v1::DecentralizedStrategy::RING, false));
  EXPECT_EQ(ring.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ring.message()), HasSubstr("needs an even number of ranks, got 3"));
  EXPECT_THAT(std::string(ring.message()), HasSubstr("nearest world sizes that work: 2 and 4"));
}

TEST(TrainingStrategyTest, DdpAccumulatesAveragesAndStepsOnce) {
  std::vector<std::vector<float>> finals(2);
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    TinyModel model(rank);
    TrainingProgress progress;
    auto strategy = CreateTrainingStrategy(DdpSpec(2), model, comm, progress);
    ASSERT_TRUE(strategy.ok()) << strategy.status();
    TrainingStrategy& s = **strategy;
    EXPECT_EQ(s.accumulation_steps(), 2);
    EXPECT_FALSE(s.checkpoint_parts().per_rank);
    EXPECT_FALSE(s.checkpoint_parts().every_rank_joins);
    EXPECT_EQ(s.optimizers().size(), 1u);
    EXPECT_EQ(model.Values(), (std::vector<float>{1, 1, 1, 0})) << "rank 0's parameters everywhere";
    s.set_total_steps(1);
    s.BeginStep();
    // d loss / d w = x summed over micro-batches, d loss / d b = 1 each: on
    // rank r the micro-batch inputs are (r+1) * (1, 2, 3) and 0.
    for (int m = 0; m < 2; ++m) {
      ASSERT_TRUE(s.BeforeForward().ok());
      at::Tensor x =
          m == 0 ? torch::tensor({{1.0f, 2.0f, 3.0f}}) * (rank + 1) : torch::zeros({1, 3});
      at::Tensor loss = model.Forward(x)->sum();
      absl::StatusOr<double> waited = s.Backward(loss, m == 1);
      ASSERT_TRUE(waited.ok()) << waited.status();
      EXPECT_GE(*waited, 0);
    }
    EXPECT_EQ(progress.phase.load(), v1::COLLECTIVE);
    ASSERT_TRUE(s.Step(0).ok());
    EXPECT_EQ(progress.phase.load(), v1::OPTIMIZER);
    finals[rank] = model.Values();
    // Rank 0 alone decides on checkpoint requests, at every step.
    absl::StatusOr<std::optional<int64_t>> agreed = s.AgreedCheckpointRequests(7, 3 + rank);
    ASSERT_TRUE(agreed.ok());
    if (rank == 0) {
      EXPECT_EQ(*agreed, std::optional<int64_t>(3));
    } else {
      EXPECT_FALSE(agreed->has_value());
    }
  });
  // Averaged gradient: w: mean of (1,2,3) and (2,4,6) = (1.5, 3, 4.5); b: 2
  // micro-batches = 2. SGD with lr 0.5.
  const std::vector<float> want = {1 - 0.75f, 1 - 1.5f, 1 - 2.25f, 0 - 1.0f};
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(finals[r].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_FLOAT_EQ(finals[r][i], want[i]) << "rank " << r << " #" << i;
  }
}

TEST(TrainingStrategyTest, DdpClipsTheAveragedGradient) {
  std::vector<float> final_values;
  RunGlooRanks(1, [&](int rank, Communicator& comm) {
    TinyModel model(rank);
    TrainingProgress progress;
    v1::JobSpec spec = DdpSpec(1);
    spec.set_grad_clip_norm(1.0);
    auto strategy = CreateTrainingStrategy(spec, model, comm, progress);
    ASSERT_TRUE(strategy.ok()) << strategy.status();
    (*strategy)->set_total_steps(1);
    (*strategy)->BeginStep();
    ASSERT_TRUE((*strategy)->BeforeForward().ok());
    // Gradient (3, 0, 0) for w and 4 for b: norm 5.
    at::Tensor loss = model.Forward(torch::tensor({{3.0f, 0.0f, 0.0f}}))->sum() * 1.0;
    loss = loss + model.Forward(torch::zeros({1, 3}))->sum() * 3.0;
    ASSERT_TRUE((*strategy)->Backward(loss, true).ok());
    ASSERT_TRUE((*strategy)->Step(0).ok());
    final_values = model.Values();
  });
  const float scale = 0.5f / 5.0f;
  EXPECT_NEAR(final_values[0], 1 - 3 * scale, 1e-6);
  EXPECT_NEAR(final_values[1], 1, 1e-6);
  EXPECT_NEAR(final_values[3], 0 - 4 * scale, 1e-6);
}

TEST(TrainingStrategyTest, DecentralizedAgreesOnRequestsEveryTenStepsAndAveragesForEvaluation) {
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    TinyModel model(rank);
    TrainingProgress progress;
    auto strategy = CreateTrainingStrategy(DecentralizedSpec(v1::DecentralizedStrategy::RING, true),
                                           model, comm, progress);
    ASSERT_TRUE(strategy.ok()) << strategy.status();
    TrainingStrategy& s = **strategy;
    EXPECT_EQ(s.accumulation_steps(), 1);
    EXPECT_TRUE(s.checkpoint_parts().per_rank);
    EXPECT_TRUE(s.checkpoint_parts().every_rank_joins);

    absl::StatusOr<std::optional<int64_t>> off = s.AgreedCheckpointRequests(7, 5);
    ASSERT_TRUE(off.ok());
    EXPECT_FALSE(off->has_value()) << "checked only every kCheckpointRequestCheckSteps steps";
    absl::StatusOr<std::optional<int64_t>> on =
        s.AgreedCheckpointRequests(2 * kCheckpointRequestCheckSteps, rank == 0 ? 1 : 4);
    ASSERT_TRUE(on.ok()) << on.status();
    EXPECT_EQ(*on, std::optional<int64_t>(4)) << "the highest count any rank has seen";

    // Rank r's own model is rank 0's plus r; evaluation sees the mean.
    model.Add(static_cast<float>(rank));
    std::vector<float> inside;
    ASSERT_TRUE(s.WithGlobalAverage([&] {
                   inside = model.Values();
                   return absl::OkStatus();
                 }).ok());
    EXPECT_EQ(inside, (std::vector<float>{1.5f, 1.5f, 1.5f, 0.5f}));
    EXPECT_EQ(model.Values(),
              rank == 0 ? (std::vector<float>{1, 1, 1, 0}) : (std::vector<float>{2, 2, 2, 1}))
        << "the own model comes back";
    absl::Status failed = s.WithGlobalAverage([] { return absl::DataLossError("body failed"); });
    EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(model.Values()[3], rank == 0 ? 0 : 1) << "reverted after a failing body too";

    ASSERT_TRUE(s.Finish().ok());
    EXPECT_EQ(model.Values(), (std::vector<float>{1.5f, 1.5f, 1.5f, 0.5f}))
        << "the final model is the average";
    std::vector<float> after_finish;
    ASSERT_TRUE(s.WithGlobalAverage([&] {
                   after_finish = model.Values();
                   return absl::OkStatus();
                 }).ok());
    EXPECT_EQ(after_finish, (std::vector<float>{1.5f, 1.5f, 1.5f, 0.5f}));
  });
}

}  // namespace
}  // namespace chorus
