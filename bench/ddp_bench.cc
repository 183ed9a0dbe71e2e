// ddp_bench: Chorus DDP against PyTorch DDP on the same model, data shape and
// thread count, plus one process without any DDP (compute only).
//
//   bazel run -c opt //bench:ddp_bench [-- --steps_scale 1.0]
//
// Models: MLP 784-1024-1024-1024-10 (small) and 784-2048-2048-2048-2048-10
// (big, 14.2 M parameters); batch 64 per rank; SGD; 2 processes x 1 thread on
// 127.0.0.1 (gloo). Chorus runs four times: as the built-in trainer runs DDP
// by default (the transport measured per message size, gradients as bucket
// views: Note [Gradients as bucket views]; each rank bound to its half of
// the CPUs, as an agent with two slots binds them: Note [Binding ranks to
// CPUs]; the ratio), with shared memory
// forced (CHORUS_GLOO_SHM=1), over TCP (CHORUS_GLOO_SHM=0), and with
// gradient_as_bucket_view off (copies into the buckets and back, as PyTorch
// DDP makes by default: the like-for-like figure, also in the JSON line as
// ours_views_off_ms). `--view 0|1` runs both sides with views off or on
// instead (and Chorus three times). Every step starts after a barrier; the
// figure is the median step time after 30 warm-up steps (both sides), which
// include the transport measurement and the heap's growth to its steady
// size (Note [Warm-up] below). The bench's own processes keep freed memory
// for reuse as chorus-rank does (common/memory.h); the PyTorch peer runs as
// PyTorch users run it. Prints one result line (docs/benchmarks.md) per model, the big
// model last; ratio = Chorus step time / PyTorch DDP step time. Overlap
// efficiency is the share of communication hidden behind compute:
//   1 - (ddp_step - compute_only) / allreduce_all_gradients_alone.
// Compute only is timed three times: one process alone, two processes at
// once (the floor for two ranks sharing this machine's caches and memory),
// and by the ranks of one more default run, in blocks interleaved with their
// DDP steps (Note [Interleaved compute]; `interleaved_step_ms` over
// `interleaved_compute_ms` in the JSON line is the step / compute taken in
// the same minutes).
//
//   bazel run -c opt //bench:ddp_bench -- --metrics_overhead 1
//
// instead measures what observability costs a rank (Note [Metrics overhead]):
// the big MLP under Chorus DDP, its steps alternating in blocks between the
// bare loop and the loop with everything chorus-rank adds for the
// coordinator's metrics and hang detection; ratio = with / without.

#include <spawn.h>
#include <sys/wait.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "chorus/distributed_data_parallel.h"
#include "common/cpu_binding.h"
#include "common/env_names.h"
#include "common/machine_facts.h"
#include "common/memory.h"
#include "common/status_macros.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"
#include "worker/runtime/heartbeat_compose.h"
#include "worker/runtime/training_progress.h"
#include "worker/train/metrics_window.h"

extern char** environ;

