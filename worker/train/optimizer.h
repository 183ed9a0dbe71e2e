// The optimizer and the learning-rate schedule a job spec names.
//
// Thread-safety: pure functions; the optimizer returned is owned by the
// caller and used by one thread.
//
// Example:
//   std::unique_ptr<torch::optim::Optimizer> opt = BuildOptimizer(spec.optimizer(), params);
//   const double lr = LearningRate(spec, step, total_steps);
#ifndef CHORUS_WORKER_TRAIN_OPTIMIZER_H_
#define CHORUS_WORKER_TRAIN_OPTIMIZER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "chorus/v1/job.pb.h"

namespace torch::optim {
class Optimizer;
}

namespace chorus {

// SGD, Adam, AdamW or AccumAdam(W) over `params`, as `spec` says (SGD for
// anything else).
std::unique_ptr<torch::optim::Optimizer> BuildOptimizer(const v1::OptimizerSpec& spec,
                                                        const std::vector<at::Tensor>& params);

// The learning rate of the update taken at `step` (0-based) of a run of
// `total_steps` (the cosine schedule's length unless it names its own).
double LearningRate(const v1::JobSpec& spec, int64_t step, int64_t total_steps);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_OPTIMIZER_H_
