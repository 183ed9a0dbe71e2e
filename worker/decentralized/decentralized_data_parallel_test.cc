#include "chorus/decentralized_data_parallel.h"

#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <cmath>
#include <functional>
#include <mutex>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/rank_threads.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

// Every rank trains three tensors w1[3], w2[2,2], w3[5] (12 numbers) on
// 0.5 * ||w - a_rank||^2, whose gradient w - a_rank the test can follow in
// closed form.
constexpr int kDim = 12;
const std::vector<std::vector<int64_t>> kShapes = {{3}, {2, 2}, {5}};

double Initial(int rank, int k) { return rank + 0.1 * k + 0.01 * k * k; }
double Target(int rank, int k) { return std::cos(1.3 * rank + k); }

struct Problem {
  int ranks = 4;
  TopologyConfig topology;
  int steps = 5;
  double lr = 0.1;
  bool reuse_w1 = false;  // w1's loss term appears twice
  int unused_rank = -1;   // this rank's loss leaves w3 out
};

std::vector<NamedTensor> MakeParams(int rank) {
  std::vector<NamedTensor> params;
  int k = 0;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    at::Tensor t = torch::empty(kShapes[i], torch::kFloat);
    auto flat = t.view({-1});
    for (int64_t j = 0; j < t.numel(); ++j) flat[j] = Initial(rank, k++);
    params.push_back({"w" + std::to_string(i + 1), t.set_requires_grad(true)});
  }
  return params;
}

torch::Tensor Loss(const std::vector<NamedTensor>& params, int rank, const Problem& p) {
  torch::Tensor loss = torch::zeros({});
  int k = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& w = params[i].tensor;
    at::Tensor a = torch::empty(w.sizes());
    auto flat = a.view({-1});
    for (int64_t j = 0; j < w.numel(); ++j) flat[j] = Target(rank, k++);
    if (i == 2 && rank == p.unused_rank) continue;
    torch::Tensor term = 0.5 * (w - a).pow(2).sum();
    loss = loss + term;
    if (i == 0 && p.reuse_w1) loss = loss + 0.5 * (w - a).pow(2).sum();
  }
  return loss;
}

std::vector<double> Flat(const std::vector<NamedTensor>& params) {
  std::vector<double> out;
  for (const NamedTensor& p : params) {
    at::Tensor f = p.tensor.detach().reshape({-1}).to(torch::kDouble);
    for (int64_t j = 0; j < f.numel(); ++j) out.push_back(f[j].item<double>());
  }
  return out;
}

// x_{t+1,i} = sum_j W_t[i][j] x_{t,j} - lr * g_i(x_{t,i}), W_0 = I.
std::vector<std::vector<double>> ClosedForm(const Problem& p) {
  const int n = p.ranks;
  Topology topo = *Topology::Create(p.topology, n);
  std::vector<std::vector<double>> x(n, std::vector<double>(kDim));
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < kDim; ++k) x[r][k] = Initial(r, k);
  for (int t = 0; t < p.steps; ++t) {
    std::vector<double> w(n * n, 0.0);
    if (t == 0) {
      for (int i = 0; i < n; ++i) w[i * n + i] = 1;
    } else {
      w = topo.MixingMatrix(t);
    }
    std::vector<std::vector<double>> next(n, std::vector<double>(kDim, 0.0));
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < kDim; ++k) {
        for (int j = 0; j < n; ++j) next[i][k] += w[i * n + j] * x[j][k];
        double scale = 1;
        if (k < 3 && p.reuse_w1) scale = 2;
        if (k >= 7 && i == p.unused_rank) scale = 0;
        next[i][k] -= p.lr * scale * (x[i][k] - Target(i, k));
      }
    }
    x = next;
  }
  return x;
}

OptimizerFactory Sgd(double lr, double momentum = 0) {
  return [lr, momentum](const std::vector<at::Tensor>& params) {
    return std::make_unique<torch::optim::SGD>(params,
                                               torch::optim::SGDOptions(lr).momentum(momentum));
  };
}

DecentralizedOptions TinyBuckets(const TopologyConfig& topology) {
  DecentralizedOptions options;
  options.topology = topology;
  options.bucket_cap_mb = 1e-6;  // one parameter per bucket
  return options;
}

