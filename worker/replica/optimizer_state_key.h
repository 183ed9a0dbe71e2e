// The key under which LibTorch's optimizers file a parameter's state:
// LibTorch 1.x uses the parameter's TensorImpl address printed as a string,
// 2.x the address itself. Code that moves or reads optimizer state by
// parameter uses these two names and builds against either.
//
// Example:
//   auto it = optimizer.state().find(OptimizerStateKeyOf(param));
#ifndef CHORUS_WORKER_REPLICA_OPTIMIZER_STATE_KEY_H_
#define CHORUS_WORKER_REPLICA_OPTIMIZER_STATE_KEY_H_

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace chorus {

using OptimizerStateKey =
    typename std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

// A template so that only the branch of the LibTorch at hand is compiled.
template <typename Key = OptimizerStateKey>
Key OptimizerStateKeyOf(const at::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // as LibTorch 1.x's c10::guts::to_string prints it
    out << static_cast<const void*>(param.unsafeGetTensorImpl());
    return out.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

}  // namespace chorus

#endif  // CHORUS_WORKER_REPLICA_OPTIMIZER_STATE_KEY_H_
