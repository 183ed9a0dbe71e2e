// elastic_loop: a training loop of one's own that lives through lost,
// drained and added ranks — an elastic `program` job (docs/sdk.md, "Elastic
// programs"). The Fashion-MNIST MLP (784-256-128-10, SGD lr 0.05 momentum
// 0.9, 64 samples per rank per step) with the SDK's elastic hooks:
//
//   - its state is a list of named tensors: parameters, momentum buffers and
//     the training position (step, epoch, samples of the epoch trained);
//   - at the start of every step, Session::ReformRequested says whether a
//     planned change (a drain, a growth) is due; a collective that fails
//     with IsMembershipLost means a member was lost. Either way the rank
//     calls JoinNextGeneration, rebuilds its DDP on the new communicator and
//     calls ShareNewestState with the step it completed last: every member,
//     newcomers included, then holds the newest state any member held;
//   - each epoch's order depends only on (seed, epoch), and a step takes the
//     next world x batch samples of it, so after a change the rest of the
//     epoch is shared among the new world: every sample once.
//
//   chorus up --local 3 examples/programs/elastic_loop.textproto
//
// Flags (--name=value): --data_dir (default /usr/share/datasets/fashion-mnist),
// --epochs (2), --batch (64), --lr (0.05), --seed (1), --step_sleep_ms (0:
// a pause per step, for tests that need time to act mid-epoch).
// Lines it prints: "joined: rank R of W generation G pid P" (at the start
// and after every re-formation), "state: ..." (what ShareNewestState
// agreed), "progress: rank R step S" every 50 steps, "left: ..." when the
// rank leaves at a drain, and at the end
// "final: rank R generation G step S test_accuracy A params_digest D".

#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "examples/common/fashion_mnist.h"