namespace chorus {
namespace {

constexpr int kBatch = 64;

torch::nn::Sequential MakeMlp(const std::vector<int64_t>& hidden) {
  torch::nn::Sequential model;
  int64_t width = 784;
  for (int64_t h : hidden) {
    model->push_back(torch::nn::Linear(width, h));
    model->push_back(torch::nn::ReLU());
    width = h;
  }
  model->push_back(torch::nn::Linear(width, 10));
  return model;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median step time of one process training without DDP.
double ComputeOnly(const std::vector<int64_t>& hidden, int warmup, int steps) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  torch::nn::Sequential model = MakeMlp(hidden);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01));
  torch::Tensor x = torch::randn({kBatch, 784});
  torch::Tensor y = torch::randint(0, 10, {kBatch});
  std::vector<double> times;
  for (int i = 0; i < warmup + steps; ++i) {
    absl::Time start = absl::Now();
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    opt.step();
    if (i >= warmup) times.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  return Median(times);
}

// Note [Metrics overhead]
// What a chorus-rank does for observability around each step, beyond
// training: it stamps every phase into TrainingProgress (the heartbeat's
// phase and time in phase), times its wait in gradient synchronization
// (the straggler attribution's input), reads the loss, folds step time,
// wait and loss into a MetricsWindow and publishes the window's figures to
// the progress atomics every report window; and a heartbeat thread composes
// the rank's heartbeat, flight-recorder summary included, once a second and
// serializes it. With --observe the rank alternates blocks of
// kObserveBlock steps without and with all of that (the heartbeat thread
// composes only during "with" blocks), so both halves see the same machine
// state; the figure is the ratio of the two medians.
constexpr int kObserveBlock = 5;
constexpr int kReportWindowSteps = 10;

// Note [Interleaved compute]
// "Step / compute only" divides a DDP step by a step without any DDP. Timed
// minutes apart, in separate processes, the two see different machines: on
// this shared 2-core VM one run timed the big MLP's compute alone at 117 ms
// and its DDP steps, a minute earlier, at 187 ms while PyTorch's steps had
// also slowed from 181-220 to 261 ms. So for the default configuration the
// ranks of one more run interleave: after the warm-up, blocks of kComputeBlock
// DDP steps alternate with blocks of as many steps of a second, plain copy
// of the model (no DDP, no hooks, same data), both ranks computing at once
// after a barrier, as they do in a DDP step. Both medians then come from the
// same minutes. On a quiet machine the plain steps take what one process
// alone takes (the separately timed figures are printed too).
constexpr int kComputeBlock = 5;
constexpr int kComputeWarmup = 10;

// Note [Metrics overhead]: an observed rank's heartbeat thread. Once a
// second, while observing is on, it composes the rank's heartbeat (flight
// recorder summary included) and serializes it. Joined on destruction.
class HeartbeatComposer {
 public:
  // `progress` and `comm` must outlive this.
  HeartbeatComposer(int rank, const TrainingProgress& progress, const Communicator& comm)
      : thread_([this, rank, &progress, &comm] { Compose(rank, progress, comm); }) {}
  ~HeartbeatComposer() {
    stop_.store(true);
    thread_.join();
  }
  HeartbeatComposer(const HeartbeatComposer&) = delete;
  HeartbeatComposer& operator=(const HeartbeatComposer&) = delete;

  void SetObserving(bool on) { observing_.store(on); }
  // Bytes of the heartbeats composed so far.
  int64_t bytes() const { return bytes_.load(); }

 private:
  void Compose(int rank, const TrainingProgress& progress, const Communicator& comm) {
    absl::Time next = absl::Now() + absl::Seconds(1);
    while (!stop_.load()) {
      absl::SleepFor(absl::Milliseconds(10));
      if (absl::Now() < next) continue;
      next += absl::Seconds(1);
      if (!observing_.load()) continue;
      v1::RankHeartbeat hb = ProgressHeartbeat(progress, &comm.flight_recorder(), absl::Now());
      hb.set_rank(rank);
      bytes_ += hb.SerializeAsString().size();
    }
  }

  std::atomic<bool> observing_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> bytes_{0};
  std::thread thread_;  // last: it starts once the flags above exist
};

struct RankOptions {
  int rank = 0;
  std::string store_dir;
  std::vector<int64_t> hidden;
  int warmup = 0;
  int steps = 0;
  bool view = false;
  bool observe = false;     // Note [Metrics overhead]
  bool interleave = false;  // Note [Interleaved compute]; ignored with observe
};

// One Chorus rank: trains with DDP, then times an all-reduce of every
// gradient at once without compute. Rank 0 writes "step_ms comm_ms
// forward_backward_ms finish_ms faults_per_step plain_ms" (plain_ms: the
// interleaved steps without DDP, Note [Interleaved compute], with
// `interleave`; else 0), or with `observe` (Note [Metrics overhead])
// "off_ms on_ms heartbeat_bytes". Failures a user can act on (the
// communicator, DDP, a gradient sync) are printed where they happen.
class BenchRank {
 public:
  static absl::StatusOr<std::unique_ptr<BenchRank>> Create(RankOptions options) {
    options.interleave = options.interleave && !options.observe;
    std::unique_ptr<BenchRank> bench(new BenchRank(std::move(options)));
    RETURN_IF_ERROR(bench->Build());
    return bench;
  }

