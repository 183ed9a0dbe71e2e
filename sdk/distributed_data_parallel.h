// DistributedDataParallel: synchronous data parallelism over a Communicator,
// with PyTorch DDP's semantics.
//
// Gradients are averaged across ranks in buckets: as soon as every gradient
// of a bucket is ready (an autograd hook fires), the bucket's all-reduce
// starts and overlaps the rest of backward. FinishGradientSync() waits for all
// buckets and leaves the averaged gradients in each parameter's .grad.
//
// One iteration:
//   RETURN_IF_ERROR(ddp->PrepareForBackward());   // before forward: buffers
//   loss = model->forward(x) ...; loss.backward();
//   RETURN_IF_ERROR(ddp->FinishGradientSync());
//   optimizer.step();
// Gradient accumulation: { auto no_sync = ddp->NoSync(); fwd/bwd ... } then a
// normal iteration.
//
// Thread-safety: one training thread drives an instance (backward hooks run on
// that thread for CPU tensors). Several instances may share a communicator if
// every rank calls them in the same order.
//
// Example:
//   ASSIGN_OR_RETURN(auto ddp, DistributedDataParallel::ForModule(*model, *comm, {}));
//   RETURN_IF_ERROR(ddp->BroadcastParameters(0));
//
// Part of the SDK's interface ("chorus/distributed_data_parallel.h"): a
// program drives the engine itself (chorus/data_parallel.h makes one for a
// module) and sets its DdpOptions. The class is already a pimpl, so this
// header names only Communicator and NamedTensor; its buckets, hooks and
// replica checks stay in worker/ddp and worker/replica, not installed.
#ifndef CHORUS_SDK_DISTRIBUTED_DATA_PARALLEL_H_
#define CHORUS_SDK_DISTRIBUTED_DATA_PARALLEL_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/communicator.h"
#include "chorus/named_tensor.h"

namespace torch {
namespace nn {
class Module;
}
namespace jit {
struct Module;
}
}  // namespace torch

namespace chorus {

struct DdpOptions {
  double bucket_cap_mb = 25;
  // The first bucket is small so that communication starts early.
  double first_bucket_mb = 1;
  // .grad of each parameter is a view into its bucket (Note [Gradients as
  // bucket views]): no copies in or out, but between backward and
  // FinishGradientSync() a .grad is being averaged in place. Off (the
  // default, as in PyTorch DDP): each .grad is its own tensor, copied into
  // the bucket and back. The built-in trainer turns it on.
  bool gradient_as_bucket_view = false;
  // Parameters that get no gradient on some ranks contribute zeros; without
  // this, such a parameter makes FinishGradientSync() fail (on every rank).
  bool find_unused_parameters = false;
  // Parameter/buffer names or name prefixes never synchronized.
  std::vector<std::string> ignored;
  // Broadcast floating-point buffers from rank 0 in PrepareForBackward().
  bool broadcast_buffers = true;
  enum class Compression { kNone, kFp16, kBf16 };
  // Gradients travel in this format (halving the bytes for fp16/bf16).
  Compression compression = Compression::kNone;
  // Names this instance in flight-recorder tags: "ddp:<name>/bucket<i>".
  std::string name = "model";
  // How long FinishGradientSync() and the setup collectives wait.
  absl::Duration timeout = absl::Minutes(5);
};

class DistributedDataParallel {
 public:
  // Wraps `parameters` (those with requires_grad get hooks) and `buffers`;
  // a tensor listed twice (tied weights) counts once, under its first name.
  // Every rank must pass the same names, shapes and dtypes in the same order;
  // otherwise every rank gets INVALID_ARGUMENT naming the first difference.
  // `comm` must outlive the instance.
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> Create(
      std::vector<NamedTensor> parameters, std::vector<NamedTensor> buffers, Communicator& comm,
      DdpOptions options);
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> ForModule(
      torch::nn::Module& module, Communicator& comm, DdpOptions options);
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> ForScriptModule(
      torch::jit::Module& module, Communicator& comm, DdpOptions options);

  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;
  // Removes the autograd hooks.
  ~DistributedDataParallel();

  // Copies `root`'s parameters and buffers to every rank.
  absl::Status BroadcastParameters(int root);
  // Call before each forward: broadcasts buffers (if enabled) and checks the
  // previous iteration was finished.
  absl::Status PrepareForBackward();
  // Waits for every bucket and leaves averaged gradients in .grad. Returns
  // the first communication error, or INVALID_ARGUMENT naming parameters that
  // got no gradient when find_unused_parameters is off.
  absl::Status FinishGradientSync();

