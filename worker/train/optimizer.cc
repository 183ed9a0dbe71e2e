#include "worker/train/optimizer.h"

#include <torch/optim.h>

#include <algorithm>
#include <cmath>

#include "worker/train/accum_adam.h"

namespace chorus {

std::unique_ptr<torch::optim::Optimizer> BuildOptimizer(const v1::OptimizerSpec& o,
                                                        const std::vector<at::Tensor>& params) {
  switch (o.kind()) {
    case v1::OptimizerSpec::ADAM:
      return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(o.lr())
                                                              .betas({o.beta1(), o.beta2()})
                                                              .eps(o.eps())
                                                              .weight_decay(o.weight_decay()));
    case v1::OptimizerSpec::ACCUM_ADAM:
    case v1::OptimizerSpec::ACCUM_ADAMW:
      return std::make_unique<AccumAdam>(
          params, AccumAdamOptions(o.lr())
                      .betas({o.beta1(), o.beta2()})
                      .eps(o.eps())
                      .weight_decay(o.weight_decay())
                      .decoupled_weight_decay(o.kind() == v1::OptimizerSpec::ACCUM_ADAMW)
                      .accum_iter(o.accum_iter()));
    case v1::OptimizerSpec::ADAMW:
      return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(o.lr())
                                                               .betas({o.beta1(), o.beta2()})
                                                               .eps(o.eps())
                                                               .weight_decay(o.weight_decay()));
    default:
      return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(o.lr())
                                                             .momentum(o.momentum())
                                                             .nesterov(o.nesterov())
                                                             .weight_decay(o.weight_decay()));
  }
}

double LearningRate(const v1::JobSpec& spec, int64_t step, int64_t total_steps) {
  const double lr = spec.optimizer().lr();
  const v1::LrScheduleSpec& s = spec.lr_schedule();
  if (s.has_cosine()) {
    const int64_t warmup = s.cosine().warmup_steps();
    const int64_t total = s.cosine().total_steps() > 0 ? s.cosine().total_steps() : total_steps;
    if (step < warmup) return lr * (step + 1) / static_cast<double>(warmup);
    const double progress = std::min(1.0, (step - warmup) / std::max(1.0, double(total - warmup)));
    const double floor = s.cosine().min_lr_ratio();
    return lr * (floor + (1 - floor) * 0.5 * (1 + std::cos(M_PI * progress)));
  }
  if (s.has_step()) return lr * std::pow(s.step().gamma(), step / s.step().step_size());
  return lr;
}

}  // namespace chorus