  // Trains, then writes rank 0's result.
  absl::Status Run() {
    RETURN_IF_ERROR(Train());
    if (options_.observe) {
      if (options_.rank == 0) {
        std::ofstream out(options_.store_dir + "/result");
        out << Median(times_) << " " << Median(observed_times_) << " " << heartbeats_->bytes()
            << "\n";
      }
      return Barrier();
    }
    ASSIGN_OR_RETURN(const double comm_ms, AllGradientsAllReduceMs());
    if (options_.rank == 0) {
      std::ofstream out(options_.store_dir + "/result");
      out << Median(times_) << " " << comm_ms << " " << Median(backward_ms_) << " "
          << Median(finish_ms_) << " " << static_cast<double>(faults_) / times_.size() << " "
          << (plain_times_.empty() ? 0.0 : Median(plain_times_)) << "\n";
    }
    return Barrier();
  }

 private:
  explicit BenchRank(RankOptions options) : options_(std::move(options)), window_(absl::Now()) {}

  // The communicator, the model under DDP and the plain copy, in the order
  // that draws the same random numbers on every run.
  absl::Status Build() {
    ASSIGN_OR_RETURN(store_, FileStore::Open(options_.store_dir));
    GlooOptions gloo;
    gloo.rank = options_.rank;
    gloo.size = 2;
    absl::StatusOr<std::shared_ptr<Communicator>> comm = CreateGlooCommunicator(gloo, *store_);
    if (!comm.ok()) {
      std::cerr << comm.status() << "\n";
      return comm.status();
    }
    comm_ = *comm;
    torch::manual_seed(0);
    model_ = MakeMlp(options_.hidden);
    DdpOptions ddp_options;
    ddp_options.gradient_as_bucket_view = options_.view;
    auto ddp = DistributedDataParallel::ForModule(*model_, *comm_, ddp_options);
    if (!ddp.ok()) {
      std::cerr << ddp.status() << "\n";
      return ddp.status();
    }
    ddp_ = std::move(*ddp);
    opt_ =
        std::make_unique<torch::optim::SGD>(model_->parameters(), torch::optim::SGDOptions(0.01));
    x_ = torch::randn({kBatch, 784});
    y_ = torch::randint(0, 10, {kBatch});
    plain_ = MakeMlp(options_.hidden);
    plain_opt_ =
        std::make_unique<torch::optim::SGD>(plain_->parameters(), torch::optim::SGDOptions(0.01));
    window_ = MetricsWindow(absl::Now());
    if (options_.observe) heartbeats_.emplace(options_.rank, progress_, *comm_);
    return absl::OkStatus();
  }

  absl::Status Barrier() { return comm_->Barrier("bench")->Wait(absl::Now() + absl::Seconds(60)); }

  // The warm-up, then the measured steps: with observe, blocks of
  // kObserveBlock steps alternate without and with observability; with
  // interleave, blocks of kComputeBlock DDP steps alternate with as many
  // plain steps.
  absl::Status Train() {
    const int warmup = options_.warmup;
    const int total = options_.observe || options_.interleave ? warmup + 2 * options_.steps
                                                              : warmup + options_.steps;
    for (int i = 0; i < total; ++i) {
      if (options_.interleave && i == warmup) {
        for (int w = 0; w < kComputeWarmup; ++w) RETURN_IF_ERROR(PlainStep().status());
      }
      if (options_.interleave && i >= warmup && ((i - warmup) / kComputeBlock) % 2 == 1) {
        ASSIGN_OR_RETURN(const double ms, PlainStep());
        plain_times_.push_back(ms);
        continue;
      }
      // Warm-up steps run observed; then blocks alternate, starting without.
      const bool on = options_.observe && (i < warmup || ((i - warmup) / kObserveBlock) % 2 == 1);
      if (heartbeats_) heartbeats_->SetObserving(on);
      RETURN_IF_ERROR(DdpStep(i, on));
    }
    return absl::OkStatus();
  }

