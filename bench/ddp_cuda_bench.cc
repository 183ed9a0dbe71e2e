// ddp_cuda_bench: Chorus DDP over NCCL against PyTorch DDP over NCCL, and
// against the same training loop without DDP, on GPUs.
//
//   ddp_cuda_bench [--model mlp|cnn|all] [--gpus N] [--python PYTHON] [--view 0|1]
//                  [--trace DIR]
//
// (tests/gpu/run.sh builds and runs it; with Bazel: --config=cuda and a CUDA
// LibTorch.) Models: the MLP 784-2048x4-10 of ddp_bench (14.2 M parameters,
// batch 1024 per GPU) and a VGG-style CNN for 3x32x32 images (9.2 M
// parameters, batch 256 per GPU); SGD, fixed random data, one rank per GPU
// (threads of this process; GPUs: all visible, or --gpus). Each figure is the
// median over 7 blocks of 30 steps of the time per step, the device
// synchronized around each block, after 20 warm-up steps. The PyTorch side
// (bench/pytorch_ddp_cuda_bench.py, one process per GPU) runs in the same
// invocation with the same model, batch and timing. Prints two result lines
// (docs/benchmarks.md) per model: Chorus DDP / PyTorch DDP, and Chorus DDP / the loop without
// DDP (the DDP overhead; on one GPU all of it is bookkeeping and the NCCL
// launch, as there is nothing to exchange). --view 1 runs both sides with
// gradients as bucket views (as the built-in trainer runs DDP); default 0,
// both sides copying gradients into the buckets (PyTorch's default).
// --trace DIR: after the timed blocks, rank 0 of each side profiles 10 more
// steps of each loop with PyTorch's profiler (Kineto: host ops, CUDA runtime
// calls and GPU kernels) and writes Chrome traces to DIR: chorus_ddp_MODEL.json,
// chorus_plain_MODEL.json, pytorch_ddp_MODEL.json, pytorch_plain_MODEL.json
// (tests/gpu/trace_summary.py compares them).

#include <ATen/Context.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
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
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chorus/distributed_data_parallel.h"
#include "common/env_names.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/store.h"

namespace chorus {
namespace {

constexpr int kWarmup = 20;
constexpr int kBlocks = 7;
constexpr int kStepsPerBlock = 30;
constexpr int kTracedSteps = 10;

torch::nn::Sequential MakeModel(const std::string& name) {
  torch::nn::Sequential model;
  if (name == "mlp") {
    int64_t width = 784;
    for (int i = 0; i < 4; ++i) {
      model->push_back(torch::nn::Linear(width, 2048));
      model->push_back(torch::nn::ReLU());
      width = 2048;
    }
    model->push_back(torch::nn::Linear(width, 10));
    return model;
  }
  int64_t width = 3;
  const std::vector<std::pair<int64_t, bool>> layers = {{64, false},  {128, true},  {256, false},
                                                        {256, true},  {512, false}, {512, true},
                                                        {512, false}, {512, false}};
  for (auto [channels, pool] : layers) {
    model->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(width, channels, 3).padding(1)));
    model->push_back(torch::nn::ReLU());
    if (pool) model->push_back(torch::nn::MaxPool2d(2));
    width = channels;
  }
  model->push_back(torch::nn::AdaptiveAvgPool2d(1));
  model->push_back(torch::nn::Flatten());
  model->push_back(torch::nn::Linear(512, 10));
  return model;
}

