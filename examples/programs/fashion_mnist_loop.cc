// fashion_mnist_loop: a training loop of one's own on Fashion-MNIST, run as
// a Chorus `program` job with the C++ SDK — the built-in trainer's MLP
// recipe (784-256-128-10, SGD with momentum 0.9, lr 0.05 with 100 warmup
// steps and a cosine decay, 64 samples per rank per step), written out by
// hand: data sharding, the loop, evaluation, checkpoints and resume.
//
//   chorus up --local 2 examples/programs/fashion_mnist_loop.textproto
//
// Flags (--name=value): --data_dir (default /usr/share/datasets/fashion-mnist),
// --epochs (5), --max_steps (0 = all), --batch (64), --lr (0.05),
// --checkpoint_every (0 = only when `chorus checkpoint` asks), --seed (1).
// Each rank prints "final: rank R step S test_accuracy A params_digest D
// train_seconds T steps N" (N steps trained by this run in T s); every
// checkpoint saved or restored prints "checkpoint: ... digest D".

#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "examples/common/fashion_mnist.h"

namespace {

// --name=value flags with defaults; an unknown flag is an error.
class Flags {
 public:
  Flags(int argc, char** argv, std::map<std::string, std::string> defaults)
      : values_(std::move(defaults)) {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      const size_t eq = arg.find('=');
      const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (arg.rfind("--", 0) != 0 || eq == std::string::npos || values_.count(name) == 0) {
        error_ = "unknown or malformed flag " + arg + " (flags are --name=value)";
        return;
      }
      values_[name] = arg.substr(eq + 1);
    }
  }
  const std::string& error() const { return error_; }
  std::string Str(const std::string& name) const { return values_.at(name); }
  int64_t Int(const std::string& name) const { return std::atoll(values_.at(name).c_str()); }
  double Double(const std::string& name) const { return std::atof(values_.at(name).c_str()); }

 private:
  std::map<std::string, std::string> values_;
  std::string error_;
};

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

double LearningRate(double base, int64_t step, int64_t total, int64_t warmup) {
  if (step < warmup) return base * (step + 1) / static_cast<double>(warmup);
  const double progress =
      std::min(1.0, (step - warmup) / std::max(1.0, static_cast<double>(total - warmup)));
  return base * 0.5 * (1 + std::cos(M_PI * progress));
}

// Parameters and SGD momentum buffers by name: what a checkpoint holds.
// Momentum buffers are created (zero) if the optimizer has none yet, so
// that a restore has somewhere to copy into.
std::vector<chorus::NamedTensor> TrainingState(Mlp& model, torch::optim::SGD& sgd) {
  std::vector<chorus::NamedTensor> state;
  for (const auto& p : model->named_parameters()) {
    state.push_back({p.key(), p.value()});
    // LibTorch keys optimizer state by the parameter's TensorImpl address.
    auto& slot = sgd.state()[c10::guts::to_string(p.value().unsafeGetTensorImpl())];
    if (slot == nullptr) {
      auto fresh = std::make_unique<torch::optim::SGDParamState>();
      fresh->momentum_buffer(torch::zeros_like(p.value()));
      slot = std::move(fresh);
    }
    at::Tensor momentum = static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer();
    state.push_back({"momentum." + p.key(), momentum});
  }
  return state;
}

