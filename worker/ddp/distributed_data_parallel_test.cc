#include "chorus/distributed_data_parallel.h"

#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/machine_facts.h"
#include "common/memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/rank_threads.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

torch::nn::Sequential MakeMlp() {
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 4));
}

torch::nn::Sequential MakeCnn() {
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)),
                               torch::nn::ReLU(),
                               torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)),
                               torch::nn::Flatten(), torch::nn::Linear(4 * 3 * 3, 4));
}

// A copy of `src`'s parameters in a freshly built model.
torch::nn::Sequential CloneOf(const torch::nn::Sequential& src, bool cnn) {
  torch::nn::Sequential copy = cnn ? MakeCnn() : MakeMlp();
  torch::NoGradGuard no_grad;
  auto from = src->parameters();
  auto to = copy->parameters();
  for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  return copy;
}

bool SameParameters(const torch::nn::Sequential& a, const torch::nn::Sequential& b,
                    double rtol = 1e-5, double atol = 1e-6) {
  auto pa = a->parameters();
  auto pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!torch::allclose(pa[i], pb[i], rtol, atol)) return false;
  }
  return true;
}

struct EquivalenceCase {
  int ranks;
  bool cnn;
  bool view;
};

class EquivalenceTest : public ::testing::TestWithParam<EquivalenceCase> {};

// N ranks x batch B with DDP == one process with batch N*B, after 20 steps of
// SGD with momentum, with buckets small enough that there are many.
TEST_P(EquivalenceTest, MatchesOneProcessOnTheWholeBatch) {
  const EquivalenceCase c = GetParam();
  const int n = c.ranks;
  const int batch = 4;
  const int steps = 20;
  torch::manual_seed(7);
  torch::nn::Sequential reference = c.cnn ? MakeCnn() : MakeMlp();
  std::vector<torch::nn::Sequential> replicas;
  for (int r = 0; r < n; ++r) replicas.push_back(CloneOf(reference, c.cnn));
  const std::vector<int64_t> shape = c.cnn ? std::vector<int64_t>{steps, n * batch, 1, 8, 8}
                                           : std::vector<int64_t>{steps, n * batch, 8};
  torch::Tensor x = torch::randn(shape);
  torch::Tensor y = torch::randint(0, 4, {steps, n * batch});

  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int s = 0; s < steps; ++s) {
    ref_opt.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x[s]), y[s]).backward();
    ref_opt.step();
  }

  std::atomic<size_t> buckets{0};
  RunGlooRanks(n, [&](int rank, Communicator& comm) {
    torch::nn::Sequential& model = replicas[rank];
    DdpOptions options;
    options.bucket_cap_mb = 100.0 / (1 << 20);  // ~100 bytes: many buckets
    options.first_bucket_mb = 16.0 / (1 << 20);
    options.gradient_as_bucket_view = c.view;
    auto ddp = DistributedDataParallel::ForModule(*model, comm, options);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    if (rank == 0) buckets = (*ddp)->bucket_count();
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      ASSERT_TRUE((*ddp)->PrepareForBackward().ok());
      torch::Tensor xs = x[s].narrow(0, rank * batch, batch);
      torch::Tensor ys = y[s].narrow(0, rank * batch, batch);
      torch::nn::functional::cross_entropy(model->forward(xs), ys).backward();
      absl::Status sync = (*ddp)->FinishGradientSync();
      ASSERT_TRUE(sync.ok()) << sync;
      opt.step();
    }
    EXPECT_EQ((*ddp)->iterations(), steps);
  });
  EXPECT_GE(buckets.load(), 3u);
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(SameParameters(replicas[r], reference)) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    ModelsRanksAndViews, EquivalenceTest,
    ::testing::Values(EquivalenceCase{1, false, false}, EquivalenceCase{2, false, false},
                      EquivalenceCase{3, false, false}, EquivalenceCase{2, false, true},
                      EquivalenceCase{3, false, true}, EquivalenceCase{1, true, false},
                      EquivalenceCase{2, true, false}, EquivalenceCase{3, true, true}));

