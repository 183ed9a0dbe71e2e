#include "worker/replica/gradient_clipping.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

namespace chorus {

double ClipGradientNorm(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  double squares = 0;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) squares += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  const double norm = std::sqrt(squares);
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient >= 1) return norm;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) p.grad().mul_(coefficient);
  }
  return norm;
}

}  // namespace chorus