int Run(int argc, char** argv) {
  Flags flags(argc, argv,
              {{"data_dir", "/usr/share/datasets/fashion-mnist"},
               {"epochs", "5"},
               {"max_steps", "0"},
               {"batch", "64"},
               {"lr", "0.05"},
               {"checkpoint_every", "0"},
               {"seed", "1"}});
  if (!flags.error().empty()) {
    std::cerr << "fashion_mnist_loop: " << flags.error() << "\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<chorus::Session>> made = chorus::Session::FromEnvironment();
  if (!made.ok()) {
    std::cerr << "fashion_mnist_loop: " << made.status().message() << "\n";
    return 2;
  }
  chorus::Session& session = **made;
  const int rank = session.rank();
  const int world = session.world_size();

  absl::StatusOr<examples::FashionMnist> train =
      examples::LoadFashionMnist(flags.Str("data_dir"), examples::Split::kTrain);
  absl::StatusOr<examples::FashionMnist> test =
      examples::LoadFashionMnist(flags.Str("data_dir"), examples::Split::kTest);
  if (!train.ok() || !test.ok()) {
    std::cerr << "fashion_mnist_loop: " << (train.ok() ? test.status() : train.status()) << "\n";
    return 1;
  }

  const int64_t seed = flags.Int("seed");
  torch::manual_seed(seed);  // every rank builds the same initial model
  Mlp model;
  torch::optim::SGD sgd(model->parameters(),
                        torch::optim::SGDOptions(flags.Double("lr")).momentum(0.9));
  auto ddp = chorus::DistributedDataParallelFor(*model, {}, session.communicator());
  if (!ddp.ok()) {
    std::cerr << "fashion_mnist_loop: " << ddp.status() << "\n";
    return 1;
  }
  std::vector<chorus::NamedTensor> state = TrainingState(model, sgd);

  const int64_t batch = flags.Int("batch");
  const int64_t per_epoch = train->size() / (batch * world);
  int64_t total = per_epoch * flags.Int("epochs");
  if (flags.Int("max_steps") > 0) total = std::min(total, flags.Int("max_steps"));
  int64_t step = 0;
  if (session.resuming()) {
    absl::StatusOr<int64_t> restored = session.RestoreCheckpoint(state);
    if (!restored.ok()) {
      std::cerr << "fashion_mnist_loop: resume: " << restored.status() << "\n";
      return 1;
    }
    step = *restored;
    std::cout << "checkpoint: rank " << rank << " restored step " << step << " digest "
              << Digest(state) << std::endl;
  } else if (auto s = (*ddp)->BroadcastParameters(0); !s.ok()) {
    std::cerr << "fashion_mnist_loop: " << s << "\n";
    return 1;
  }

  const int64_t every = flags.Int("checkpoint_every");
  double loss_sum = 0;
  int64_t loss_count = 0;
  at::Tensor order;
  int64_t order_epoch = -1;
  const int64_t first_step = step;
  const absl::Time train_start = absl::Now();
  while (step < total) {
    const int64_t epoch = step / per_epoch;
    const int64_t in_epoch = step % per_epoch;
    session.progress().SetEpoch(epoch);
    at::Tensor x, y;
    {
      chorus::PhaseScope phase(session.progress(), chorus::v1::DATA);
      // The epoch's order depends only on (seed, epoch): a resumed run reads
      // what an uninterrupted one would. Rank r takes every world-th sample.
      if (order_epoch != epoch) {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003 + epoch);
        order = torch::randperm(train->size(), gen, at::TensorOptions().dtype(torch::kLong));
        order_epoch = epoch;
      }
      at::Tensor mine = order.narrow(0, (in_epoch * world + rank) * batch, batch);
      x = train->x.index_select(0, mine);
      y = train->y.index_select(0, mine);
    }
    for (auto& group : sgd.param_groups()) {
      static_cast<torch::optim::SGDOptions&>(group.options())
          .lr(LearningRate(flags.Double("lr"), step, total, 100));
    }
    if (auto s = (*ddp)->PrepareForBackward(); !s.ok()) {
      std::cerr << "fashion_mnist_loop: " << s << "\n";
      return 1;
    }
    sgd.zero_grad();
    at::Tensor loss;
    {
      chorus::PhaseScope phase(session.progress(), chorus::v1::FORWARD);
      loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    }
    {
      chorus::PhaseScope phase(session.progress(), chorus::v1::BACKWARD);
      loss.backward();
    }
    {
      chorus::PhaseScope phase(session.progress(), chorus::v1::COLLECTIVE);
      const absl::Time waited = absl::Now();
      if (auto s = (*ddp)->FinishGradientSync(); !s.ok()) {
        std::cerr << "fashion_mnist_loop: " << s << "\n";
        return 1;
      }
      session.progress().SetCommWait(absl::Now() - waited);
    }
    {
      chorus::PhaseScope phase(session.progress(), chorus::v1::OPTIMIZER);
      sgd.step();
    }
    ++step;
    const double l = loss.item<double>();
    loss_sum += l;
    ++loss_count;
    session.Step(step, l, batch);
    if (step % 50 == 0 && rank == 0) {
      chorus::v1::Metrics m;
      m.set_step(step);
      m.set_epoch(epoch);
      m.set_loss(loss_sum / loss_count);
      m.set_samples_per_second(session.progress().Current().samples_per_second() * world);
      session.ReportMetrics(m).IgnoreError();  // best effort
      loss_sum = 0;
      loss_count = 0;
    }
    if ((every > 0 && step % every == 0) || session.CheckpointRequested()) {
      if (auto s = session.SaveCheckpoint(step, state); !s.ok()) {
        std::cerr << "fashion_mnist_loop: " << s << "\n";
        return 1;
      }
      if (rank == 0) {
        std::cout << "checkpoint: saved step " << step << " digest " << Digest(state) << std::endl;
      }
    }
  }

  const double train_seconds = absl::ToDoubleSeconds(absl::Now() - train_start);
  double accuracy = 0;
  {
    chorus::PhaseScope phase(session.progress(), chorus::v1::EVAL);
    torch::NoGradGuard no_grad;
    model->eval();
    accuracy =
        model->forward(test->x).argmax(1).eq(test->y).to(torch::kDouble).mean().item<double>();
  }
  if (rank == 0) {
    chorus::v1::Metrics m;
    m.set_step(step);
    m.set_eval_accuracy(accuracy);
    session.ReportMetrics(m).IgnoreError();
  }
  std::cout << "final: rank " << rank << " step " << step << " test_accuracy " << std::fixed
            << std::setprecision(4) << accuracy << " params_digest " << Digest(state)
            << " train_seconds " << train_seconds << " steps " << step - first_step << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