// Runs `p` on threads; returns each rank's final parameters.
std::vector<std::vector<double>> Train(const Problem& p, DecentralizedOptions options,
                                       std::vector<int64_t>* bytes = nullptr) {
  std::vector<std::vector<double>> result(p.ranks);
  if (bytes) bytes->assign(p.ranks, 0);
  RunGlooRanks(p.ranks, [&](int rank, Communicator& comm) {
    std::vector<NamedTensor> params = MakeParams(rank);
    auto engine = DecentralizedDataParallel::Create(params, {}, comm, Sgd(p.lr), nullptr, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (int t = 0; t < p.steps; ++t) {
      Loss(params, rank, p).backward();
      ASSERT_TRUE((*engine)->FinishStep().ok());
    }
    EXPECT_EQ((*engine)->step(), p.steps);
    result[rank] = Flat(params);
    if (bytes) (*bytes)[rank] = (*engine)->bytes_sent();
  });
  return result;
}

void ExpectNear(const std::vector<std::vector<double>>& got,
                const std::vector<std::vector<double>>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), want[r].size()) << "rank " << r;
    for (size_t k = 0; k < got[r].size(); ++k) {
      EXPECT_NEAR(got[r][k], want[r][k], tol * std::max(1.0, std::abs(want[r][k])))
          << "rank " << r << " element " << k;
    }
  }
}

struct TopologyCase {
  const char* name;
  int ranks;
  TopologyConfig topology;
};

class ClosedFormTest : public ::testing::TestWithParam<TopologyCase> {};

TEST_P(ClosedFormTest, StepsEqualTheMixingMatrixUpdate) {
  Problem p;
  p.ranks = GetParam().ranks;
  p.topology = GetParam().topology;
  p.steps = 5;
  std::vector<int64_t> bytes;
  ExpectNear(Train(p, TinyBuckets(p.topology), &bytes), ClosedForm(p), 1e-5);
  if (p.topology.kind == TopologyKind::kRing ||
      p.topology.kind == TopologyKind::kOnePeerExponential) {
    // Pairs only: each step sends the whole model once.
    for (int64_t b : bytes) EXPECT_EQ(b, p.steps * kDim * 4);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Topologies, ClosedFormTest,
    ::testing::Values(
        TopologyCase{"complete", 3, {TopologyKind::kComplete}},
        TopologyCase{"ring", 4, {TopologyKind::kRing}},
        TopologyCase{"ring6", 6, {TopologyKind::kRing}},
        TopologyCase{"one_peer_exponential", 4, {TopologyKind::kOnePeerExponential}},
        TopologyCase{
            "alternating_exponential_ring", 4, {TopologyKind::kAlternatingExponentialRing, 2}},
        TopologyCase{
            "custom", 3, {TopologyKind::kCustom, 1, {{{0, 1}, {2}}, {{0}, {1, 2}}, {{0, 1, 2}}}}}),
    [](const ::testing::TestParamInfo<TopologyCase>& info) {
      return std::string(info.param.name);
    });

TEST(DecentralizedTest, UnusedAndReusedParametersFollowTheirGradients) {
  Problem p;
  p.ranks = 2;
  p.topology = {TopologyKind::kRing};
  p.reuse_w1 = true;
  p.unused_rank = 1;
  ExpectNear(Train(p, TinyBuckets(p.topology)), ClosedForm(p), 1e-5);
}

// Deviation from the mean, over all ranks and elements.
double Deviation(const std::vector<std::vector<double>>& x) {
  double sum = 0;
  for (size_t k = 0; k < x[0].size(); ++k) {
    double mean = 0;
    for (const auto& r : x) mean += r[k] / x.size();
    for (const auto& r : x) sum += (r[k] - mean) * (r[k] - mean);
  }
  return std::sqrt(sum);
}

// The largest singular value of (W_2 W_1 - J) for a period-2 topology: the
// per-period contraction of the deviation from the mean.
double PeriodContraction(const Topology& topo) {
  const int n = topo.world_size();
  std::vector<double> w1 = topo.MixingMatrix(1), w2 = topo.MixingMatrix(2);
  std::vector<double> m(n * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k < n; ++k) m[i * n + j] += w2[i * n + k] * w1[k * n + j];
      m[i * n + j] -= 1.0 / n;
    }
  std::vector<double> v(n);
  for (int i = 0; i < n; ++i) v[i] = std::sin(i + 1.0);
  double sigma = 0;
  for (int it = 0; it < 500; ++it) {  // power iteration on M^T M
    std::vector<double> mv(n, 0.0), mtmv(n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) mv[i] += m[i * n + j] * v[j];
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) mtmv[i] += m[j * n + i] * mv[j];
    double norm = 0;
    for (double x : mtmv) norm += x * x;
    norm = std::sqrt(norm);
    sigma = std::sqrt(norm);
    for (int i = 0; i < n; ++i) v[i] = mtmv[i] / norm;
  }
  return sigma;
}

