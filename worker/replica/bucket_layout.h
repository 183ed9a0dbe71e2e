// How the data-parallel engines lay parameters out in buckets: which
// tensors share a bucket (AssignBuckets over their sizes and dtypes) and one
// flat block per bucket with a view per member, so that a bucket travels as
// one message.
//
// Thread-safety: pure functions; the views share the block's memory, so
// writers of either must be ordered by the caller.
//
// Example:
//   std::vector<std::vector<size_t>> buckets =
//       AssignTensorBuckets(params, order, BucketCapBytes(1), BucketCapBytes(25));
//   std::vector<at::Tensor> members = ...;  // params of buckets[b]
//   at::Tensor flat = at::zeros({TotalElements(members)}, members[0].options());
//   std::vector<at::Tensor> views = FlatViews(flat, members);  // views[j] like members[j]
#ifndef CHORUS_WORKER_REPLICA_BUCKET_LAYOUT_H_
#define CHORUS_WORKER_REPLICA_BUCKET_LAYOUT_H_

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace chorus {

// `mb` megabytes (MiB) in bytes, at least 1.
int64_t BucketCapBytes(double mb);

// AssignBuckets (bucket_assignment.h) with each tensor's byte size and
// dtype. `order` holds indices into `tensors`; tensors it does not name are
// in no bucket.
std::vector<std::vector<size_t>> AssignTensorBuckets(const std::vector<at::Tensor>& tensors,
                                                     const std::vector<size_t>& order,
                                                     int64_t first_cap_bytes, int64_t cap_bytes);

// The number of elements of all `tensors` together.
int64_t TotalElements(const std::vector<at::Tensor>& tensors);

// Per member, a tensor shaped like it (contiguous strides) over `flat`'s
// memory, the members back to back from the start of `flat`
// (Note [Flat views]). REQUIRES: flat is contiguous, of the members' dtype,
// with at least TotalElements(members) elements.
std::vector<at::Tensor> FlatViews(const at::Tensor& flat, const std::vector<at::Tensor>& members);

// Note [Flat views]
// A bucket is one flat tensor so that it is one collective; its members
// (gradients in DDP, the parameters themselves in the decentralized engine)
// must then live inside it. The views share the block's storage without
// being autograd views (they are made with set_, not narrow/view): an
// autograd view of a block would make a parameter a non-leaf, and
// optimizers may detach_() a gradient that is one (LibTorch's
// Optimizer::zero_grad does), which an autograd view forbids.

}  // namespace chorus

#endif  // CHORUS_WORKER_REPLICA_BUCKET_LAYOUT_H_