  // While alive, backward passes accumulate gradients locally without
  // communicating.
  class NoSyncScope {
   public:
    explicit NoSyncScope(DistributedDataParallel& ddp);
    ~NoSyncScope();
    NoSyncScope(const NoSyncScope&) = delete;
    NoSyncScope& operator=(const NoSyncScope&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSyncScope NoSync() { return NoSyncScope(*this); }

  // Introspection for tests and metrics.
  size_t bucket_count() const;
  // Parameter names of bucket `b`, in bucket order.
  std::vector<std::string> bucket_parameters(size_t b) const;
  int64_t iterations() const;

  class Impl;

 private:
  explicit DistributedDataParallel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Note [Bucket order]
// Before the first iteration buckets follow the reverse of the parameter
// order (gradients of the last layers are usually ready first). During the
// first synchronized iteration every rank records the order in which its
// gradients became ready; FinishGradientSync() then broadcasts rank 0's order
// and every rank rebuilds its buckets from it with the same pure function
// (AssignBuckets), so all ranks hold identical buckets and launch their
// all-reduces in the same index order. Buckets launch strictly in index
// order: a bucket that is complete early waits for its predecessors, which
// keeps the collective sequence identical on every rank.
//
// Note [Averaging]
// Buckets are all-reduced with ReduceOp::kAvg: the ring divides each chunk by
// the world size once it is fully reduced, so every rank scales only 1/size of
// the data and no extra pass over the bucket is made. Compressed buckets are
// divided while they are converted to fp16/bf16 and then summed, which keeps
// fp16 sums in range. A parameter without a gradient contributes zeros and is
// divided by the full world size too, exactly as one process on the
// concatenated batch would see it.
//
// Note [Used parameters]
// Ranks must learn which parameters got no gradient on some rank (an error
// unless find_unused_parameters; no .grad at all when unused on every rank).
// The flags are all-reduced as one more collective, issued right after the
// last bucket: at that point every gradient has been copied into its bucket
// or zeroed as missing, so the flags are final. On the CPU every rank reads
// the counts, so every rank reports a parameter some rank missed. On a GPU
// only a rank that missed a gradient itself reads them (reading costs a host
// wait for the whole step, Note [Device buckets]): that rank's
// FinishGradientSync() fails naming the parameter, and a rank that produced
// every gradient carries on (each of its gradients was used).
//
// Note [Device buckets]
// With a device communicator (NCCL), FinishGradientSync() does not wait for
// the buckets on the host: Work::WaitOnDevice makes the training stream wait
// for each bucket's all-reduce, and the gradients are copied out of the
// buckets on that stream. The host goes on to the optimizer step and the
// next forward while the GPU finishes, as in a loop without DDP; a failed
// all-reduce fails the next collective that waits on the host. Measured on
// one GPU: docs/gpu.md.
//
// Note [Gradients as bucket views]
// With gradient_as_bucket_view each parameter's .grad is a view into its
// bucket. Backward accumulates into the bucket in place, the all-reduce
// averages it there, and the optimizer reads the result: the copy of every
// gradient into its bucket and back is gone, and so is a second
// gradient-sized allocation. On two CPU ranks of the 14.2 M MLP (bench/ddp_bench)
// those two copies were ~10-13 ms of a 90-100 ms step: the step was 1.41x
// the compute alone with them and 1.26x without.
// After FinishGradientSync() a program sees what it sees without views: a
// gradient is undefined when no rank used its parameter; a .grad the
// program replaced (or that autograd created after a reset) has been copied
// into the bucket and the view put back; zero_grad() zeroes the view in
// place. Two things differ. A bucket's all-reduce starts while backward is
// still running, on the very memory .grad points to, so a .grad read
// between backward and FinishGradientSync() is partly averaged (without
// views it is still this rank's own gradient). And .grad is bucket memory
// (shared memory on one host) that the next backward overwrites. PyTorch
// hides the first by finishing the all-reduces inside backward(); here they
// finish in FinishGradientSync(), so the option stays off by default, as in
// PyTorch. The built-in trainer, which reads gradients only after
// FinishGradientSync(), turns it on (job spec strategy.ddp.
// gradient_as_bucket_view, default true).
//
// Note [Gradient hooks] (worker/replica/gradient_ready_hooks.h) says how
// "gradient ready" is observed; Note [Flat views]
// (worker/replica/bucket_layout.h) how gradients live in their bucket.

}  // namespace chorus

#endif  // CHORUS_SDK_DISTRIBUTED_DATA_PARALLEL_H_