// With gradient_as_bucket_view, .grad is a view into its bucket: after the
// first rebuild it stays the same memory from iteration to iteration
// (backward accumulates into it, nothing is copied), parameters of one
// bucket lie side by side, and a .grad the program replaces is put back in
// the bucket with the right value.
TEST(DistributedDataParallelTest, GradientsAsBucketViewsStayInTheBucket) {
  DdpOptions options;
  options.gradient_as_bucket_view = true;
  torch::manual_seed(5);
  torch::nn::Sequential reference = MakeMlp();
  torch::Tensor x = torch::randn({4, 2, 3, 8});         // step, rank, batch, features
  std::vector<std::vector<torch::Tensor>> expected(4);  // per step, per parameter
  for (int s = 0; s < 4; ++s) {
    torch::nn::Sequential m = CloneOf(reference, false);
    m->forward(x[s].reshape({6, 8})).pow(2).sum().div(2).backward();
    for (auto& p : m->parameters()) expected[s].push_back(p.grad().clone());
  }
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    torch::nn::Sequential m = CloneOf(reference, false);
    auto ddp = DistributedDataParallel::ForModule(*m, comm, options);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    std::vector<const void*> where;
    for (int s = 0; s < 4; ++s) {
      m->zero_grad();
      if (s == 3) m->parameters()[0].mutable_grad() = torch::full({16, 8}, 5.0);
      ASSERT_TRUE((*ddp)->PrepareForBackward().ok());
      m->forward(x[s][rank]).pow(2).sum().backward();
      ASSERT_TRUE((*ddp)->FinishGradientSync().ok());
      auto params = m->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        // Step 3 accumulated onto the 5.0 every rank put in .grad.
        torch::Tensor want = expected[s][i] + (s == 3 && i == 0 ? 5.0 : 0.0);
        EXPECT_TRUE(torch::allclose(params[i].grad(), want, 1e-5, 1e-6))
            << "rank " << rank << " step " << s << " param " << i;
      }
      std::vector<const void*> now;
      for (auto& p : params) now.push_back(p.grad().data_ptr());
      if (s >= 2) {
        EXPECT_EQ(now, where) << "rank " << rank << " step " << s;
      }
      where = now;
    }
    // The model is far below the first bucket's 1 MB: its gradients tile one
    // flat buffer.
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    int64_t bytes = 0;
    for (auto& p : m->parameters()) {
      const auto at = reinterpret_cast<uintptr_t>(p.grad().data_ptr());
      lo = std::min(lo, at);
      hi = std::max<uintptr_t>(hi, at + p.grad().nbytes());
      bytes += p.grad().nbytes();
    }
    EXPECT_EQ(static_cast<int64_t>(hi - lo), bytes) << "rank " << rank;
  });
}

// Two heads on one trunk; `use` says which heads feed the loss on each rank.
struct TwoHeads : torch::nn::Module {
  TwoHeads() {
    trunk = register_module("trunk", torch::nn::Linear(6, 8));
    head_a = register_module("head_a", torch::nn::Linear(8, 2));
    head_b = register_module("head_b", torch::nn::Linear(8, 2));
  }
  torch::Tensor Loss(const torch::Tensor& x, bool use_a, bool use_b) {
    torch::Tensor h = torch::relu(trunk->forward(x));
    torch::Tensor loss = torch::zeros({});
    if (use_a) loss = loss + head_a->forward(h).pow(2).mean();
    if (use_b) loss = loss + head_b->forward(h).pow(2).mean();
    return loss;
  }
  torch::nn::Linear trunk{nullptr}, head_a{nullptr}, head_b{nullptr};
};

void CopyParams(TwoHeads& from, TwoHeads& to) {
  torch::NoGradGuard no_grad;
  auto a = from.parameters();
  auto b = to.parameters();
  for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
}