  // Note [Interleaved compute]: one step of the plain copy, after a barrier
  // as a DDP step; its milliseconds.
  absl::StatusOr<double> PlainStep() {
    RETURN_IF_ERROR(Barrier());
    const absl::Time start = absl::Now();
    plain_opt_->zero_grad();
    torch::nn::functional::cross_entropy(plain_->forward(x_), y_).backward();
    plain_opt_->step();
    return absl::ToDoubleMilliseconds(absl::Now() - start);
  }

  // Step `i` under DDP, after a barrier, with observability when `on`;
  // records its times once past the warm-up.
  absl::Status DdpStep(int i, bool on) {
    RETURN_IF_ERROR(Barrier());
    const int64_t faults_before = MinorPageFaults();
    const absl::Time start = absl::Now();
    if (on) progress_.Enter(v1::DATA);
    opt_->zero_grad();
    RETURN_IF_ERROR(ddp_->PrepareForBackward());
    if (on) progress_.Enter(v1::FORWARD);
    torch::Tensor loss = torch::nn::functional::cross_entropy(model_->forward(x_), y_);
    if (on) progress_.Enter(v1::BACKWARD);
    loss.backward();
    const absl::Time backward_done = absl::Now();
    if (on) progress_.Enter(v1::COLLECTIVE);
    if (absl::Status s = ddp_->FinishGradientSync(); !s.ok()) {
      std::cerr << s << "\n";
      return s;
    }
    const absl::Time synced = absl::Now();
    if (on) progress_.Enter(v1::OPTIMIZER);
    opt_->step();
    if (on) Observe(i, loss, synced - backward_done);
    if (i < options_.warmup) return absl::OkStatus();
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (on) {
      observed_times_.push_back(ms);
      return absl::OkStatus();
    }
    faults_ += MinorPageFaults() - faults_before;
    times_.push_back(ms);
    backward_ms_.push_back(absl::ToDoubleMilliseconds(backward_done - start));
    finish_ms_.push_back(absl::ToDoubleMilliseconds(synced - backward_done));
    return absl::OkStatus();
  }

  // Note [Metrics overhead]: what chorus-rank does after step `i`: fold it
  // into the window, and every report window publish the window's figures.
  void Observe(int i, const torch::Tensor& loss, absl::Duration wait) {
    window_.AddMicroBatch(loss.item<double>(), absl::ToDoubleSeconds(wait));
    window_.EndStep();
    progress_.step.store(i + 1);
    if ((i + 1) % kReportWindowSteps != 0) return;
    const MetricsWindow::Summary summary = window_.Close(absl::Now(), kBatch * 2);
    progress_.step_seconds.store(summary.step_seconds);
    progress_.compute_seconds.store(summary.compute_seconds);
    progress_.comm_wait_seconds.store(summary.wait_seconds);
    progress_.loss.store(summary.loss);
    progress_.samples_per_second.store(summary.samples_per_second / 2);
  }