int64_t Parameters(torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

// Median over blocks of the time per step of `step`, in milliseconds.
template <typename Step>
double MedianStepMs(int device, const Step& step) {
  for (int i = 0; i < kWarmup; ++i) step();
  std::vector<double> times;
  for (int b = 0; b < kBlocks; ++b) {
    torch::cuda::synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kStepsPerBlock; ++i) step();
    torch::cuda::synchronize(device);
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    times.push_back(took.count() / kStepsPerBlock);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Runs kTracedSteps steps; with a path, under the Kineto profiler, whose
// Chrome trace it writes there. Returns an error message, empty if none.
std::string TraceSteps(const std::string& path, int device, const std::function<void()>& step) {
  namespace profiler = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities = {ActivityType::CPU, ActivityType::CUDA};
  try {
    if (!path.empty()) {
      profiler::prepareProfiler(config, activities);
      profiler::enableProfiler(config, activities);
    }
    torch::cuda::synchronize(device);
    for (int i = 0; i < kTracedSteps; ++i) step();
    torch::cuda::synchronize(device);
    if (!path.empty()) profiler::disableProfiler()->save(path);
  } catch (const std::exception& e) {
    return std::string("tracing to ") + path + " failed: " + e.what();
  }
  return "";
}

struct RankResult {
  double plain_ms = 0;
  double ddp_ms = 0;
  std::string error;
};

RankResult RunRank(const std::string& name, int rank, int gpus, int64_t batch, bool view,
                   const std::string& trace_dir, Store& store) {
  RankResult result;
  const torch::Device device(torch::kCUDA, rank);
  torch::manual_seed(0);
  const torch::Tensor x =
      name == "mlp" ? torch::randn({batch, 784}, device) : torch::randn({batch, 3, 32, 32}, device);
  const torch::Tensor y =
      torch::randint(0, 10, {batch}, torch::TensorOptions(device).dtype(torch::kLong));

  torch::nn::Sequential plain = MakeModel(name);
  plain->to(device);
  torch::optim::SGD plain_opt(plain->parameters(), torch::optim::SGDOptions(0.01));
  const auto plain_step = [&] {
    plain_opt.zero_grad();
    torch::nn::functional::cross_entropy(plain->forward(x), y).backward();
    plain_opt.step();
  };
  result.plain_ms = MedianStepMs(rank, plain_step);
  // Rank 0 traces; the others run the same steps untraced.
  const auto trace_path = [&](const std::string& side) {
    return rank == 0 && !trace_dir.empty() ? trace_dir + "/chorus_" + side + "_" + name + ".json"
                                           : std::string();
  };
  if (!trace_dir.empty()) {
    result.error = TraceSteps(trace_path("plain"), rank, plain_step);
    if (!result.error.empty()) return result;
  }

  NcclOptions options;
  options.rank = rank;
  options.size = gpus;
  options.device = rank;
  auto comm = CreateNcclCommunicator(options, store);
  if (!comm.ok()) {
    result.error = std::string(comm.status().message());
    return result;
  }
  torch::manual_seed(0);
  torch::nn::Sequential model = MakeModel(name);
  model->to(device);
  DdpOptions ddp_options;
  ddp_options.gradient_as_bucket_view = view;
  auto ddp = DistributedDataParallel::ForModule(*model, **comm, ddp_options);
  if (!ddp.ok()) {
    result.error = std::string(ddp.status().message());
    return result;
  }
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01));
  absl::Status failed;
  const auto ddp_step = [&] {
    opt.zero_grad();
    absl::Status s = (*ddp)->PrepareForBackward();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    if (s.ok()) s = (*ddp)->FinishGradientSync();
    if (failed.ok() && !s.ok()) failed = s;
    opt.step();
  };
  result.ddp_ms = MedianStepMs(rank, ddp_step);
  if (!trace_dir.empty()) result.error = TraceSteps(trace_path("ddp"), rank, ddp_step);
  if (!failed.ok()) result.error = std::string(failed.message());
  return result;
}

std::map<std::string, std::string> ReadPeer(const std::string& path) {
  std::map<std::string, std::string> values;
  std::ifstream in(path);
  std::string key, value;
  while (in >> key >> value) values[key] = value;
  return values;
}

struct BenchFlags {
  std::string models = "all";
  int gpus = 0;  // 0: all visible
  std::string python;
  std::string script = "bench/pytorch_ddp_cuda_bench.py";
  bool view = false;
  std::string trace_dir;
};

