// A tensor with the dotted name it has in its module ("fc1.weight"): how
// models hand parameters and buffers to the data-parallel engines and to
// checkpoints.
//
// Plain data; thread-safety is that of the tensor it holds.
//
// Example:
//   std::vector<NamedTensor> params = {{"fc.weight", weight}, {"fc.bias", bias}};
#ifndef CHORUS_WORKER_REPLICA_NAMED_TENSOR_H_
#define CHORUS_WORKER_REPLICA_NAMED_TENSOR_H_

#include <string>

#include <ATen/core/Tensor.h>

namespace chorus {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_REPLICA_NAMED_TENSOR_H_