  // Median time of an all-reduce of every gradient at once, without
  // compute (the first of 6 not counted).
  absl::StatusOr<double> AllGradientsAllReduceMs() {
    int64_t numel = 0;
    for (const auto& p : model_->parameters()) numel += p.numel();
    torch::Tensor all = torch::zeros({numel});
    std::vector<double> comm_times;
    for (int i = 0; i < 6; ++i) {
      RETURN_IF_ERROR(Barrier());
      const absl::Time start = absl::Now();
      RETURN_IF_ERROR(comm_->AllReduce(all, ReduceOp::kAvg, "bench/all")
                          ->Wait(absl::Now() + absl::Seconds(60)));
      if (i > 0) comm_times.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
    return Median(comm_times);
  }

  const RankOptions options_;
  std::unique_ptr<FileStore> store_;
  std::shared_ptr<Communicator> comm_;
  torch::nn::Sequential model_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<torch::optim::SGD> opt_;
  torch::Tensor x_, y_;
  // Note [Interleaved compute]: the plain copy, its optimizer and step times.
  torch::nn::Sequential plain_;
  std::unique_ptr<torch::optim::SGD> plain_opt_;
  std::vector<double> plain_times_;
  // DDP steps past the warm-up: unobserved ones (with their parts and page
  // faults) and observed ones.
  std::vector<double> times_, backward_ms_, finish_ms_, observed_times_;
  int64_t faults_ = 0;
  // Observability (Note [Metrics overhead]); the heartbeats are declared
  // last so their thread is joined first.
  TrainingProgress progress_;
  MetricsWindow window_;
  std::optional<HeartbeatComposer> heartbeats_;
};

// As an agent with two slots starts its ranks (Note [Binding ranks to
// CPUs]); first, so every thread the rank starts inherits it. False (and
// said why) if it could not.
bool BindToSlot(int rank) {
  const std::vector<int> cpus = SlotCpus(AllowedCpus(), rank, 2);
  if (cpus.empty()) return true;
  if (absl::Status bound = BindThisThread(cpus); !bound.ok()) {
    std::cerr << "rank " << rank << ": " << bound << "\n";
    return false;
  }
  return true;
}

int RunRank(const RankOptions& options) {
  if (!BindToSlot(options.rank)) return 1;
  at::set_num_threads(1);
  absl::StatusOr<std::unique_ptr<BenchRank>> bench = BenchRank::Create(options);
  if (!bench.ok()) return 1;
  return (*bench)->Run().ok() ? 0 : 1;
}

int SpawnAndWait(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Starts the two rank processes of a Chorus run (this binary with --rank)
// and waits for them; true if both succeeded.
bool RunChorusRanks(const std::string& self, const std::string& store_dir,
                    const std::vector<std::string>& hidden, int warmup, int steps, bool view,
                    bool observe, bool interleave = false) {
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = {self,
                                     "--rank",
                                     std::to_string(r),
                                     "--store",
                                     store_dir,
                                     "--hidden",
                                     absl::StrJoin(hidden, ","),
                                     "--warmup",
                                     std::to_string(warmup),
                                     "--steps",
                                     std::to_string(steps),
                                     "--view",
                                     view ? "1" : "0",
                                     "--observe",
                                     observe ? "1" : "0",
                                     "--interleave",
                                     interleave ? "1" : "0"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ) != 0) break;
    pids.push_back(pid);
  }
  bool ok = pids.size() == 2;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ok = false;
  }
  return ok;
}

// Note [Metrics overhead]: the big MLP, observed and bare steps alternating.
int RunMetricsOverhead(const std::string& self, double steps_scale) {
  const std::vector<std::string> hidden = {"2048", "2048", "2048", "2048"};
  const int steps = std::max(2 * kObserveBlock, static_cast<int>(40 * steps_scale));
  std::cerr << "machine: " << ReadMachineFacts().ToString() << "\n";
  char tmpl[] = "/tmp/chorus-ddp-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  const std::string store_dir = dir + "/observe.store";
  const bool ok = RunChorusRanks(self, store_dir, hidden, /*warmup=*/8, steps,
                                 /*view=*/true,
                                 /*observe=*/true);
  double off = 0, on = 0;
  int64_t heartbeat_bytes = 0;
  std::ifstream(store_dir + "/result") >> off >> on >> heartbeat_bytes;
  std::system(("rm -rf " + dir).c_str());
  if (!ok || off <= 0 || on <= 0) {
    std::cerr << "the metrics-overhead run failed\n";
    return 1;
  }
  std::cerr << absl::StrFormat(
      "mlp_big, %d steps each way in blocks of %d: without observability %.2f ms/step, with it "
      "%.2f ms/step (rank 0 composed %d bytes of heartbeats)\n",
      steps, kObserveBlock, off, on, heartbeat_bytes);
  std::cout << absl::StrFormat(
                   "{\"bench\": \"ddp_metrics_overhead\", \"metric\": \"median_step_time\", "
                   "\"unit\": \"ms\", \"ours\": %.3f, \"peer\": %.3f, \"peer_name\": \"the "
                   "same ranks without observability\", \"ratio\": %.4f}",
                   on, off, on / off)
            << std::endl;
  return 0;
}

// Note [Warm-up]
// The first steps of a rank grow its heap: glibc hands out fresh pages
// until the free lists hold every size the loop asks for, and each fresh
// page costs a fault (1.8 us on a fresh VM, ~15 us on one up for hours).
// After 8 steps the big MLP still took ~270 faults a step, after 30 none
// (ddp_bench 2026-11-26); measured steps are meant to be the steady state,
// so both sides warm up 30 steps.
struct ModelCase {
  std::string name;
  std::vector<int64_t> hidden;
  int warmup;
  int steps;
};

