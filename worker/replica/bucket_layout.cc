#include "worker/replica/bucket_layout.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>

#include <algorithm>

#include "worker/replica/bucket_assignment.h"

namespace chorus {

int64_t BucketCapBytes(double mb) {
  return std::max<int64_t>(1, static_cast<int64_t>(mb * 1024 * 1024));
}

std::vector<std::vector<size_t>> AssignTensorBuckets(const std::vector<at::Tensor>& tensors,
                                                     const std::vector<size_t>& order,
                                                     int64_t first_cap_bytes, int64_t cap_bytes) {
  std::vector<BucketInput> inputs(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    inputs[i] = {static_cast<int64_t>(tensors[i].nbytes()),
                 static_cast<int>(tensors[i].scalar_type())};
  }
  return AssignBuckets(inputs, order, first_cap_bytes, cap_bytes);
}

int64_t TotalElements(const std::vector<at::Tensor>& tensors) {
  int64_t total = 0;
  for (const at::Tensor& t : tensors) total += t.numel();
  return total;
}

std::vector<at::Tensor> FlatViews(const at::Tensor& flat, const std::vector<at::Tensor>& members) {
  const at::TensorOptions options = flat.options().requires_grad(false);
  std::vector<at::Tensor> views;
  views.reserve(members.size());
  int64_t offset = flat.storage_offset();
  for (const at::Tensor& member : members) {
    at::Tensor view = at::empty({0}, options);
    view.set_(flat.storage(), offset, member.sizes(), c10::contiguous_strides(member.sizes()));
    views.push_back(std::move(view));
    offset += member.numel();
  }
  return views;
}

}  // namespace chorus
