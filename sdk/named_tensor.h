// A tensor with the dotted name it has in its module ("fc1.weight"): how
// models hand parameters and buffers to the data-parallel engines and to
// checkpoints.
//
// Plain data; thread-safety is that of the tensor it holds.
//
// Example:
//   std::vector<NamedTensor> params = {{"fc.weight", weight}, {"fc.bias", bias}};
//   params = WithoutRepeatedTensors(std::move(params));  // tied weights once
//
// Part of the SDK's interface ("chorus/named_tensor.h"): programs pass and
// get named tensors (NamedParameters, checkpoints, the elastic helpers).
#ifndef CHORUS_SDK_NAMED_TENSOR_H_
#define CHORUS_SDK_NAMED_TENSOR_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace chorus {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

// `tensors` with every tensor that is the same tensor (the same TensorImpl)
// as an earlier one left out, in order: a parameter two submodules share
// (tied input/output embeddings, `out.weight = hidden.weight`, or one
// submodule registered under two names) stays once, under its first name,
// as PyTorch's named_parameters() lists it. LibTorch's module parameter
// lists repeat it, and a repeated parameter would be averaged, clipped and
// stepped twice. Undefined tensors are kept.
std::vector<NamedTensor> WithoutRepeatedTensors(std::vector<NamedTensor> tensors);

}  // namespace chorus

#endif  // CHORUS_SDK_NAMED_TENSOR_H_