// The flags of the usage above (and --script, the PyTorch side's path);
// false after saying what is wrong.
bool ParseFlags(int argc, char** argv, BenchFlags& flags) {
  const char* env_python = std::getenv(kEnvTestPython);
  flags.python = env_python != nullptr ? env_python : "python3";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") {
      flags.models = argv[i + 1];
    } else if (flag == "--gpus") {
      flags.gpus = std::atoi(argv[i + 1]);
    } else if (flag == "--python") {
      flags.python = argv[i + 1];
    } else if (flag == "--script") {
      flags.script = argv[i + 1];
    } else if (flag == "--view" &&
               (std::string(argv[i + 1]) == "0" || std::string(argv[i + 1]) == "1")) {
      flags.view = std::string(argv[i + 1]) == "1";
    } else if (flag == "--trace") {
      flags.trace_dir = argv[i + 1];
    } else {
      std::cerr << "ddp_cuda_bench: unknown flag or value " << flag << " " << argv[i + 1]
                << " (flags: --model mlp|cnn|all, --gpus N, --python PATH, --script PATH, "
                   "--view 0|1, --trace DIR)\n";
      return false;
    }
  }
  return true;
}

// The PyTorch side's figures for one model.
struct PeerTimes {
  double ddp_ms = 0;
  double plain_ms = 0;
  std::string version;  // PyTorch's
};

// Runs the PyTorch side (one process per GPU) for model `name`, writing to
// `out`; nullopt after saying why it failed.
std::optional<PeerTimes> RunPeer(const BenchFlags& flags, const std::string& name, int64_t batch,
                                 const std::string& out) {
  std::ostringstream command;
  command << flags.python << " " << flags.script << " " << out << " " << name << " " << flags.gpus
          << " " << batch << " " << kWarmup << " " << kBlocks << " " << kStepsPerBlock << " "
          << (flags.view ? 1 : 0);
  if (!flags.trace_dir.empty()) command << " " << flags.trace_dir;
  if (std::system(command.str().c_str()) != 0) {
    std::cerr << "ddp_cuda_bench: the PyTorch run failed: " << command.str() << "\n";
    return std::nullopt;
  }
  std::map<std::string, std::string> peer = ReadPeer(out);
  if (!peer.count("ddp") || !peer.count("plain")) {
    std::cerr << "ddp_cuda_bench: the PyTorch run wrote no times to " << out << "\n";
    return std::nullopt;
  }
  return PeerTimes{std::stod(peer["ddp"]), std::stod(peer["plain"]), peer["version"]};
}

