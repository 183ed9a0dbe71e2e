// "This gradient is ready" callbacks on parameters: what lets an engine
// start communicating a bucket while backward is still running.
//
// Thread-safety: the hooks run on the thread that runs backward (the
// training thread for CPU tensors); construct and destroy on that thread.
//
// Example:
//   GradientReadyHooks hooks(tensors, [&](size_t i) { MarkReady(i); });
//   loss.backward();  // MarkReady(i) once per tensor that got a gradient
#ifndef CHORUS_WORKER_REPLICA_GRADIENT_READY_HOOKS_H_
#define CHORUS_WORKER_REPLICA_GRADIENT_READY_HOOKS_H_

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace chorus {

// Calls `ready(i)` each time backward has finished writing tensors[i].grad
// (Note [Gradient hooks]). The hooks are removed by the destructor.
// REQUIRES: every tensor requires grad and is a leaf.
class GradientReadyHooks {
 public:
  GradientReadyHooks(const std::vector<at::Tensor>& tensors, std::function<void(size_t)> ready);
  ~GradientReadyHooks();
  GradientReadyHooks(const GradientReadyHooks&) = delete;
  GradientReadyHooks& operator=(const GradientReadyHooks&) = delete;

 private:
  std::function<void(size_t)> ready_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> keys_;
};

// Note [Gradient hooks]
// LibTorch 1.13 has no register_post_accumulate_grad_hook. A tensor hook
// (register_hook) sees the incoming gradient before it is added to .grad, so
// it cannot observe the accumulated value. Like PyTorch's Reducer we add a
// post hook to each parameter's gradient accumulator node, which runs after
// .grad has been written; the accumulator is kept alive by the instance so the
// hook survives graph rebuilds, and the hook is removed in the destructor. A
// parameter used several times in one backward is summed by the engine before
// its accumulator runs, so the hook fires once per backward.

}  // namespace chorus

#endif  // CHORUS_WORKER_REPLICA_GRADIENT_READY_HOOKS_H_
