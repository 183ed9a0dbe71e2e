// actor_critic: an RL-style program, run as a Chorus `program` job with the
// C++ SDK, shaped like the distributed algorithms of RL libraries: every
// rank steps its own environment and keeps its own replay buffer and step
// counters — never synchronized — and only the update method's networks
// (actor and critic) are trained under DDP. An auxiliary head that predicts
// the reward is trained by some ranks only (--aux_ranks), so DDP runs with
// find_unused_parameters. A target critic, refreshed from the critic now and
// then, stays outside DDP too.
//
//   chorus up --local 2 examples/programs/actor_critic.textproto
//
// The environment: a point on a line (x in [-1, 1]) moved left or right by
// 0.1 per action; the reward is -|x|; an episode is 20 steps from a random
// start. Each rank seeds its environment with its rank, so the experience
// (and the replay buffers) differ.
//
// Flags (--name=value): --updates (200), --batch (64), --seed (1),
// --aux_ranks (ranks that train the auxiliary head, comma-separated; "0"),
// --stall_rank, --stall_at_update, --stall_seconds: that rank skips that
// update's gradient synchronization and stays in its environment for that
// long (a rank stuck outside a collective its peers have entered; the hang
// detector names it).
// Each rank prints "digest: rank R params P replay B env_steps N updates U".

#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"

namespace {

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

 private:
  std::map<std::string, std::string> values_;
  std::string error_;
};

constexpr int kObs = 2;  // position, time left in the episode
constexpr int kActions = 2;
constexpr int kEpisodeSteps = 20;
constexpr double kGamma = 0.95;

struct AgentImpl : torch::nn::Module {
  AgentImpl()
      : actor(register_module("actor",
                              torch::nn::Sequential(torch::nn::Linear(kObs, 32), torch::nn::Tanh(),
                                                    torch::nn::Linear(32, kActions)))),
        critic(register_module("critic",
                               torch::nn::Sequential(torch::nn::Linear(kObs, 32), torch::nn::Tanh(),
                                                     torch::nn::Linear(32, 1)))),
        aux(register_module("aux", torch::nn::Linear(kObs + 1, 1))),
        target_critic(register_module(
            "target_critic", torch::nn::Sequential(torch::nn::Linear(kObs, 32), torch::nn::Tanh(),
                                                   torch::nn::Linear(32, 1)))) {}
  torch::nn::Sequential actor, critic;
  torch::nn::Linear aux;
  torch::nn::Sequential target_critic;
};
TORCH_MODULE(Agent);

// The rank's own experience: a ring of transitions, never synchronized.
struct ReplayBuffer {
  explicit ReplayBuffer(int64_t capacity)
      : obs(torch::zeros({capacity, kObs})),
        action(torch::zeros({capacity}, torch::kLong)),
        reward(torch::zeros({capacity})),
        next_obs(torch::zeros({capacity, kObs})),
        done(torch::zeros({capacity})) {}
  void Add(const at::Tensor& o, int64_t a, double r, const at::Tensor& o2, bool d) {
    const int64_t i = next % obs.size(0);
    obs[i].copy_(o);
    action[i] = a;
    reward[i] = r;
    next_obs[i].copy_(o2);
    done[i] = d ? 1.0 : 0.0;
    ++next;
  }
  int64_t size() const { return std::min<int64_t>(next, obs.size(0)); }
  at::Tensor obs, action, reward, next_obs, done;
  int64_t next = 0;
};

struct Environment {
  explicit Environment(uint64_t seed) : gen(at::make_generator<at::CPUGeneratorImpl>(seed)) {
    Reset();
  }
  void Reset() {
    x = torch::rand({1}, gen).item<double>() * 2 - 1;
    t = 0;
  }
  at::Tensor Observe() const {
    return torch::tensor(
        {static_cast<float>(x), static_cast<float>(kEpisodeSteps - t) / kEpisodeSteps});
  }
  // Returns the reward; sets *done at the end of the episode.
  double Act(int64_t action, bool* done) {
    x = std::max(-1.0, std::min(1.0, x + (action == 1 ? 0.1 : -0.1)));
    ++t;
    *done = t >= kEpisodeSteps;
    return -std::abs(x);
  }
  at::Generator gen;
  double x = 0;
  int t = 0;
};

