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
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"
#include "worker/ddp/distributed_data_parallel.h"
#include "worker/decentralized/decentralized_data_parallel.h"

namespace chorus {
namespace {

int Fail(const std::string& why) {
  std::cerr << "decentralized_bench_rank: " << why << "\n";
  return 1;
}

int Main(int argc, char** argv) {
  std::string strategy = "ddp", store_dir, host = "127.0.0.1", hidden_arg = "2048,2048,2048";
  int rank = 0, size = 1, steps = 30, warmup = 3, batch = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    bool ok = true;
    if (flag == "--strategy")
      strategy = value;
    else if (flag == "--store")
      store_dir = value;
    else if (flag == "--host")
      host = value;
    else if (flag == "--hidden")
      hidden_arg = value;
    else if (flag == "--rank")
      ok = absl::SimpleAtoi(value, &rank);
    else if (flag == "--size")
      ok = absl::SimpleAtoi(value, &size);
    else if (flag == "--steps")
      ok = absl::SimpleAtoi(value, &steps);
    else if (flag == "--warmup")
      ok = absl::SimpleAtoi(value, &warmup);
    else if (flag == "--batch")
      ok = absl::SimpleAtoi(value, &batch);
    else
      return Fail("unknown flag " + flag);
    if (!ok) return Fail("bad value for " + flag + ": " + value);
  }
  if (store_dir.empty()) return Fail("--store DIR is required");
  at::set_num_threads(1);
  torch::manual_seed(rank);
  torch::nn::Sequential model;
  int64_t width = 784;
  for (absl::string_view h : absl::StrSplit(hidden_arg, ',')) {
    int64_t out = 0;
    if (!absl::SimpleAtoi(h, &out)) return Fail("bad --hidden");
    model->push_back(torch::nn::Linear(width, out));
    model->push_back(torch::nn::ReLU());
    width = out;
  }
  model->push_back(torch::nn::Linear(width, 10));
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  torch::Tensor x = torch::randn({batch, 784});
  torch::Tensor y = torch::randint(0, 10, {batch});

  auto store = FileStore::Open(store_dir);
  if (!store.ok()) return Fail(std::string(store.status().message()));
  GlooOptions options;
  options.rank = rank;
  options.size = size;
  options.hostname = host;
  std::shared_ptr<Communicator> comm;
  if (strategy != "none") {
    auto c = CreateGlooCommunicator(options, **store);
    if (!c.ok()) return Fail(std::string(c.status().message()));
    comm = *c;
  }
  std::vector<NamedTensor> named;
  for (const auto& item : model->named_parameters()) named.push_back({item.key(), item.value()});
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<DecentralizedDataParallel> gossip;
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01));
  if (strategy == "ddp") {
    auto d = DistributedDataParallel::Create(named, {}, *comm, DdpOptions());
    if (!d.ok()) return Fail(std::string(d.status().message()));
    ddp = std::move(*d);
  } else if (strategy == "ring" || strategy == "one_peer_exponential") {
    DecentralizedOptions o;
    o.topology.kind = strategy == "ring" ? TopologyKind::kRing : TopologyKind::kOnePeerExponential;
    auto g = DecentralizedDataParallel::Create(
        named, {}, *comm,
        [](const std::vector<at::Tensor>& p) {
          return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.01));
        },
        nullptr, o);
    if (!g.ok()) return Fail(std::string(g.status().message()));
    gossip = std::move(*g);
  } else if (strategy != "none") {
    return Fail("unknown --strategy " + strategy);
  }
  auto barrier = [&]() -> absl::Status {
    if (!comm) return absl::OkStatus();
    return comm->Barrier("bench")->Wait(absl::Now() + absl::Minutes(5));
  };
  absl::Time start;
  for (int i = 0; i < warmup + steps; ++i) {
    if (i == warmup) {
      if (absl::Status s = barrier(); !s.ok()) return Fail(s.ToString());
      start = absl::Now();
    }
    if (!gossip) sgd.zero_grad();
    if (ddp) {
      if (absl::Status s = ddp->PrepareForBackward(); !s.ok()) return Fail(s.ToString());
    }
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    if (ddp) {
      if (absl::Status s = ddp->FinishGradientSync(); !s.ok()) return Fail(s.ToString());
    }
    if (gossip) {
      if (absl::Status s = gossip->FinishStep(); !s.ok()) return Fail(s.ToString());
    } else {
      sgd.step();
    }
  }
  if (absl::Status s = barrier(); !s.ok()) return Fail(s.ToString());
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - start) / steps;
  std::ofstream(absl::StrCat(store_dir, "/result.", rank)) << ms << " " << params << "\n";
  return 0;
}

}  // namespace
}  // namespace chorus

int main(int argc, char** argv) { return chorus::Main(argc, argv); }