// Runs Chorus's side for model `name`: one rank per GPU, as threads of this
// process. Rank 0's result; nullopt after saying which rank failed and why.
std::optional<RankResult> RunChorusRanks(const BenchFlags& flags, const std::string& name,
                                         int64_t batch) {
  MemoryStore store;
  std::vector<RankResult> results(flags.gpus);
  std::vector<std::thread> threads;
  for (int r = 0; r < flags.gpus; ++r) {
    threads.emplace_back([&, r] {
      results[r] = RunRank(name, r, flags.gpus, batch, flags.view, flags.trace_dir, store);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < flags.gpus; ++r) {
    if (!results[r].error.empty()) {
      std::cerr << "ddp_cuda_bench: rank " << r << ": " << results[r].error << "\n";
      return std::nullopt;
    }
  }
  return results[0];
}

// One model's figures: the details on stderr, the two result lines on
// stdout.
void PrintResult(const BenchFlags& flags, const std::string& name, int64_t batch,
                 const RankResult& ours, const PeerTimes& peer) {
  const int64_t params = Parameters(*MakeModel(name));
  const double ddp = ours.ddp_ms;
  const double plain = ours.plain_ms;
  char line[1024];
  std::fprintf(stderr,
               "%s (%.1f M parameters, batch %lld per GPU, %d GPU(s)): Chorus DDP %.3f ms/step, "
               "PyTorch DDP %.3f ms/step; without DDP: Chorus's loop %.3f ms, PyTorch's %.3f "
               "ms; DDP overhead Chorus %.1f%%, PyTorch %.1f%%\n",
               name.c_str(), params / 1e6, static_cast<long long>(batch), flags.gpus, ddp,
               peer.ddp_ms, plain, peer.plain_ms, 100 * (ddp / plain - 1),
               100 * (peer.ddp_ms / peer.plain_ms - 1));
  std::snprintf(line, sizeof(line),
                "{\"bench\": \"ddp_cuda_%s\", \"metric\": \"median_step_time\", \"unit\": "
                "\"ms\", \"ours\": %.4f, \"peer\": %.4f, \"peer_name\": \"PyTorch DDP %s "
                "(NCCL)\", \"ratio\": %.4f, \"gpus\": %d, \"batch_per_gpu\": %lld, "
                "\"gradient_as_bucket_view\": %s}",
                name.c_str(), ddp, peer.ddp_ms, peer.version.c_str(), ddp / peer.ddp_ms, flags.gpus,
                static_cast<long long>(batch), flags.view ? "true" : "false");
  std::cout << line << std::endl;
  std::snprintf(line, sizeof(line),
                "{\"bench\": \"ddp_cuda_%s_overhead\", \"metric\": \"median_step_time\", "
                "\"unit\": \"ms\", \"ours\": %.4f, \"peer\": %.4f, \"peer_name\": \"the same "
                "loop without DDP\", \"ratio\": %.4f, \"gpus\": %d, "
                "\"pytorch_ddp_overhead_ratio\": %.4f}",
                name.c_str(), ddp, plain, ddp / plain, flags.gpus, peer.ddp_ms / peer.plain_ms);
  std::cout << line << std::endl;
}

int Main(int argc, char** argv) {
  BenchFlags flags;
  if (!ParseFlags(argc, argv, flags)) return 2;
  if (!NcclAvailable() || !at::hasCUDA() || torch::cuda::device_count() < 1) {
    std::cerr << "ddp_cuda_bench: needs an NCCL build (--config=cuda or tests/gpu), a CUDA "
                 "LibTorch and a GPU; here: nccl="
              << NcclAvailable() << " libtorch_cuda=" << at::hasCUDA() << "\n";
    return 2;
  }
  const int visible = static_cast<int>(torch::cuda::device_count());
  if (flags.gpus <= 0 || flags.gpus > visible) flags.gpus = visible;
  std::vector<std::string> names;
  if (flags.models == "all" || flags.models == "mlp") names.push_back("mlp");
  if (flags.models == "all" || flags.models == "cnn") names.push_back("cnn");
  if (names.empty()) {
    std::cerr << "ddp_cuda_bench: --model must be mlp, cnn or all, got " << flags.models << "\n";
    return 2;
  }
  char dir_template[] = "/tmp/ddp_cuda_bench.XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) {
    std::perror("ddp_cuda_bench: mkdtemp");
    return 1;
  }
  for (const std::string& name : names) {
    const int64_t batch = name == "mlp" ? 1024 : 256;
    const std::optional<PeerTimes> peer =
        RunPeer(flags, name, batch, std::string(dir) + "/peer_" + name);
    if (!peer) return 1;
    const std::optional<RankResult> ours = RunChorusRanks(flags, name, batch);
    if (!ours) return 1;
    PrintResult(flags, name, batch, *ours, *peer);
  }
  std::string cleanup = std::string("rm -rf ") + dir;
  if (std::system(cleanup.c_str()) != 0) std::cerr << "could not remove " << dir << "\n";
  return 0;
}

}  // namespace
}  // namespace chorus

int main(int argc, char** argv) { return chorus::Main(argc, argv); }