struct UnusedCase {
  const char* name;
  bool find_unused;
  // Heads used by rank 0 and rank 1.
  bool a0, b0, a1, b1;
  bool expect_error;
};

class UnusedParametersTest : public ::testing::TestWithParam<UnusedCase> {};

TEST_P(UnusedParametersTest, AveragesZerosOrFailsClearly) {
  const UnusedCase c = GetParam();
  torch::manual_seed(3);
  TwoHeads reference;
  torch::Tensor x = torch::randn({2, 5, 6});
  // Reference gradients: each rank's local gradient computed here, averaged.
  std::vector<std::vector<torch::Tensor>> local(2);
  for (int r = 0; r < 2; ++r) {
    TwoHeads m;
    CopyParams(reference, m);
    torch::Tensor loss = m.Loss(x[r], r == 0 ? c.a0 : c.a1, r == 0 ? c.b0 : c.b1);
    loss.backward();
    for (auto& p : m.parameters())
      local[r].push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  }
  // Gradients as their own tensors and as views into the buckets alike.
  for (bool view : {false, true}) {
    SCOPED_TRACE(view ? "gradient_as_bucket_view" : "gradients copied");
    std::vector<std::vector<torch::Tensor>> got(2);
    std::vector<absl::Status> statuses(2);
    RunGlooRanks(2, [&](int rank, Communicator& comm) {
      TwoHeads m;
      CopyParams(reference, m);
      DdpOptions options;
      options.find_unused_parameters = c.find_unused;
      options.gradient_as_bucket_view = view;
      auto ddp = DistributedDataParallel::ForModule(m, comm, options);
      ASSERT_TRUE(ddp.ok()) << ddp.status();
      for (int iteration = 0; iteration < 2; ++iteration) {  // before and after the bucket rebuild
        m.zero_grad();
        ASSERT_TRUE((*ddp)->PrepareForBackward().ok());
        m.Loss(x[rank], rank == 0 ? c.a0 : c.a1, rank == 0 ? c.b0 : c.b1).backward();
        statuses[rank] = (*ddp)->FinishGradientSync();
      }
      for (auto& p : m.parameters())
        got[rank].push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    });
    if (c.expect_error) {
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(statuses[r].code(), absl::StatusCode::kInvalidArgument) << statuses[r];
        EXPECT_THAT(statuses[r].message(), HasSubstr("find_unused_parameters"));
        EXPECT_THAT(statuses[r].message(), HasSubstr("head_"));
      }
      continue;
    }
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    for (size_t i = 0; i < local[0].size(); ++i) {
      const bool any = local[0][i].defined() || local[1][i].defined();
      if (!any) {
        EXPECT_FALSE(got[0][i].defined()) << "param " << i << " unused everywhere keeps no grad";
        continue;
      }
      torch::Tensor sum = torch::zeros_like(local[0][i].defined() ? local[0][i] : local[1][i]);
      for (int r = 0; r < 2; ++r) {
        if (local[r][i].defined()) sum += local[r][i];
      }
      for (int r = 0; r < 2; ++r) {
        ASSERT_TRUE(got[r][i].defined()) << "param " << i;
        EXPECT_TRUE(torch::allclose(got[r][i], sum / 2, 1e-5, 1e-7)) << c.name << " param " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, UnusedParametersTest,
    ::testing::Values(UnusedCase{"none_unused", false, true, true, true, true, false},
                      UnusedCase{"none_unused_option", true, true, true, true, true, false},
                      UnusedCase{"same_unused", true, true, false, true, false, false},
                      UnusedCase{"same_unused_no_option", false, true, false, true, false, true},
                      UnusedCase{"different_per_rank", true, true, false, false, true, false},
                      UnusedCase{"different_no_option", false, true, false, false, true, true}),
    [](const auto& info) { return std::string(info.param.name); });

// Note [One rank]: a communicator of one rank gets no collective from a
// step (its flight recorder stays where the first step left it), its
// gradients are its own, and a parameter without a gradient is still the
// error it is with more ranks.
TEST(DistributedDataParallelTest, OneRankIssuesNoCollectivesAndKeepsItsGradients) {
  torch::manual_seed(5);
  TwoHeads reference;
  const torch::Tensor x = torch::randn({5, 6});
  TwoHeads local;
  CopyParams(reference, local);
  local.Loss(x, true, true).backward();
  RunGlooRanks(1, [&](int /*rank*/, Communicator& comm) {
    TwoHeads m;
    CopyParams(reference, m);
    auto ddp = DistributedDataParallel::ForModule(m, comm, DdpOptions());
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    int64_t after_first = -1;
    for (int iteration = 0; iteration < 3; ++iteration) {
      m.zero_grad();
      ASSERT_TRUE((*ddp)->PrepareForBackward().ok());
      m.Loss(x, true, true).backward();
      const absl::Status s = (*ddp)->FinishGradientSync();
      ASSERT_TRUE(s.ok()) << s;
      const int64_t seq = comm.flight_recorder().TakeSnapshot().last_enqueued_seq;
      if (iteration == 0) after_first = seq;
      EXPECT_EQ(seq, after_first) << "iteration " << iteration << " issued a collective";
    }
    auto got = m.parameters();
    auto want = local.parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[i].grad(), want[i].grad())) << "param " << i;
    }
    m.zero_grad();
    ASSERT_TRUE((*ddp)->PrepareForBackward().ok());
    m.Loss(x, true, false).backward();
    const absl::Status unused = (*ddp)->FinishGradientSync();
    EXPECT_EQ(unused.code(), absl::StatusCode::kInvalidArgument) << unused;
    EXPECT_THAT(unused.message(), HasSubstr("head_b"));
    EXPECT_THAT(unused.message(), HasSubstr("find_unused_parameters"));
  });
}

