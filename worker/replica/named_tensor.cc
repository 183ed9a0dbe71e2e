#include "chorus/named_tensor.h"

#include <unordered_set>
#include <utility>

namespace chorus {

std::vector<NamedTensor> WithoutRepeatedTensors(std::vector<NamedTensor> tensors) {
  std::unordered_set<const c10::TensorImpl*> seen;
  std::vector<NamedTensor> out;
  out.reserve(tensors.size());
  for (NamedTensor& t : tensors) {
    if (t.tensor.defined() && !seen.insert(t.tensor.unsafeGetTensorImpl()).second) continue;
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace chorus
