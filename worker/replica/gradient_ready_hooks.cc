#include "worker/replica/gradient_ready_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <utility>

namespace chorus {
namespace {

class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(const std::function<void(size_t)>* ready, size_t index)
      : ready_(ready), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    (*ready_)(index_);
    return outputs;
  }

 private:
  const std::function<void(size_t)>* ready_;
  size_t index_;
};

}  // namespace

GradientReadyHooks::GradientReadyHooks(const std::vector<at::Tensor>& tensors,
                                       std::function<void(size_t)> ready)
    : ready_(std::move(ready)) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(tensors[i]));
    keys_.push_back(accumulators_.back()->add_post_hook(std::make_unique<ReadyHook>(&ready_, i)));
  }
}

GradientReadyHooks::~GradientReadyHooks() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(keys_[i]);
}

}  // namespace chorus
