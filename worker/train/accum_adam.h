// AccumAdam / AccumAdamW: Adam whose moment estimates advance once every
// `accum_iter` steps, from the mean of the gradients of those steps.
//
// Decentralized ranks each see a small batch per step; their gradient noise
// would make Adam's second moment large and its steps timid. AccumAdam keeps
// the parameters moving every step but lets the moments see the gradient of
// an accum_iter-times larger batch:
//   window mean  g_w = (g_1 + ... + g_c) / c      (c = steps in this window)
//   temporary    m' = b1 m + (1 - b1) g_w,  v' = b2 v + (1 - b2) g_w^2
//   update       p -= lr * (m' / (1 - b1^k)) / (sqrt(v' / (1 - b2^k)) + eps)
//                (k = committed windows + 1; AccumAdamW also p -= lr wd p,
//                AccumAdam adds wd p to each gradient instead)
//   after c == accum_iter steps: m, v <- m', v'; the window restarts.
// With accum_iter = 1 it is exactly Adam (AdamW).
//
// Thread-compatible, like every LibTorch optimizer.
//
// Example:
//   AccumAdam opt(params, AccumAdamOptions(1e-3).accum_iter(4).decoupled_weight_decay(true));
#ifndef CHORUS_WORKER_TRAIN_ACCUM_ADAM_H_
#define CHORUS_WORKER_TRAIN_ACCUM_ADAM_H_

#include <torch/optim/optimizer.h>

#include <tuple>
#include <vector>

namespace chorus {

struct AccumAdamOptions : public torch::optim::OptimizerCloneableOptions<AccumAdamOptions> {
  explicit AccumAdamOptions(double lr = 1e-3) : lr_(lr) {}
  TORCH_ARG(double, lr);
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  // true: AdamW's decoupled decay; false: Adam's L2 term in the gradient.
  TORCH_ARG(bool, decoupled_weight_decay) = false;
  TORCH_ARG(int64_t, accum_iter) = 4;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct AccumAdamParamState
    : public torch::optim::OptimizerCloneableParamState<AccumAdamParamState> {
  TORCH_ARG(int64_t, step) = 0;   // committed windows
  TORCH_ARG(int64_t, count) = 0;  // steps in the current window
  TORCH_ARG(at::Tensor, exp_avg);
  TORCH_ARG(at::Tensor, exp_avg_sq);
  TORCH_ARG(at::Tensor, accum);  // sum of the window's gradients
};

class AccumAdam : public torch::optim::Optimizer {
 public:
  AccumAdam(const std::vector<at::Tensor>& params, AccumAdamOptions defaults);
  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_ACCUM_ADAM_H_