TEST(DecentralizedTest, WithoutLearningRingRanksConvergeToTheirMeanAtTheSpectralRate) {
  Problem p;
  p.ranks = 8;
  p.topology = {TopologyKind::kRing};
  p.lr = 0;
  const Topology topo = *Topology::Create(p.topology, p.ranks);
  const double rate = PeriodContraction(topo);
  ASSERT_GT(rate, 0.2);
  ASSERT_LT(rate, 0.95);
  Problem start = p;
  start.steps = 0;
  const double initial = Deviation(ClosedForm(start));
  // After step 0 (no mix) every two steps are one period of the schedule.
  for (int periods : {2, 4}) {
    p.steps = 1 + 2 * periods;
    std::vector<std::vector<double>> x = Train(p, TinyBuckets(p.topology));
    ExpectNear(x, ClosedForm(p), 1e-5);
    const double deviation = Deviation(x);
    EXPECT_LE(deviation, initial * std::pow(rate, periods) * 1.001) << periods << " periods";
    // Not much faster than the rate either: the bound is tight for this start.
    EXPECT_GE(deviation, initial * std::pow(rate, periods) * 0.2) << periods << " periods";
    for (int k = 0; k < kDim; ++k) {
      double mean = 0, initial_mean = 0;
      for (int r = 0; r < p.ranks; ++r) {
        mean += x[r][k] / p.ranks;
        initial_mean += Initial(r, k) / p.ranks;
      }
      EXPECT_NEAR(mean, initial_mean, 1e-4) << "gossip must preserve the mean";
    }
  }
}

TEST(DecentralizedTest, OnePeerExponentialReachesExactConsensusAfterLog2NMixes) {
  Problem p;
  p.ranks = 8;
  p.topology = {TopologyKind::kOnePeerExponential};
  p.lr = 0;
  p.steps = 3;  // two mixes: not yet
  EXPECT_GT(Deviation(Train(p, TinyBuckets(p.topology))), 1.0);
  p.steps = 4;  // three mixes, one per distance 1, 2, 4
  EXPECT_LT(Deviation(Train(p, TinyBuckets(p.topology))), 1e-5);
}

TEST(DecentralizedTest, GlobalAverageIsExactAndRevertRestoresTheRun) {
  Problem p;
  p.ranks = 4;
  p.topology = {TopologyKind::kRing};
  std::vector<std::vector<double>> before(4), averaged(4), reverted(4), with(4), without(4);
  for (bool average : {true, false}) {
    RunGlooRanks(4, [&](int rank, Communicator& comm) {
      std::vector<NamedTensor> params = MakeParams(rank);
      auto engine = *DecentralizedDataParallel::Create(params, {}, comm, Sgd(0.1, 0.9), nullptr,
                                                       TinyBuckets(p.topology));
      for (int t = 0; t < 6; ++t) {
        Loss(params, rank, p).backward();
        ASSERT_TRUE(engine->FinishStep().ok());
        if (t == 2 && average) {
          before[rank] = Flat(params);
          ASSERT_TRUE(engine->GlobalAverage().ok());
          averaged[rank] = Flat(params);
          ASSERT_TRUE(engine->RevertGlobalAverage().ok());
          reverted[rank] = Flat(params);
          EXPECT_EQ(engine->RevertGlobalAverage().code(), absl::StatusCode::kFailedPrecondition);
        }
      }
      (average ? with : without)[rank] = Flat(params);
    });
  }
  for (int k = 0; k < kDim; ++k) {
    double mean = 0;
    for (int r = 0; r < 4; ++r) mean += before[r][k] / 4;
    for (int r = 0; r < 4; ++r) EXPECT_NEAR(averaged[r][k], mean, 1e-6);
  }
  EXPECT_EQ(reverted, before);
  EXPECT_EQ(with, without);  // bit for bit
}

