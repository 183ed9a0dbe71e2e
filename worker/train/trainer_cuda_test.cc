// The built-in trainer on a GPU (NCCL, resources.device CUDA): it trains as
// the CPU does from the same seed, a checkpoint of a GPU job resumes bit for
// bit, and a checkpoint's copies off the GPU are queued, not waited for.
//
// Runs only with --config=cuda (or the CMake build in tests/gpu), a CUDA
// LibTorch and a GPU; elsewhere each case skips and says what is missing.

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/require_gpus.h"
#include "worker/comm/store.h"
#include "worker/train/checkpoint.h"
#include "worker/train/memory_sink.h"
#include "worker/train/trainer.h"

namespace chorus {
namespace {

// cuBLAS picks the same kernels run after run only with a fixed workspace;
// set before the first handle exists.
[[maybe_unused]] const bool kDeterministicCublas = [] {
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  return true;
}();

v1::JobSpec Spec(const std::string& text) {
  auto spec = ParseJobSpec(text, SpecFormat::kTextProto, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  NormalizeJobSpec(*spec);
  EXPECT_TRUE(CheckJobSpec(*spec, "test").ok());
  return *spec;
}

class FinishedWork : public Work {
 public:
  explicit FinishedWork(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait(absl::Time) override { return status_; }
  bool Done() const override { return true; }
  int64_t seq() const override { return 0; }

 private:
  absl::Status status_;
};

// One rank on the CPU: every collective of a world of one is the identity.
// The reference a one-GPU run is compared with.
class SoloCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<int>& group() const override { return group_; }
  std::shared_ptr<Work> AllReduce(at::Tensor, ReduceOp, absl::string_view) override { return Ok(); }
  std::shared_ptr<Work> Broadcast(at::Tensor, int, absl::string_view) override { return Ok(); }
  std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output, absl::string_view) override {
    output.copy_(input.reshape(output.sizes()));
    return Ok();
  }
  std::shared_ptr<Work> Barrier(absl::string_view) override { return Ok(); }
  std::shared_ptr<Work> Send(at::Tensor, int, absl::string_view) override { return NoPeer(); }
  std::shared_ptr<Work> Recv(at::Tensor, int, absl::string_view) override { return NoPeer(); }
  std::shared_ptr<Work> SendRecv(at::Tensor send, int, at::Tensor recv, int,
                                 absl::string_view) override {
    recv.copy_(send);
    return Ok();
  }
  absl::StatusOr<std::shared_ptr<Communicator>> NewGroup(std::vector<int> ranks) override {
    if (ranks != std::vector<int>{0}) return absl::InvalidArgumentError("a world of one rank");
    return std::make_shared<SoloCommunicator>();
  }
  void Abort(absl::string_view) override {}
  const FlightRecorder& flight_recorder() const override { return recorder_; }

 private:
  static std::shared_ptr<Work> Ok() { return std::make_shared<FinishedWork>(absl::OkStatus()); }
  static std::shared_ptr<Work> NoPeer() {
    return std::make_shared<FinishedWork>(absl::InvalidArgumentError("a world of one rank"));
  }
  std::vector<int> group_;
  FlightRecorder recorder_;
};

// Trains `spec` as one rank: on GPU 0 over NCCL when `cuda`, else on the CPU.
absl::StatusOr<v1::Metrics> TrainOneRank(v1::JobSpec spec, bool cuda, const TrainOptions& options) {
  spec.mutable_resources()->set_device(cuda ? v1::ResourceSpec::CUDA : v1::ResourceSpec::CPU);
  if (!cuda) {
    SoloCommunicator comm;
    return Train(
        spec, comm, [](const v1::Metrics&) {}, nullptr, options);
  }
  MemoryStore store;
  NcclOptions nccl;
  nccl.device = 0;
  absl::StatusOr<std::shared_ptr<Communicator>> comm = CreateNcclCommunicator(nccl, store);
  if (!comm.ok()) return comm.status();
  EXPECT_TRUE((*comm)->device().is_cuda());
  return Train(
      spec, **comm, [](const v1::Metrics&) {}, nullptr, options);
}

// max |a - b| / max |a| over every tensor of a model.
double RelativeDifference(const std::map<std::string, at::Tensor>& a,
                          const std::map<std::string, at::Tensor>& b) {
  double diff = 0, scale = 0;
  for (const auto& [name, t] : a) {
    diff = std::max(diff, (t - b.at(name)).abs().max().item<double>());
    scale = std::max(scale, t.abs().max().item<double>());
  }
  return diff / std::max(scale, 1e-12);
}

constexpr char kSgdSpec[] = R"pb(
  model { mlp { hidden_sizes: [ 64, 64 ] } }
  data {
    synthetic {
      num_samples: 2048
      input_shape: [ 16 ]
      num_classes: 4
      seed: 3
    }
  }
  training { batch_size_per_rank: 64 epochs: 2 seed: 5 }
  optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
  checkpoint { every_steps: 20 keep_last: 0 }
  eval { every_steps: 16 }
)pb";

TEST(TrainerCudaTest, OneGpuTrainsAsTheCpuDoesWithinFloatTolerance) {
  REQUIRE_GPUS(1);
  const v1::JobSpec spec = Spec(kSgdSpec);
  MemorySink cpu_sink, gpu_sink;
  TrainOptions cpu_options, gpu_options;
  cpu_options.checkpoints = &cpu_sink;
  gpu_options.checkpoints = &gpu_sink;
  absl::StatusOr<v1::Metrics> cpu = TrainOneRank(spec, /*cuda=*/false, cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<v1::Metrics> gpu = TrainOneRank(spec, /*cuda=*/true, gpu_options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  // 2048 / 64 = 32 steps an epoch, 64 in all.
  EXPECT_EQ(gpu->step(), 64);
  EXPECT_EQ(gpu_sink.Steps(), (std::vector<int64_t>{20, 40, 60, 64}));
  const std::map<std::string, at::Tensor> a = cpu_sink.Model(64);
  const std::map<std::string, at::Tensor> b = gpu_sink.Model(64);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : b) {
    // A checkpoint file loads anywhere: its tensors are CPU tensors.
    EXPECT_TRUE(t.is_cpu()) << name << " was saved on " << t.device();
  }
  const double relative = RelativeDifference(a, b);
  std::cout << "GPU vs CPU after 64 SGD steps: max relative difference " << relative
            << "; eval loss " << gpu->eval_loss() << " vs " << cpu->eval_loss() << std::endl;
  EXPECT_LT(relative, 1e-4);
  EXPECT_NEAR(gpu->eval_loss(), cpu->eval_loss(), 1e-4 * std::abs(cpu->eval_loss()));
  EXPECT_NEAR(gpu->eval_accuracy(), cpu->eval_accuracy(), 0.01);
  EXPECT_GT(gpu->eval_accuracy(), 0.5);
}

TEST(TrainerCudaTest, ACheckpointOfAGpuJobResumesBitForBit) {
  REQUIRE_GPUS(1);
  // Adam's moments, the schedule and the sampler's place, all through a
  // checkpoint copied off the GPU asynchronously.
  const v1::JobSpec spec = Spec(R"pb(
    model { mlp { hidden_sizes: [ 64 ] } }
    data {
      synthetic {
        num_samples: 2048
        input_shape: [ 16 ]
        num_classes: 4
        seed: 3
      }
    }
    training { batch_size_per_rank: 64 epochs: 2 seed: 5 }
    optimizer { kind: ADAM lr: 0.005 }
    lr_schedule { cosine { warmup_steps: 5 } }
    checkpoint { every_steps: 20 keep_last: 0 }
  )pb");
  MemorySink uninterrupted;
  TrainOptions options;
  options.checkpoints = &uninterrupted;
  absl::StatusOr<v1::Metrics> full = TrainOneRank(spec, /*cuda=*/true, options);
  ASSERT_TRUE(full.ok()) << full.status();
  MemorySink resumed;
  ASSERT_TRUE(resumed.Put(20, *uninterrupted.Load(At(20))).ok());
  TrainOptions resume;
  resume.checkpoints = &resumed;
  resume.resume = At(20);
  absl::StatusOr<v1::Metrics> second = TrainOneRank(spec, /*cuda=*/true, resume);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->step(), 64);
  for (int64_t step : {40, 60, 64}) {
    const std::map<std::string, at::Tensor> a = uninterrupted.Model(step);
    const std::map<std::string, at::Tensor> b = resumed.Model(step);
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, t] : a) {
      EXPECT_TRUE(at::equal(t, b.at(name))) << name << " differs at step " << step;
    }
  }
  EXPECT_EQ(second->eval_accuracy(), full->eval_accuracy());
  EXPECT_EQ(second->eval_loss(), full->eval_loss());
}