// What rank 0 of one Chorus run wrote (BenchRank).
struct ChorusRun {
  double step_ms = 0, comm_ms = 0, fwd_bwd_ms = 0, finish_ms = 0, faults_per_step = 0, plain_ms = 0;
};

// One model case of the default bench, in this order: PyTorch DDP; Chorus
// as it trains by default, interleaved with plain steps, with shared memory
// forced, over TCP and (view -1) with views off; compute only in this
// process and in two at once. Then its report: the details on stderr, the
// result line on stdout. Failures are said on stderr.
//
// view: -1 runs each side as it trains by default (Chorus as its built-in
// trainer does: gradients as bucket views; PyTorch DDP: copied) and Chorus
// once more with views off, the like for like; 0 or 1 runs both sides that
// way.
class ModelCaseBench {
 public:
  ModelCaseBench(const std::string& self, const std::string& dir, const ModelCase& model,
                 double steps_scale, int view_flag)
      : self_(self),
        dir_(dir),
        case_(model),
        steps_(std::max(3, static_cast<int>(model.steps * steps_scale))),
        view_flag_(view_flag),
        view_(view_flag != 0) {
    for (int64_t h : model.hidden) hidden_.push_back(std::to_string(h));
  }

  bool Run() {
    if (!RunPeer()) {
      std::cerr << "PyTorch DDP run failed (needs python3-torch: deploy/setup.sh)\n";
      return false;
    }
    // Chorus DDP: two rank processes of this binary, all-reducing through
    // shared memory (the default for ranks on one host) and then over TCP.
    if (!RunChorus("", run_, view_) ||
        !RunChorus("", interleaved_run_, view_, /*interleave=*/true) ||
        !RunChorus("1", shm_run_, view_) || !RunChorus("0", tcp_run_, view_) ||
        (view_flag_ < 0 && !RunChorus("", copied_run_, /*views=*/false)) || peer_ <= 0) {
      std::cerr << "benchmark run failed for " << case_.name << "\n";
      return false;
    }
    compute_ = ComputeOnly(case_.hidden, case_.warmup, steps_);
    if (!TimeConcurrentCompute()) return false;
    PrintDetails();
    PrintResultLine();
    return true;
  }

 private:
  // PyTorch DDP (bench/pytorch_ddp_bench.py): peer_ is its
  // step time, 0 if it wrote none.
  bool RunPeer() {
    const std::string peer_file = dir_ + "/" + case_.name + ".pytorch";
    std::vector<std::string> py = {
        "/usr/bin/python3",           "bench/pytorch_ddp_bench.py", peer_file,
        std::to_string(case_.warmup), std::to_string(steps_),       view_flag_ == 1 ? "1" : "0"};
    py.insert(py.end(), hidden_.begin(), hidden_.end());
    if (SpawnAndWait(py) != 0) return false;
    std::ifstream in(peer_file);
    in >> peer_;
    return true;
  }

  // One Chorus run into `run`. shm: the CHORUS_GLOO_SHM value, "" for the
  // default.
  bool RunChorus(const char* shm, ChorusRun& run, bool views, bool interleave = false) {
    if (*shm != '\0') setenv(kEnvGlooShm, shm, 1);
    const std::string store_dir =
        absl::StrCat(dir_, "/", case_.name, ".store", shm, views == view_ ? "" : ".other",
                     interleave ? ".interleaved" : "");
    const bool ok = RunChorusRanks(self_, store_dir, hidden_, case_.warmup, steps_, views,
                                   /*observe=*/false, interleave);
    unsetenv(kEnvGlooShm);
    std::ifstream in(store_dir + "/result");
    in >> run.step_ms >> run.comm_ms >> run.fwd_bwd_ms >> run.finish_ms >> run.faults_per_step >>
        run.plain_ms;
    return ok && run.step_ms > 0 && (!interleave || run.plain_ms > 0);
  }

