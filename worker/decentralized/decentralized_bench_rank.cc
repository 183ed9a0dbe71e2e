// One rank of tests/bench/decentralized_bench.sh: trains an MLP on fixed
// random data with DDP (gradient all-reduce) or decentralized gossip and
// reports its mean step time.
//
//   decentralized_bench_rank --strategy ddp|ring|one_peer_exponential|none
//       --rank R --size N --store DIR --host ADDR [--steps 30] [--warmup 3]
//       [--hidden 2048,2048,2048] [--batch 64]
//
// Ranks rendezvous through a FileStore in DIR. After a barrier the rank
// trains warmup + steps iterations without any per-step synchronization
// (a barrier would wait for the gossip exchanges in flight and hide the
// overlap), then a barrier that waits for everything in flight. Writes
// "DIR/result.R" = "<ms per step> <params>". `none` trains without any
// communication (the compute floor).

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "chorus/decentralized_data_parallel.h"
#include "chorus/distributed_data_parallel.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"

namespace chorus {
namespace {

int Fail(const std::string& why) {
  std::cerr << "decentralized_bench_rank: " << why << "\n";
  return 1;
}

struct BenchFlags {
  std::string strategy = "ddp";
  std::string store_dir;
  std::string host = "127.0.0.1";
  std::string hidden = "2048,2048,2048";
  int rank = 0;
  int size = 1;
  int steps = 30;
  int warmup = 3;
  int batch = 64;
};

// The flags as the usage above gives them; an error's message says which
// flag is wrong.
absl::StatusOr<BenchFlags> ParseFlags(int argc, char** argv) {
  BenchFlags flags;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    bool ok = true;
    if (flag == "--strategy")
      flags.strategy = value;
    else if (flag == "--store")
      flags.store_dir = value;
    else if (flag == "--host")
      flags.host = value;
    else if (flag == "--hidden")
      flags.hidden = value;
    else if (flag == "--rank")
      ok = absl::SimpleAtoi(value, &flags.rank);
    else if (flag == "--size")
      ok = absl::SimpleAtoi(value, &flags.size);
    else if (flag == "--steps")
      ok = absl::SimpleAtoi(value, &flags.steps);
    else if (flag == "--warmup")
      ok = absl::SimpleAtoi(value, &flags.warmup);
    else if (flag == "--batch")
      ok = absl::SimpleAtoi(value, &flags.batch);
    else
      return absl::InvalidArgumentError("unknown flag " + flag);
    if (!ok) return absl::InvalidArgumentError("bad value for " + flag + ": " + value);
  }
  if (flags.store_dir.empty()) return absl::InvalidArgumentError("--store DIR is required");
  return flags;
}

// MLP 784-H-...-10 for `hidden` = "H,...".
absl::StatusOr<torch::nn::Sequential> MakeMlp(const std::string& hidden) {
  torch::nn::Sequential model;
  int64_t width = 784;
  for (absl::string_view h : absl::StrSplit(hidden, ',')) {
    int64_t out = 0;
    if (!absl::SimpleAtoi(h, &out)) return absl::InvalidArgumentError("bad --hidden");
    model->push_back(torch::nn::Linear(width, out));
    model->push_back(torch::nn::ReLU());
    width = out;
  }
  model->push_back(torch::nn::Linear(width, 10));
  return model;
}

// One rank's training step under --strategy: plain SGD (`none`), SGD on
// all-reduced gradients (`ddp`) or gossip averaging with a fused optimizer
// (`ring`, `one_peer_exponential`).
class StrategyTrainer {
 public:
  // Opens the store and, for every strategy but `none`, rendezvouses with
  // the other ranks. An error's message is what the rank prints.
  static absl::StatusOr<std::unique_ptr<StrategyTrainer>> Create(const BenchFlags& flags,
                                                                 torch::nn::Sequential model) {
    auto store = FileStore::Open(flags.store_dir);
    if (!store.ok()) return store.status();
    std::unique_ptr<StrategyTrainer> trainer(new StrategyTrainer(std::move(model)));
    trainer->store_ = std::move(*store);
    GlooOptions options;
    options.rank = flags.rank;
    options.size = flags.size;
    options.hostname = flags.host;
    if (flags.strategy != "none") {
      auto c = CreateGlooCommunicator(options, *trainer->store_);
      if (!c.ok()) return c.status();
      trainer->comm_ = *c;
    }
    if (absl::Status s = trainer->CreateEngine(flags.strategy); !s.ok()) return s;
    return trainer;
  }