namespace {

// --name=value flags with defaults; an unknown flag is an error.
std::map<std::string, std::string> ParseFlags(int argc, char** argv,
                                              std::map<std::string, std::string> values,
                                              std::string* error) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos || values.count(name) == 0) {
      *error = "unknown or malformed flag " + arg + " (flags are --name=value)";
      return values;
    }
    values[name] = arg.substr(eq + 1);
  }
  return values;
}

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 256))),
        fc2(register_module("fc2", torch::nn::Linear(256, 128))),
        fc3(register_module("fc3", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1->forward(x.flatten(1)));
    x = torch::relu(fc2->forward(x));
    return fc3->forward(x);
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

// FNV-1a over the tensors' bytes, in order: equal digests mean equal bits.
std::string Digest(const std::vector<chorus::NamedTensor>& tensors) {
  uint64_t h = 1469598103934665603ull;
  for (const chorus::NamedTensor& t : tensors) {
    at::Tensor c = t.tensor.detach().contiguous();
    const auto* p = static_cast<const unsigned char*>(c.data_ptr());
    for (int64_t i = 0; i < c.numel() * static_cast<int64_t>(c.element_size()); ++i) {
      h = (h ^ p[i]) * 1099511628211ull;
    }
  }
  std::ostringstream out;
  out << std::hex << std::setw(16) << std::setfill('0') << h;
  return out.str();
}

// The training position, kept in a tensor so that it travels with the
// model in ShareNewestState.
struct Position {
  at::Tensor tensor = torch::zeros({3}, torch::kLong);  // step, epoch, samples of the epoch
  int64_t* p() { return tensor.data_ptr<int64_t>(); }
  int64_t step() { return p()[0]; }
  int64_t epoch() { return p()[1]; }
  int64_t offset() { return p()[2]; }
};

int Run(int argc, char** argv) {
  std::string error;
  const std::map<std::string, std::string> flags =
      ParseFlags(argc, argv,
                 {{"data_dir", "/usr/share/datasets/fashion-mnist"},
                  {"epochs", "2"},
                  {"batch", "64"},
                  {"lr", "0.05"},
                  {"seed", "1"},
                  {"step_sleep_ms", "0"}},
                 &error);
  if (!error.empty()) {
    std::cerr << "elastic_loop: " << error << "\n";
    return 2;
  }
  auto flag = [&](const char* name) { return std::atoll(flags.at(name).c_str()); };
  absl::StatusOr<std::unique_ptr<chorus::Session>> made = chorus::Session::FromEnvironment();
  if (!made.ok()) {
    std::cerr << "elastic_loop: " << made.status().message() << "\n";
    return 2;
  }
  chorus::Session& session = **made;
  auto fail = [&](const absl::Status& s) {
    std::cerr << "elastic_loop: rank " << session.rank() << ": " << s << "\n";
    return 1;
  };

  absl::StatusOr<examples::FashionMnist> train =
      examples::LoadFashionMnist(flags.at("data_dir"), examples::Split::kTrain);
  absl::StatusOr<examples::FashionMnist> test =
      examples::LoadFashionMnist(flags.at("data_dir"), examples::Split::kTest);
  if (!train.ok()) return fail(train.status());
  if (!test.ok()) return fail(test.status());

  const int64_t seed = flag("seed");
  torch::manual_seed(seed);
  Mlp model;
  torch::optim::SGD sgd(model->parameters(),
                        torch::optim::SGDOptions(std::atof(flags.at("lr").c_str())).momentum(0.9));
  Position position;
  // The state every member must hold the same of: parameters, momentum
  // buffers (made now, zero, so that there is something to share into), and
  // the position.
  std::vector<chorus::NamedTensor> state;
  for (const auto& p : model->named_parameters()) {
    state.push_back({p.key(), p.value()});
    auto fresh = std::make_unique<torch::optim::SGDParamState>();
    fresh->momentum_buffer(torch::zeros_like(p.value()));
    at::Tensor momentum = fresh->momentum_buffer();
    sgd.state()[c10::guts::to_string(p.value().unsafeGetTensorImpl())] = std::move(fresh);
    state.push_back({"momentum." + p.key(), momentum});
  }
  state.push_back({"position", position.tensor});

  // After joining a generation: the DDP on its communicator, and the newest
  // state any member holds (`held`: the step this rank completed, -1 none).
  std::unique_ptr<chorus::DistributedDataParallel> ddp;
  auto form = [&](int64_t held) -> absl::Status {
    std::cout << "joined: rank " << session.rank() << " of " << session.world_size()
              << " generation " << session.generation() << " pid " << ::getpid() << std::endl;
    absl::StatusOr<std::unique_ptr<chorus::DistributedDataParallel>> made_ddp =
        chorus::DistributedDataParallelFor(*model, {}, session.communicator());
    if (!made_ddp.ok()) return made_ddp.status();
    ddp = *std::move(made_ddp);
    absl::StatusOr<chorus::SharedTensors> shared = session.ShareNewestState(held, state);
    if (!shared.ok()) return shared.status();
    std::cout << "state: rank " << session.rank() << " generation " << session.generation()
              << " held " << held << " now step " << position.step() << " from rank "
              << shared->source << " (" << shared->bytes << " bytes) digest " << Digest(state)
              << std::endl;
    return absl::OkStatus();
  };
  // A lost member or a planned change: join the next generation. False:
  // this rank left the job (a drain) and the program ends.
  auto reform = [&](const absl::Status& why) -> absl::StatusOr<bool> {
    absl::StatusOr<bool> joined = session.JoinNextGeneration(why);
    if (!joined.ok() || !*joined) return joined;
    if (absl::Status s = form(position.step()); !s.ok()) return s;
    return true;
  };

  // Not a member of the next generation (its agent is draining): done.
  auto leave = [&] {
    std::cout << "left: rank " << session.rank() << " of generation " << session.generation()
              << " at step " << position.step() << std::endl;
    return 0;
  };

  // A newcomer to a running job holds nothing and takes the newest state; at
  // the job's start every rank takes rank 0's initial model.
  if (absl::Status s = form(-1); !s.ok()) return fail(s);

  const int64_t batch = flag("batch");
  const int64_t epochs = flag("epochs");
  const int64_t n = train->size();
  at::Tensor order;
  int64_t order_epoch = -1;
  const absl::Time start = absl::Now();
  while (position.epoch() < epochs) {
    // A failure anywhere in the step leaves the state of the last complete
    // one (the optimizer runs only after the gradients were synchronized).
    absl::Status failed;
    absl::StatusOr<bool> planned = session.ReformRequested();
    if (!planned.ok()) {
      failed = planned.status();
    } else if (*planned) {
      absl::StatusOr<bool> still = reform(absl::OkStatus());
      if (!still.ok()) return fail(still.status());
      if (!*still) return leave();
      continue;
    }
    const int64_t world = session.world_size();
    if (failed.ok() && position.offset() + world * batch > n) {
      // The rest of the epoch does not fill a global batch: dropped.
      position.p()[1] += 1;
      position.p()[2] = 0;
      continue;
    }
    at::Tensor loss;
    if (failed.ok()) {
      session.progress().SetEpoch(position.epoch());
      at::Tensor x, y;
      {
        chorus::PhaseScope phase(session.progress(), chorus::v1::DATA);
        if (order_epoch != position.epoch()) {
          auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003 + position.epoch());
          order = torch::randperm(n, gen, at::TensorOptions().dtype(torch::kLong));
          order_epoch = position.epoch();
        }
        at::Tensor mine = order.narrow(0, position.offset() + session.rank() * batch, batch);
        x = train->x.index_select(0, mine);
        y = train->y.index_select(0, mine);
      }
      failed = ddp->PrepareForBackward();
      if (failed.ok()) {
        sgd.zero_grad();
        {
          chorus::PhaseScope phase(session.progress(), chorus::v1::FORWARD);
          loss = torch::nn::functional::cross_entropy(model->forward(x), y);
        }
        {
          chorus::PhaseScope phase(session.progress(), chorus::v1::BACKWARD);
          loss.backward();
        }
        chorus::PhaseScope phase(session.progress(), chorus::v1::COLLECTIVE);
        failed = ddp->FinishGradientSync();
      }
    }
    if (!failed.ok()) {
      if (!chorus::IsMembershipLost(failed)) return fail(failed);
      absl::StatusOr<bool> still = reform(failed);
      if (!still.ok()) return fail(still.status());
      if (!*still) return leave();
      continue;
    }
    {
      chorus::PhaseScope phase(session.progress(), chorus::v1::OPTIMIZER);
      sgd.step();
    }
    position.p()[0] += 1;
    position.p()[2] += world * batch;
    session.Step(position.step(), loss.item<double>(), batch);
    if (position.step() % 50 == 0) {
      std::cout << "progress: rank " << session.rank() << " step " << position.step() << std::endl;
    }
    if (flag("step_sleep_ms") > 0) absl::SleepFor(absl::Milliseconds(flag("step_sleep_ms")));
  }

  double accuracy = 0;
  {
    chorus::PhaseScope phase(session.progress(), chorus::v1::EVAL);
    torch::NoGradGuard no_grad;
    model->eval();
    accuracy =
        model->forward(test->x).argmax(1).eq(test->y).to(torch::kDouble).mean().item<double>();
  }
  if (session.rank() == 0) {
    chorus::v1::Metrics m;
    m.set_step(position.step());
    m.set_eval_accuracy(accuracy);
    session.ReportMetrics(m).IgnoreError();
  }
  std::cout << "final: rank " << session.rank() << " generation " << session.generation()
            << " step " << position.step() << " test_accuracy " << std::fixed
            << std::setprecision(4) << accuracy << " params_digest " << Digest(state)
            << " train_seconds " << absl::ToDoubleSeconds(absl::Now() - start) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