TEST(DecentralizedTest, HotSparesTrainNothingAndHoldTheTrainersAverage) {
  // Three ranks, one_peer_exponential serves two: rank 2 is a spare. Ranks
  // 0 and 1 follow the two-rank closed form exactly as if alone.
  Problem two;
  two.ranks = 2;
  two.topology = {TopologyKind::kOnePeerExponential};
  two.steps = 4;
  DecentralizedOptions options = TinyBuckets(two.topology);
  options.training_ranks = 2;
  std::vector<std::vector<double>> trained(3), averaged(3), reverted(3);
  std::vector<int64_t> bytes(3);
  std::vector<int> spare(3);  // not vector<bool>: ranks write their own element at once
  RunGlooRanks(3, [&](int rank, Communicator& comm) {
    std::vector<NamedTensor> params = MakeParams(rank);
    auto engine =
        DecentralizedDataParallel::Create(params, {}, comm, Sgd(two.lr), nullptr, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    spare[rank] = (*engine)->spare();
    for (int t = 0; t < two.steps; ++t) {
      if (!(*engine)->spare()) Loss(params, rank, two).backward();
      ASSERT_TRUE((*engine)->FinishStep().ok());
    }
    trained[rank] = Flat(params);
    bytes[rank] = (*engine)->bytes_sent();
    ASSERT_TRUE((*engine)->GlobalAverage().ok());
    averaged[rank] = Flat(params);
    ASSERT_TRUE((*engine)->RevertGlobalAverage().ok());
    reverted[rank] = Flat(params);
  });
  EXPECT_EQ(spare, (std::vector<int>{0, 0, 1}));
  const std::vector<std::vector<double>> want = ClosedForm(two);
  ExpectNear({trained[0], trained[1]}, want, 1e-5);
  for (int k = 0; k < kDim; ++k) {
    EXPECT_EQ(trained[2][k], static_cast<float>(Initial(2, k))) << "the spare's model moved";
    const double mean = (trained[0][k] + trained[1][k]) / 2;  // the spare adds nothing
    for (int r = 0; r < 3; ++r) EXPECT_NEAR(averaged[r][k], mean, 1e-6) << "rank " << r;
  }
  EXPECT_EQ(averaged[0], averaged[2]);  // the same bits everywhere
  EXPECT_EQ(reverted[0], trained[0]);
  EXPECT_EQ(reverted[1], trained[1]);
  EXPECT_EQ(reverted[2], averaged[2]) << "a spare keeps the average";
  EXPECT_EQ(bytes[2], 0);
  EXPECT_EQ(bytes[0], two.steps * kDim * 4);
}

TEST(DecentralizedTest, TrainingRanksOutsideTheWorldAreRefused) {
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    DecentralizedOptions options = TinyBuckets({TopologyKind::kRing});
    options.training_ranks = 3;
    auto engine =
        DecentralizedDataParallel::Create(MakeParams(rank), {}, comm, Sgd(0.1), nullptr, options);
    EXPECT_THAT(std::string(engine.status().message()),
                HasSubstr("training_ranks must be in [0, 2], got 3"));
  });
}

TEST(DecentralizedTest, KeptGlobalAverageDropsTheStaleExchange) {
  Problem p;
  p.ranks = 2;
  p.topology = {TopologyKind::kRing};
  std::vector<std::vector<double>> after(2);
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    std::vector<NamedTensor> params = MakeParams(rank);
    auto engine = *DecentralizedDataParallel::Create(params, {}, comm, Sgd(0.0), nullptr,
                                                     TinyBuckets(p.topology));
    for (int t = 0; t < 2; ++t) {
      Loss(params, rank, p).backward();
      ASSERT_TRUE(engine->FinishStep().ok());
    }
    ASSERT_TRUE(engine->GlobalAverage().ok());
    Loss(params, rank, p).backward();
    ASSERT_TRUE(engine->FinishStep().ok());
    after[rank] = Flat(params);
  });
  // lr 0: the average stays; mixing it with the peer's pre-average block
  // would have moved it.
  for (int k = 0; k < kDim; ++k) {
    EXPECT_NEAR(after[0][k], (Initial(0, k) + Initial(1, k)) / 2, 1e-6);
    EXPECT_NEAR(after[1][k], after[0][k], 1e-6);
  }
}