TEST(DistributedDataParallelTest, NoSyncAccumulationEqualsOneBigBatch) {
  const int k = 3, batch = 4;
  torch::manual_seed(11);
  torch::nn::Sequential reference = MakeMlp();
  torch::Tensor x = torch::randn({2 * k * batch, 8});
  torch::Tensor y = torch::randint(0, 4, {2 * k * batch});
  torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
  std::vector<torch::Tensor> want;
  for (auto& p : reference->parameters()) want.push_back(p.grad().clone());

  std::vector<torch::nn::Sequential> replicas = {CloneOf(reference, false),
                                                 CloneOf(reference, false)};
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    torch::nn::Sequential& model = replicas[rank];
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    auto ddp = DistributedDataParallel::ForModule(*model, comm, DdpOptions());
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    for (int m = 0; m < k; ++m) {
      ASSERT_TRUE((*ddp)->PrepareForBackward().ok());
      torch::Tensor xs = x.narrow(0, (rank * k + m) * batch, batch);
      torch::Tensor ys = y.narrow(0, (rank * k + m) * batch, batch);
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(xs), ys) / k;
      if (m < k - 1) {
        auto no_sync = (*ddp)->NoSync();
        loss.backward();
        ASSERT_TRUE((*ddp)->FinishGradientSync().ok());  // no-op under NoSync
      } else {
        loss.backward();
        absl::Status s = (*ddp)->FinishGradientSync();
        ASSERT_TRUE(s.ok()) << s;
      }
    }
    EXPECT_EQ(comm.flight_recorder().TakeSnapshot().last_enqueued_seq > 0, true);
  });
  for (int r = 0; r < 2; ++r) {
    auto params = replicas[r]->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::allclose(params[i].grad(), want[i], 1e-5, 1e-7))
          << "rank " << r << " param " << i;
    }
  }
}