  // The floor for two ranks on this machine: two processes computing at
  // once, without any communication (they share cores' caches and memory
  // bandwidth, as the ranks do); concurrent_ is the slower one's step time.
  bool TimeConcurrentCompute() {
    std::vector<pid_t> pids;
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args = {self_,
                                       "--compute_only",
                                       absl::StrCat(dir_, "/", case_.name, ".compute", r),
                                       "--hidden",
                                       absl::StrJoin(hidden_, ","),
                                       "--warmup",
                                       std::to_string(case_.warmup),
                                       "--steps",
                                       std::to_string(steps_)};
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      pid_t pid;
      if (posix_spawn(&pid, self_.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
        return false;
      }
      pids.push_back(pid);
    }
    for (int r = 0; r < 2; ++r) {
      int status = 0;
      waitpid(pids[r], &status, 0);
      double ms = 0;
      std::ifstream in(absl::StrCat(dir_, "/", case_.name, ".compute", r));
      in >> ms;
      if (ms <= 0) {
        std::cerr << "compute-only process " << r << " failed for " << case_.name << "\n";
        return false;
      }
      concurrent_ = std::max(concurrent_, ms);
    }
    return true;
  }

  // The share of communication hidden behind compute in a step of `step` ms.
  double Overlap(double step) const {
    return std::clamp(1.0 - (step - compute_) / run_.comm_ms, 0.0, 1.0);
  }

  void PrintDetails() const {
    const char* name = case_.name.c_str();
    const double ours = run_.step_ms;
    std::cerr << absl::StrFormat(
        "%s: Chorus DDP %.1f ms/step, PyTorch DDP %.1f ms/step, compute only %.1f ms/step, "
        "all-reduce of all gradients alone %.1f ms; overlap efficiency Chorus %.0f%%, "
        "PyTorch %.0f%%; Chorus forward+backward %.1f ms, waiting for buckets %.1f ms\n"
        "%s: step / compute only %.3f; two processes computing at once (no communication) "
        "%.1f ms/step, step / that %.3f; a run whose ranks interleave their DDP steps with steps "
        "without DDP (Note [Interleaved compute]) %.1f ms/step, their DDP step / that %.3f; page "
        "faults per step on rank 0: %.1f (shared memory forced %.1f, TCP %.1f)\n"
        "%s: Chorus DDP with shared memory forced (CHORUS_GLOO_SHM=1) %.1f ms/step (ratio "
        "%.3f), all-reduce of all gradients alone %.1f ms\n"
        "%s: Chorus DDP over TCP (CHORUS_GLOO_SHM=0) %.1f ms/step (ratio %.3f), all-reduce of "
        "all gradients alone %.1f ms\n",
        name, ours, peer_, compute_, run_.comm_ms, 100 * Overlap(ours), 100 * Overlap(peer_),
        run_.fwd_bwd_ms, run_.finish_ms, name, ours / compute_, concurrent_, ours / concurrent_,
        interleaved_run_.plain_ms, interleaved_run_.step_ms / interleaved_run_.plain_ms,
        run_.faults_per_step, shm_run_.faults_per_step, tcp_run_.faults_per_step, name,
        shm_run_.step_ms, shm_run_.step_ms / peer_, shm_run_.comm_ms, name, tcp_run_.step_ms,
        tcp_run_.step_ms / peer_, tcp_run_.comm_ms);
    if (view_flag_ < 0) {
      std::cerr << absl::StrFormat(
          "%s: Chorus DDP with gradient_as_bucket_view off, like PyTorch's default (gradients "
          "copied into the buckets and back) %.1f ms/step (ratio %.3f), step / compute only "
          "%.3f; the default above has views on\n",
          name, copied_run_.step_ms, copied_run_.step_ms / peer_, copied_run_.step_ms / compute_);
    }
  }