TEST(DecentralizedTest, AccumulatedMicroBatchesEqualOneBackwardOfTheirSum) {
  Problem p;
  p.ranks = 2;
  p.topology = {TopologyKind::kRing};
  Problem other = p;
  other.unused_rank = 0;  // a second, different micro-batch loss
  std::vector<std::vector<double>> accumulated(2), summed(2);
  for (bool accumulate : {true, false}) {
    RunGlooRanks(2, [&](int rank, Communicator& comm) {
      std::vector<NamedTensor> params = MakeParams(rank);
      auto engine = *DecentralizedDataParallel::Create(params, {}, comm, Sgd(0.05, 0.9), nullptr,
                                                       TinyBuckets(p.topology));
      for (int t = 0; t < 4; ++t) {
        if (accumulate) {
          {
            auto scope = engine->Accumulate();
            Loss(params, rank, p).backward();
            EXPECT_TRUE(engine->FinishStep().ok());  // nothing happens inside the scope
          }
          Loss(params, rank, other).backward();
        } else {
          (Loss(params, rank, p) + Loss(params, rank, other)).backward();
        }
        ASSERT_TRUE(engine->FinishStep().ok());
      }
      EXPECT_EQ(engine->step(), 4);
      (accumulate ? accumulated : summed)[rank] = Flat(params);
    });
  }
  ExpectNear(accumulated, summed, 1e-6);
}

TEST(DecentralizedTest, ClippingByGlobalNormOrPerBucket) {
  // One rank, lr 1, gradient c1 = (3, 4, 0) for w1 (norm 5), c2 = 2 e_4 for
  // w2 (norm 2), nothing for w3.
  for (auto mode :
       {DecentralizedOptions::Clip::kGlobalNorm, DecentralizedOptions::Clip::kPerBucket}) {
    RunGlooRanks(1, [&](int rank, Communicator& comm) {
      std::vector<NamedTensor> params = MakeParams(rank);
      DecentralizedOptions options = TinyBuckets({TopologyKind::kComplete});
      options.clip_mode = mode;
      options.clip_norm = 1;
      auto engine =
          *DecentralizedDataParallel::Create(params, {}, comm, Sgd(1.0), nullptr, options);
      const std::vector<double> start = Flat(params);
      torch::Tensor c1 = torch::tensor({3.0f, 4.0f, 0.0f});
      torch::Tensor c2 = torch::tensor({0.0f, 0.0f, 0.0f, 2.0f}).view({2, 2});
      ((params[0].tensor * c1).sum() + (params[1].tensor * c2).sum()).backward();
      ASSERT_TRUE(engine->FinishStep().ok());
      const std::vector<double> end = Flat(params);
      const double global = std::sqrt(29.0);
      const double s1 = mode == DecentralizedOptions::Clip::kGlobalNorm ? 1 / global : 1 / 5.0;
      const double s2 = mode == DecentralizedOptions::Clip::kGlobalNorm ? 1 / global : 1 / 2.0;
      const double c[7] = {3, 4, 0, 0, 0, 0, 2};
      for (int k = 0; k < 7; ++k)
        EXPECT_NEAR(start[k] - end[k], c[k] * (k < 3 ? s1 : s2), 1e-5) << k;
      for (int k = 7; k < kDim; ++k) EXPECT_EQ(start[k], end[k]);
    });
  }
}

TEST(DecentralizedTest, BucketsUpdateInsideBackwardOnceTheLayoutIsKnown) {
  Problem p;
  p.ranks = 2;
  p.topology = {TopologyKind::kRing};
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    std::vector<NamedTensor> params = MakeParams(rank);
    auto engine = *DecentralizedDataParallel::Create(params, {}, comm, Sgd(0.1), nullptr,
                                                     TinyBuckets(p.topology));
    Loss(params, rank, p).backward();
    std::vector<double> before = Flat(params);
    EXPECT_EQ(Flat(params), before) << "step 0 updates only in FinishStep";
    ASSERT_TRUE(engine->FinishStep().ok());
    EXPECT_EQ(engine->bucket_count(), 3u);
    before = Flat(params);
    Loss(params, rank, p).backward();
    EXPECT_NE(Flat(params), before) << "from step 1 the hooks update during backward";
    ASSERT_TRUE(engine->FinishStep().ok());
    Loss(params, rank, p).backward();
    Loss(params, rank, p).backward();
    absl::Status twice = engine->FinishStep();
    EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(twice.message()), HasSubstr("two backward passes"));
  });
}