std::string Digest(const std::vector<at::Tensor>& tensors) {
  uint64_t h = 1469598103934665603ull;
  for (const at::Tensor& t : tensors) {
    at::Tensor c = t.detach().contiguous();
    const auto* p = static_cast<const unsigned char*>(c.data_ptr());
    for (int64_t i = 0; i < c.numel() * static_cast<int64_t>(c.element_size()); ++i) {
      h = (h ^ p[i]) * 1099511628211ull;
    }
  }
  std::ostringstream out;
  out << std::hex << std::setw(16) << std::setfill('0') << h;
  return out.str();
}

bool InList(const std::string& list, int rank) {
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty() && std::atoi(item.c_str()) == rank) return true;
  }
  return false;
}

int Run(int argc, char** argv) {
  Flags flags(argc, argv,
              {{"updates", "200"},
               {"batch", "64"},
               {"seed", "1"},
               {"aux_ranks", "0"},
               {"stall_rank", "-1"},
               {"stall_at_update", "-1"},
               {"stall_seconds", "0"}});
  if (!flags.error().empty()) {
    std::cerr << "actor_critic: " << flags.error() << "\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<chorus::Session>> made = chorus::Session::FromEnvironment();
  if (!made.ok()) {
    std::cerr << "actor_critic: " << made.status().message() << "\n";
    return 2;
  }
  chorus::Session& session = **made;
  const int rank = session.rank();
  const bool trains_aux = InList(flags.Str("aux_ranks"), rank);

  torch::manual_seed(flags.Int("seed"));
  Agent agent;
  // The update method's networks only; the target critic and the replay
  // buffer stay this rank's own.
  chorus::DdpOptions options;
  options.find_unused_parameters = true;  // the aux head gets no gradient on some ranks
  options.name = "update";
  auto ddp = chorus::DistributedDataParallelFor(*agent, {"actor.", "critic.", "aux."},
                                                session.communicator(), options);
  if (!ddp.ok()) {
    std::cerr << "actor_critic: " << ddp.status() << "\n";
    return 1;
  }
  if (auto s = (*ddp)->BroadcastParameters(0); !s.ok()) {
    std::cerr << "actor_critic: " << s << "\n";
    return 1;
  }
  std::vector<at::Tensor> trained;
  for (const auto& p : agent->named_parameters()) {
    if (p.key().rfind("target_critic.", 0) != 0) trained.push_back(p.value());
  }
  torch::optim::Adam adam(trained, torch::optim::AdamOptions(1e-3));
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < agent->critic->parameters().size(); ++i) {
      agent->target_critic->parameters()[i].copy_(agent->critic->parameters()[i]);
    }
  }

  Environment env(flags.Int("seed") * 7919 + rank);
  ReplayBuffer replay(4096);
  auto sample_gen = at::make_generator<at::CPUGeneratorImpl>(flags.Int("seed") * 31 + rank);
  int64_t env_steps = 0;  // this rank's own counters, never synchronized
  int64_t updates = 0;
  double episode_return = 0;
  double last_return = 0;

  const int64_t batch = flags.Int("batch");
  for (int64_t u = 1; u <= flags.Int("updates"); ++u) {
    {
      chorus::PhaseScope phase(session.progress(), chorus::v1::DATA);
      // Collect: 8 environment steps per update, on this rank's policy.
      for (int i = 0; i < 8; ++i) {
        at::Tensor o = env.Observe();
        int64_t a;
        {
          torch::NoGradGuard no_grad;
          at::Tensor probs = torch::softmax(agent->actor->forward(o.unsqueeze(0)), 1);
          a = torch::multinomial(probs, 1, false, sample_gen).item<int64_t>();
        }
        bool done = false;
        const double r = env.Act(a, &done);
        episode_return += r;
        replay.Add(o, a, r, env.Observe(), done);
        ++env_steps;
        if (done) {
          last_return = episode_return;
          episode_return = 0;
          env.Reset();
        }
      }
      if (rank == flags.Int("stall_rank") && u == flags.Int("stall_at_update")) {
        std::cout << "actor_critic: rank " << rank << " stalls in its environment for "
                  << flags.Int("stall_seconds") << " s at update " << u << std::endl;
        std::this_thread::sleep_for(std::chrono::seconds(flags.Int("stall_seconds")));
        continue;  // and skips this update's gradient synchronization
      }
    }
    if (replay.size() < batch) {
      // Every rank has the same count here (8 steps per update), so all
      // skip the same early updates.
      continue;
    }
    at::Tensor idx = torch::randint(replay.size(), {batch}, sample_gen, torch::kLong);
    at::Tensor o = replay.obs.index_select(0, idx);
    at::Tensor a = replay.action.index_select(0, idx);
    at::Tensor r = replay.reward.index_select(0, idx);
    at::Tensor o2 = replay.next_obs.index_select(0, idx);
    at::Tensor d = replay.done.index_select(0, idx);

    if (auto s = (*ddp)->PrepareForBackward(); !s.ok()) {
      std::cerr << "actor_critic: " << s << "\n";
      return 1;
    }
    adam.zero_grad();
    at::Tensor loss;
    {
      chorus::PhaseScope phase(session.progress(), chorus::v1::FORWARD);
      at::Tensor v = agent->critic->forward(o).squeeze(1);
      at::Tensor target;
      {
        torch::NoGradGuard no_grad;
        target = r + kGamma * (1 - d) * agent->target_critic->forward(o2).squeeze(1);
      }
      at::Tensor advantage = (target - v).detach();
      at::Tensor logp =
          torch::log_softmax(agent->actor->forward(o), 1).gather(1, a.unsqueeze(1)).squeeze(1);
      loss = (target - v).pow(2).mean() - (logp * advantage).mean();
      if (trains_aux) {
        at::Tensor in = torch::cat({o, a.to(torch::kFloat).unsqueeze(1)}, 1);
        loss = loss + (agent->aux->forward(in).squeeze(1) - r).pow(2).mean();
      }
    }
    {
      chorus::PhaseScope phase(session.progress(), chorus::v1::BACKWARD);
      loss.backward();
    }
    {
      chorus::PhaseScope phase(session.progress(), chorus::v1::COLLECTIVE);
      if (auto s = (*ddp)->FinishGradientSync(); !s.ok()) {
        std::cerr << "actor_critic: " << s << "\n";
        return 1;
      }
    }
    {
      chorus::PhaseScope phase(session.progress(), chorus::v1::OPTIMIZER);
      adam.step();
    }
    ++updates;
    if (updates % 20 == 0) {
      // The target critic follows the (synchronized) critic.
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < agent->critic->parameters().size(); ++i) {
        agent->target_critic->parameters()[i].copy_(agent->critic->parameters()[i]);
      }
    }
    session.Step(u, loss.item<double>(), batch);
    if (rank == 0 && u % 50 == 0) {
      chorus::v1::Metrics m;
      m.set_step(u);
      m.set_loss(loss.item<double>());
      (*m.mutable_values())["episode_return"] = last_return;
      session.ReportMetrics(m).IgnoreError();  // best effort
    }
  }

  std::vector<at::Tensor> params;
  for (const auto& p : agent->named_parameters()) params.push_back(p.value());
  std::cout << "digest: rank " << rank << " params " << Digest(params) << " replay "
            << Digest({replay.obs, replay.action, replay.reward, replay.next_obs, replay.done})
            << " env_steps " << env_steps << " updates " << updates << " last_return "
            << last_return << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