  void PrintResultLine() const {
    const double ours = run_.step_ms;
    std::cout << absl::StrFormat(
                     "{\"bench\": \"ddp_%s\", \"metric\": \"median_step_time\", \"unit\": \"ms\", "
                     "\"ours\": %.3f, \"peer\": %.3f, \"peer_name\": \"PyTorch DDP 1.13 (gloo)\", "
                     "\"ratio\": %.4f, \"compute_only_ms\": %.3f, "
                     "\"two_processes_compute_only_ms\": %.3f, "
                     "\"interleaved_step_ms\": %.3f, \"interleaved_compute_ms\": %.3f, "
                     "\"ours_page_faults_per_step\": %.1f%s}",
                     case_.name, ours, peer_, ours / peer_, compute_, concurrent_,
                     interleaved_run_.step_ms, interleaved_run_.plain_ms, run_.faults_per_step,
                     view_flag_ < 0
                         ? absl::StrFormat(", \"ours_views_off_ms\": %.3f, "
                                           "\"views_off_ratio\": %.4f",
                                           copied_run_.step_ms, copied_run_.step_ms / peer_)
                         : "")
              << std::endl;
  }

  const std::string self_;
  const std::string dir_;
  const ModelCase case_;
  const int steps_;
  const int view_flag_;
  const bool view_;  // Chorus's gradient_as_bucket_view in its main runs
  std::vector<std::string> hidden_;
  double peer_ = 0, compute_ = 0, concurrent_ = 0;
  ChorusRun run_, shm_run_, tcp_run_, copied_run_, interleaved_run_;
};

// The default bench: every model case (ModelCaseBench), the big model last.
int RunBench(const std::string& self, double steps_scale, int view_flag) {
  const std::vector<ModelCase> cases = {{"mlp_small", {1024, 1024, 1024}, 30, 40},
                                        {"mlp_big", {2048, 2048, 2048, 2048}, 30, 30}};
  std::cerr << "machine: " << ReadMachineFacts().ToString() << "\n";
  char tmpl[] = "/tmp/chorus-ddp-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  for (const ModelCase& c : cases) {
    if (!ModelCaseBench(self, dir, c, steps_scale, view_flag).Run()) return 1;
  }
  std::string cleanup = "rm -rf " + dir;
  if (std::system(cleanup.c_str()) != 0) std::cerr << "could not remove " << dir << "\n";
  return 0;
}

}  // namespace
}  // namespace chorus

int main(int argc, char** argv) {
  chorus::KeepFreedMemoryForReuse({});
  int rank = -1, warmup = 8, steps = 10;
  std::string store, hidden_text;
  double steps_scale = 1.0;
  int view = -1;  // bench: each side's default; a rank: set by the bench
  bool observe = false, metrics_overhead = false, interleave = false;
  std::string compute_only_file;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--rank")
      rank = std::atoi(argv[i + 1]);
    else if (flag == "--store")
      store = argv[i + 1];
    else if (flag == "--hidden")
      hidden_text = argv[i + 1];
    else if (flag == "--warmup")
      warmup = std::atoi(argv[i + 1]);
    else if (flag == "--steps")
      steps = std::atoi(argv[i + 1]);
    else if (flag == "--steps_scale")
      steps_scale = std::atof(argv[i + 1]);
    else if (flag == "--view")
      view = std::atoi(argv[i + 1]);
    else if (flag == "--compute_only")
      compute_only_file = argv[i + 1];
    else if (flag == "--observe")
      observe = std::string(argv[i + 1]) == "1";
    else if (flag == "--interleave")
      interleave = std::string(argv[i + 1]) == "1";
    else if (flag == "--metrics_overhead")
      metrics_overhead = std::string(argv[i + 1]) == "1";
  }
  std::vector<int64_t> hidden;
  for (absl::string_view part : absl::StrSplit(hidden_text, ',', absl::SkipEmpty())) {
    int64_t h = 0;
    if (absl::SimpleAtoi(part, &h)) hidden.push_back(h);
  }
  if (!compute_only_file.empty()) {
    std::ofstream(compute_only_file) << chorus::ComputeOnly(hidden, warmup, steps) << "\n";
    return 0;
  }
  if (rank >= 0) {
    return chorus::RunRank({rank, store, hidden, warmup, steps, view == 1, observe, interleave});
  }
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = '\0';
  if (metrics_overhead) return chorus::RunMetricsOverhead(self, steps_scale);
  return chorus::RunBench(self, steps_scale, view);
}
