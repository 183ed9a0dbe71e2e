#include "worker/train/accum_adam.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <memory>

#include "worker/replica/optimizer_state_key.h"

namespace chorus {

AccumAdam::AccumAdam(const std::vector<at::Tensor>& params, AccumAdamOptions defaults)
    : Optimizer({torch::optim::OptimizerParamGroup(params)},
                std::make_unique<AccumAdamOptions>(defaults)) {
  TORCH_CHECK(defaults.lr() >= 0, "AccumAdam: invalid learning rate ", defaults.lr());
  TORCH_CHECK(defaults.accum_iter() >= 1, "AccumAdam: accum_iter must be >= 1, got ",
              defaults.accum_iter());
  const auto [b1, b2] = defaults.betas();
  TORCH_CHECK(0 <= b1 && b1 < 1 && 0 <= b2 && b2 < 1, "AccumAdam: betas must be in [0, 1)");
}

at::Tensor AccumAdam::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const AccumAdamOptions&>(group.options());
    const auto [b1, b2] = o.betas();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      at::Tensor g = p.grad();
      const OptimizerStateKey key = OptimizerStateKeyOf(p);
      auto it = state().find(key);
      if (it == state().end()) {
        auto s = std::make_unique<AccumAdamParamState>();
        s->exp_avg(at::zeros_like(p));
        s->exp_avg_sq(at::zeros_like(p));
        s->accum(at::zeros_like(p));
        it = state().emplace(key, std::move(s)).first;
      }
      auto& s = static_cast<AccumAdamParamState&>(*it->second);
      if (o.weight_decay() != 0) {
        if (o.decoupled_weight_decay()) {
          p.mul_(1 - o.lr() * o.weight_decay());
        } else {
          g = g.add(p, o.weight_decay());
        }
      }
      s.accum().add_(g);
      s.count(s.count() + 1);
      const at::Tensor mean = s.accum() / static_cast<double>(s.count());
      at::Tensor m = s.exp_avg() * b1 + mean * (1 - b1);
      at::Tensor v = s.exp_avg_sq() * b2 + mean * mean * (1 - b2);
      const double k = static_cast<double>(s.step() + 1);
      const double c1 = 1 - std::pow(b1, k);
      const double c2 = 1 - std::pow(b2, k);
      const at::Tensor denom = (v / c2).sqrt_().add_(o.eps());
      p.addcdiv_(m, denom, -o.lr() / c1);
      if (s.count() == o.accum_iter()) {
        s.exp_avg().copy_(m);
        s.exp_avg_sq().copy_(v);
        s.accum().zero_();
        s.count(0);
        s.step(s.step() + 1);
      }
    }
  }
  return loss;
}

}  // namespace chorus
