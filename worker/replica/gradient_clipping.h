// Gradient clipping by global norm, the one implementation every engine and
// the trainer use.
//
// Thread-safety: call from the thread that owns the gradients, between
// backward and the optimizer step.
//
// Example:
//   const double norm = ClipGradientNorm(model->Parameters(), spec.grad_clip_norm());
#ifndef CHORUS_WORKER_REPLICA_GRADIENT_CLIPPING_H_
#define CHORUS_WORKER_REPLICA_GRADIENT_CLIPPING_H_

#include <ATen/core/Tensor.h>

#include <vector>

namespace chorus {

// Scales the gradients of `params` so that their joint 2-norm is at most
// `max_norm`, by PyTorch's torch.nn.utils.clip_grad_norm_ rule: the factor
// max_norm / (norm + 1e-6), applied only when it is below 1. The norm is
// accumulated in double precision. Parameters without a gradient are
// skipped. Returns the norm before clipping (0 when no parameter has a
// gradient). REQUIRES: max_norm > 0.
double ClipGradientNorm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace chorus

#endif  // CHORUS_WORKER_REPLICA_GRADIENT_CLIPPING_H_