TEST(DecentralizedTest, DifferentParameterSetsFailOnEveryRankNamingTheParameter) {
  std::vector<absl::Status> statuses(2);
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    std::vector<NamedTensor> params = MakeParams(rank);
    if (rank == 1) params[1].tensor = torch::zeros({2, 3}).set_requires_grad(true);
    statuses[rank] = DecentralizedDataParallel::Create(params, {}, comm, Sgd(0.1), nullptr,
                                                       TinyBuckets({TopologyKind::kRing}))
                         .status();
  });
  for (const absl::Status& s : statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("'w2'"));
  }
}

TEST(DecentralizedTest, AWorldTheTopologyCannotServeIsRefused) {
  RunGlooRanks(3, [&](int rank, Communicator& comm) {
    auto engine = DecentralizedDataParallel::Create(MakeParams(rank), {}, comm, Sgd(0.1), nullptr,
                                                    TinyBuckets({TopologyKind::kRing}));
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(engine.status().message()),
                HasSubstr("nearest world sizes that work: 2 and 4"));
  });
}

TEST(DecentralizedTest, LrScheduleAndOptimizerStateFollowTheirParameters) {
  // Adam state survives the step-0 re-layout: two runs with the layout
  // decided differently (one bucket vs three) give the same numbers.
  Problem p;
  p.ranks = 2;
  p.topology = {TopologyKind::kRing};
  std::vector<std::vector<double>> results[2];
  for (int variant = 0; variant < 2; ++variant) {
    results[variant].resize(2);
    RunGlooRanks(2, [&](int rank, Communicator& comm) {
      std::vector<NamedTensor> params = MakeParams(rank);
      DecentralizedOptions options =
          variant == 0 ? TinyBuckets(p.topology) : DecentralizedOptions();
      options.topology = p.topology;
      std::vector<double> lrs;
      auto engine = *DecentralizedDataParallel::Create(
          params, {}, comm,
          [](const std::vector<at::Tensor>& ps) {
            return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(1.0));
          },
          [&lrs](int64_t step) {
            lrs.push_back(0.01 * (step + 1));
            return 0.01 * (step + 1);
          },
          options);
      for (int t = 0; t < 4; ++t) {
        Loss(params, rank, p).backward();
        ASSERT_TRUE(engine->FinishStep().ok());
      }
      EXPECT_EQ(engine->optimizers().size(), variant == 0 ? 3u : 1u);
      size_t states = 0;
      for (auto* o : engine->optimizers()) states += o->state().size();
      EXPECT_EQ(states, 3u);
      // One schedule call per bucket per step.
      EXPECT_EQ(lrs.size(), 4 * engine->optimizers().size());
      EXPECT_DOUBLE_EQ(lrs.back(), 0.04);
      results[variant][rank] = Flat(params);
    });
  }
  ExpectNear(results[0], results[1], 1e-6);
}

TEST(DecentralizedTest, ASharedParameterIsSteppedOnce) {
  // `w` is listed under two names (tied weights): one bucket slot, one
  // update with its whole gradient.
  RunGlooRanks(1, [&](int rank, Communicator& comm) {
    torch::Tensor w = torch::zeros({3}).requires_grad_(true);
    torch::Tensor v = torch::zeros({2}).requires_grad_(true);
    std::vector<NamedTensor> params = {{"embed.weight", w}, {"v", v}, {"out.weight", w}};
    auto engine = DecentralizedDataParallel::Create(params, {}, comm, Sgd(1.0), nullptr,
                                                    TinyBuckets({TopologyKind::kComplete}));
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_EQ((*engine)->bucket_count(), 2u);
    EXPECT_EQ((*engine)->optimizers().size(), 2u);
    // Two uses of w: gradient (1, 2, 3) + (4, 5, 6).
    ((w * torch::tensor({1.0f, 2.0f, 3.0f})).sum() + (w * torch::tensor({4.0f, 5.0f, 6.0f})).sum() +
     v.sum())
        .backward();
    ASSERT_TRUE((*engine)->FinishStep().ok());
    EXPECT_TRUE(torch::equal(w.detach(), torch::tensor({-5.0f, -7.0f, -9.0f}))) << w;
    EXPECT_TRUE(torch::equal(v.detach(), torch::tensor({-1.0f, -1.0f}))) << v;
  });
}

}  // namespace
}  // namespace chorus