// Steady state: once buckets exist and the transport is chosen, a training
// step (forward, backward, bucket all-reduces through shared memory, SGD)
// maps no new memory, as in a rank that keeps freed memory for reuse.
TEST(DistributedDataParallelTest, SteadyStateStepsTakeNoPageFaults) {
  if (!kPageFaultCountsAreMeaningful) GTEST_SKIP() << "ThreadSanitizer's shadow memory faults too";

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizers bring their own allocator, which mallopt does not configure";
#endif
  ASSERT_TRUE(KeepFreedMemoryForReuse({}));
  torch::manual_seed(5);
  // ~1.2 M parameters: several buckets of a few MiB (1024 pages each).
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(256, 1024), torch::nn::ReLU(),
                                 torch::nn::Linear(1024, 1024), torch::nn::ReLU(),
                                 torch::nn::Linear(1024, 10));
  };
  constexpr int kSteps = 10;
  // Gradients copied into the buckets, and gradients as bucket views (as the
  // built-in trainer runs DDP).
  for (bool view : {false, true}) {
    SCOPED_TRACE(view ? "gradient_as_bucket_view" : "gradients copied");
    std::vector<torch::nn::Sequential> replicas = {make(), make()};
    // Page faults of the whole process (both ranks) during each step.
    std::vector<int64_t> faults;
    RunGlooRanks(2, [&](int rank, Communicator& comm) {
      torch::nn::Sequential& model = replicas[rank];
      DdpOptions options;
      options.bucket_cap_mb = 1;
      options.gradient_as_bucket_view = view;
      auto ddp = DistributedDataParallel::ForModule(*model, comm, options);
      ASSERT_TRUE(ddp.ok()) << ddp.status();
      torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01));
      torch::Tensor x = torch::randn({32, 256});
      torch::Tensor y = torch::randint(0, 10, {32});
      auto step = [&] {
        sgd.zero_grad();
        ASSERT_TRUE((*ddp)->PrepareForBackward().ok());
        torch::nn::functional::cross_entropy(model->forward(x), y).backward();
        absl::Status s = (*ddp)->FinishGradientSync();
        ASSERT_TRUE(s.ok()) << s;
        sgd.step();
      };
      // Warm-up: first-iteration bucket order, buffers, and the transport
      // measurement (8 all-reduces per size class).
      for (int i = 0; i < 12; ++i) step();
      for (int i = 0; i < kSteps; ++i) {
        ASSERT_TRUE(comm.Barrier("before")->Wait(absl::Now() + absl::Seconds(30)).ok());
        const int64_t before = MinorPageFaults();
        step();
        ASSERT_TRUE(comm.Barrier("after")->Wait(absl::Now() + absl::Seconds(30)).ok());
        if (rank == 0) faults.push_back(MinorPageFaults() - before);
      }
    });
    ASSERT_EQ(faults.size(), kSteps);
    // Without reuse, every step's gradients and activations (several MiB,
    // thousands of pages) would fault in anew, in every step. A step may
    // still meet a one-off event of the process (a thread of LibTorch's pool
    // starting, with its stack and allocator arena: runs here have seen ~900
    // faults land in one step), so the steady state is what most steps show.
    std::vector<int64_t> sorted = faults;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_LE(sorted[kSteps - 3], 32) << "faults per step: " << absl::StrJoin(faults, " ");
    EXPECT_LE(sorted[kSteps - 1], 4096) << "faults per step: " << absl::StrJoin(faults, " ");
  }
}

class CompressionTest : public ::testing::TestWithParam<DdpOptions::Compression> {};