  // Waits for every rank and every exchange in flight; a no-op for `none`.
  absl::Status Barrier() {
    if (!comm_) return absl::OkStatus();
    return comm_->Barrier("bench")->Wait(absl::Now() + absl::Minutes(5));
  }

  absl::Status Step(const torch::Tensor& x, const torch::Tensor& y) {
    if (!gossip_) sgd_.zero_grad();
    if (ddp_) {
      if (absl::Status s = ddp_->PrepareForBackward(); !s.ok()) return s;
    }
    torch::nn::functional::cross_entropy(model_->forward(x), y).backward();
    if (ddp_) {
      if (absl::Status s = ddp_->FinishGradientSync(); !s.ok()) return s;
    }
    if (gossip_) return gossip_->FinishStep();
    sgd_.step();
    return absl::OkStatus();
  }

 private:
  explicit StrategyTrainer(torch::nn::Sequential model)
      : model_(std::move(model)), sgd_(model_->parameters(), torch::optim::SGDOptions(0.01)) {}

  absl::Status CreateEngine(const std::string& strategy) {
    std::vector<NamedTensor> named;
    for (const auto& item : model_->named_parameters()) {
      named.push_back({item.key(), item.value()});
    }
    if (strategy == "ddp") {
      auto d = DistributedDataParallel::Create(named, {}, *comm_, DdpOptions());
      if (!d.ok()) return d.status();
      ddp_ = std::move(*d);
    } else if (strategy == "ring" || strategy == "one_peer_exponential") {
      DecentralizedOptions o;
      o.topology.kind =
          strategy == "ring" ? TopologyKind::kRing : TopologyKind::kOnePeerExponential;
      auto g = DecentralizedDataParallel::Create(
          named, {}, *comm_,
          [](const std::vector<at::Tensor>& p) {
            return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.01));
          },
          nullptr, o);
      if (!g.ok()) return g.status();
      gossip_ = std::move(*g);
    } else if (strategy != "none") {
      return absl::InvalidArgumentError("unknown --strategy " + strategy);
    }
    return absl::OkStatus();
  }

  torch::nn::Sequential model_;
  std::unique_ptr<FileStore> store_;
  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<DecentralizedDataParallel> gossip_;
  torch::optim::SGD sgd_;
};

int Main(int argc, char** argv) {
  absl::StatusOr<BenchFlags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) return Fail(std::string(flags.status().message()));
  at::set_num_threads(1);
  torch::manual_seed(flags->rank);
  absl::StatusOr<torch::nn::Sequential> model = MakeMlp(flags->hidden);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  int64_t params = 0;
  for (const auto& p : (*model)->parameters()) params += p.numel();
  torch::Tensor x = torch::randn({flags->batch, 784});
  torch::Tensor y = torch::randint(0, 10, {flags->batch});
  auto trainer = StrategyTrainer::Create(*flags, *model);
  if (!trainer.ok()) return Fail(std::string(trainer.status().message()));

  absl::Time start;
  for (int i = 0; i < flags->warmup + flags->steps; ++i) {
    if (i == flags->warmup) {
      if (absl::Status s = (*trainer)->Barrier(); !s.ok()) return Fail(s.ToString());
      start = absl::Now();
    }
    if (absl::Status s = (*trainer)->Step(x, y); !s.ok()) return Fail(s.ToString());
  }
  if (absl::Status s = (*trainer)->Barrier(); !s.ok()) return Fail(s.ToString());
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - start) / flags->steps;
  std::ofstream(absl::StrCat(flags->store_dir, "/result.", flags->rank))
      << ms << " " << params << "\n";
  return 0;
}

}  // namespace
}  // namespace chorus

int main(int argc, char** argv) { return chorus::Main(argc, argv); }