// One 64 MB parameter on the GPU.
class BigParameter : public Model {
 public:
  BigParameter() : p_(at::ones({16 << 20}, at::TensorOptions().device(at::kCUDA, 0))) {}
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& x) override { return x; }
  std::vector<NamedTensor> NamedParameters() override { return {{"p", p_}}; }
  std::vector<NamedTensor> NamedBuffers() override { return {}; }
  void SetTraining(bool) override {}
  at::Tensor& p() { return p_; }

 private:
  at::Tensor p_;
};

TEST(TrainerCudaTest, ASnapshotOffTheGpuIsQueuedAndFencedNotWaitedFor) {
  REQUIRE_GPUS(1);
  BigParameter model;
  const Snapshot layout = SnapshotLayout(model, {});
  const Snapshot spare = AllocateLike(layout, /*pinned=*/true);
  ASSERT_EQ(spare.model.size(), 1u);
  EXPECT_TRUE(spare.model[0].second.is_pinned());
  // Queue ~0.3 s or more of matrix products, then a write the snapshot must
  // see: the snapshot is taken behind them.
  at::Tensor m = at::randn({4096, 4096}, at::TensorOptions().device(at::kCUDA, 0));
  for (int i = 0; i < 200; ++i) m = at::tanh(at::mm(m, m));
  model.p().fill_(7);
  const absl::Time start = absl::Now();
  Snapshot s = TakeSnapshot(model, {}, TrainingPosition{}, &spare);
  const absl::Duration queued = absl::Now() - start;
  ASSERT_NE(s.ready, nullptr);
  // The same pinned memory, reused.
  EXPECT_EQ(s.model[0].second.data_ptr(), spare.model[0].second.data_ptr());
  ASSERT_TRUE(s.ready->Wait().ok());
  const absl::Duration done = absl::Now() - start;
  std::cout << "snapshot of 64 MB behind queued GPU work: returned after " << queued
            << ", copies done after " << done << std::endl;
  EXPECT_TRUE(at::equal(s.model[0].second, at::full({16 << 20}, 7.0f)));
  EXPECT_LT(queued, done / 4) << "TakeSnapshot waited for the GPU";
}

}  // namespace
}  // namespace chorus