TEST_P(CompressionTest, GradientsWithinFormatToleranceAndHalfTheBytes) {
  const DdpOptions::Compression compression = GetParam();
  torch::manual_seed(5);
  torch::nn::Sequential reference = MakeMlp();
  torch::Tensor x = torch::randn({8, 8});
  torch::Tensor y = torch::randint(0, 4, {8});
  torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
  std::vector<torch::Tensor> want;
  for (auto& p : reference->parameters()) want.push_back(p.grad().clone());
  std::vector<torch::nn::Sequential> replicas = {CloneOf(reference, false),
                                                 CloneOf(reference, false)};
  std::vector<int64_t> wire_bytes(2, 0), wire_count(2, 0);
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    DdpOptions options;
    options.compression = compression;
    auto ddp = DistributedDataParallel::ForModule(*replicas[rank], comm, options);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    ASSERT_TRUE((*ddp)->PrepareForBackward().ok());
    torch::nn::functional::cross_entropy(replicas[rank]->forward(x.narrow(0, rank * 4, 4)),
                                         y.narrow(0, rank * 4, 4))
        .backward();
    ASSERT_TRUE((*ddp)->FinishGradientSync().ok());
    for (const FlightRecord& rec : comm.flight_recorder().TakeSnapshot(64).recent) {
      if (rec.fingerprint.tag == "ddp:model/bucket0") {
        wire_bytes[rank] = rec.fingerprint.bytes();
        wire_count[rank] = rec.fingerprint.count;
        EXPECT_EQ(rec.fingerprint.dtype,
                  compression == DdpOptions::Compression::kFp16 ? "float16" : "bfloat16");
      }
    }
  });
  const double tol = compression == DdpOptions::Compression::kFp16 ? 2e-3 : 1.6e-2;
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(wire_count[r], 0);
    EXPECT_EQ(wire_bytes[r], wire_count[r] * 2) << "half of float32's 4 bytes per element";
    auto params = replicas[r]->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const double scale = want[i].abs().max().item<double>() + 1e-6;
      EXPECT_LE((params[i].grad() - want[i]).abs().max().item<double>(), tol * scale) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CompressionTest,
                         ::testing::Values(DdpOptions::Compression::kFp16,
                                           DdpOptions::Compression::kBf16));

TEST(DistributedDataParallelTest, TwoInstancesOnDisjointSubsets) {
  torch::manual_seed(9);
  TwoHeads reference;
  torch::Tensor x = torch::randn({2, 5, 6});
  // Reference: average of both ranks' local gradients.
  std::vector<torch::Tensor> want;
  {
    std::vector<std::vector<torch::Tensor>> local(2);
    for (int r = 0; r < 2; ++r) {
      TwoHeads m;
      CopyParams(reference, m);
      m.Loss(x[r], true, true).backward();
      for (auto& p : m.parameters()) local[r].push_back(p.grad().clone());
    }
    for (size_t i = 0; i < local[0].size(); ++i) want.push_back((local[0][i] + local[1][i]) / 2);
  }
  std::vector<std::vector<torch::Tensor>> got(2);
  std::vector<std::string> tags0, tags1;
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    TwoHeads m;
    CopyParams(reference, m);
    std::vector<NamedTensor> actor, critic;
    for (auto& item : m.named_parameters()) {
      (absl::StartsWith(item.key(), "head_b") ? critic : actor)
          .push_back({item.key(), item.value()});
    }
    DdpOptions a;
    a.name = "actor";
    DdpOptions b;
    b.name = "critic";
    auto ddp_actor = DistributedDataParallel::Create(actor, {}, comm, a);
    auto ddp_critic = DistributedDataParallel::Create(critic, {}, comm, b);
    ASSERT_TRUE(ddp_actor.ok() && ddp_critic.ok());
    m.Loss(x[rank], true, true).backward();
    ASSERT_TRUE((*ddp_actor)->FinishGradientSync().ok());
    ASSERT_TRUE((*ddp_critic)->FinishGradientSync().ok());
    for (auto& p : m.parameters()) got[rank].push_back(p.grad().clone());
    for (const FlightRecord& rec : comm.flight_recorder().TakeSnapshot(64).recent) {
      (rank == 0 ? tags0 : tags1).push_back(rec.fingerprint.ToString());
    }
  });
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got[r][i], want[i], 1e-5, 1e-7))
          << "rank " << r << " param " << i;
    }
  }
  EXPECT_EQ(tags0, tags1);
  auto has = [&](const std::string& s) {
    return std::any_of(tags0.begin(), tags0.end(),
                       [&](const std::string& t) { return absl::StrContains(t, s); });
  };
  EXPECT_TRUE(has("ddp:actor/bucket0"));
  EXPECT_TRUE(has("ddp:critic/bucket0"));
}

TEST(DistributedDataParallelTest, DifferentModelsFailOnEveryRankNamingTheParameter) {
  std::vector<absl::Status> statuses(2);
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    torch::nn::Sequential m(torch::nn::Linear(4, rank == 0 ? 3 : 5),
                            torch::nn::Linear(rank == 0 ? 3 : 5, 2));
    statuses[rank] = DistributedDataParallel::ForModule(*m, comm, DdpOptions()).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(statuses[r].message(), HasSubstr("parameter/buffer #0 differs across ranks"));
    EXPECT_THAT(statuses[r].message(), HasSubstr("'0.weight'"));
  }
}

TEST(DistributedDataParallelTest, BroadcastParametersMakesReplicasIdentical) {
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < 3; ++r) {
    torch::manual_seed(100 + r);
    models.push_back(MakeMlp());
  }
  RunGlooRanks(3, [&](int rank, Communicator& comm) {
    auto ddp = DistributedDataParallel::ForModule(*models[rank], comm, DdpOptions());
    ASSERT_TRUE(ddp.ok());
    ASSERT_TRUE((*ddp)->BroadcastParameters(0).ok());
  });
  EXPECT_TRUE(SameParameters(models[1], models[0], 0, 0));
  EXPECT_TRUE(SameParameters(models[2], models[0], 0, 0));
}

TEST(DistributedDataParallelTest, BucketsFollowRankZeroReadyOrderAfterFirstIteration) {
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    torch::manual_seed(1);
    torch::nn::Sequential model = MakeMlp();
    DdpOptions options;
    options.bucket_cap_mb = 1e-9;  // one parameter per bucket
    options.first_bucket_mb = 1e-9;
    auto ddp = DistributedDataParallel::ForModule(*model, comm, options);
    ASSERT_TRUE(ddp.ok());
    EXPECT_EQ((*ddp)->bucket_count(), 6u);
    EXPECT_EQ((*ddp)->bucket_parameters(0), std::vector<std::string>{"4.bias"});
    model->forward(torch::randn({2, 8})).sum().backward();
    ASSERT_TRUE((*ddp)->FinishGradientSync().ok());
    // Backward produces the last layer's gradients first.
    EXPECT_EQ((*ddp)->bucket_count(), 6u);
    auto first = (*ddp)->bucket_parameters(0)[0];
    EXPECT_TRUE(first == "4.bias" || first == "4.weight") << first;
  });
}

TEST(DistributedDataParallelTest, ASharedParameterIsSynchronizedOnce) {
  // One Linear registered twice: LibTorch lists its parameters twice.
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    torch::manual_seed(3);
    torch::nn::Linear block(3, 3);
    torch::nn::Sequential model(block, torch::nn::Tanh(), block);
    DdpOptions options;
    options.bucket_cap_mb = 1e-9;  // one parameter per bucket
    options.first_bucket_mb = 1e-9;
    auto ddp = DistributedDataParallel::ForModule(*model, comm, options);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    ASSERT_EQ((*ddp)->bucket_count(), 2u);
    std::vector<std::string> names = {(*ddp)->bucket_parameters(0)[0],
                                      (*ddp)->bucket_parameters(1)[0]};
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"0.bias", "0.weight"}));
    // The averaged gradient is the mean of the ranks' whole gradients.
    torch::Tensor x = torch::full({1, 3}, 1.0f + rank);
    model->forward(x).sum().backward();
    const torch::Tensor own = block->weight.grad().clone();
    ASSERT_TRUE((*ddp)->FinishGradientSync().ok());
    torch::Tensor other = own.clone();
    ASSERT_TRUE(comm.AllReduce(other, ReduceOp::kAvg, "test/mean")
                    ->Wait(absl::Now() + absl::Seconds(30))
                    .ok());
    EXPECT_TRUE(torch::allclose(block->weight.grad(), other, 1e-6, 1e-7));
  });
}

}  // namespace
}  // namespace chorus
