#include "chorus/distributed_data_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/replica/bucket_layout.h"
#include "worker/replica/gradient_ready_hooks.h"
#include "worker/replica/replica_sync.h"

namespace chorus {
namespace {

bool IsIgnored(const std::string& name, const std::vector<std::string>& ignored) {
  for (const std::string& prefix : ignored) {
    if (absl::StartsWith(name, prefix)) return true;
  }
  return false;
}

// Note [One rank]
// A communicator of one rank has nothing to average: its all-reduce leaves
// the tensor as it is. Issued anyway, each bucket and the used-parameter
// counts were a round trip through the communicator's thread every step
// (0.16 ms a step of a 1-rank job on the 2-core bench machine, a third of
// a data-bound step), so with one rank they are not issued: each is this
// finished op, and the gradients are installed as the all-reduce would
// have left them (compressed and back, where compression is on).
class FinishedWork final : public Work {
 public:
  absl::Status Wait(absl::Time /*deadline*/) override { return absl::OkStatus(); }
  bool Done() const override { return true; }
  int64_t seq() const override { return -1; }  // never in the flight recorder
};

}  // namespace

class DistributedDataParallel::Impl {
 public:
  struct Bucket {
    std::vector<size_t> members;    // indices into params_
    std::vector<at::Tensor> views;  // per member: a view of `flat` shaped like the parameter
    at::Tensor flat;
    at::Tensor wire;  // what goes on the wire: `flat`, or its compressed copy
    size_t pending = 0;
    std::shared_ptr<Work> work;
  };

  Impl(std::vector<NamedTensor> params, std::vector<NamedTensor> buffers, Communicator& comm,
       DdpOptions options)
      : params_(std::move(params)),
        buffers_(std::move(buffers)),
        comm_(comm),
        options_(std::move(options)),
        ready_(params_.size(), 0) {}

  std::string Tag(absl::string_view what) const {
    return absl::StrCat("ddp:", options_.name, "/", what);
  }

  absl::Time Deadline() const { return absl::Now() + options_.timeout; }

  // Fails on every rank, naming the first difference, if the ranks do not
  // hold the same parameters.
  absl::Status CheckParametersAgree() {
    std::vector<NamedTensor> all = params_;
    all.insert(all.end(), buffers_.begin(), buffers_.end());
    return CheckReplicasAgree(all, comm_, absl::StrCat("ddp:", options_.name), Deadline());
  }

  void RegisterHooks();

  // Rebuilds buckets from `order` (a permutation of synced_), keeping the
  // current gradients.
  void BuildBuckets(const std::vector<size_t>& order) {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> tensors;
    for (const NamedTensor& p : params_) tensors.push_back(p.tensor);
    std::vector<std::vector<size_t>> assignment =
        AssignTensorBuckets(tensors, order, BucketCapBytes(options_.first_bucket_mb),
                            BucketCapBytes(options_.bucket_cap_mb));
    buckets_.clear();
    buckets_.resize(assignment.size());
    locator_.assign(params_.size(), {0, 0});
    for (size_t b = 0; b < assignment.size(); ++b) {
      Bucket& bucket = buckets_[b];
      bucket.members = std::move(assignment[b]);
      std::vector<at::Tensor> members;
      for (size_t i : bucket.members) members.push_back(params_[i].tensor);
      const int64_t total = TotalElements(members);
      const at::TensorOptions opts = members[0].options().requires_grad(false);
      // In shared memory where the communicator has it, so that a same-host
      // all-reduce works on the bucket in place (Note [Shared-memory all-reduce]).
      bucket.flat = comm_.NewBuffer(total, opts).zero_();
      // Note [Flat views].
      bucket.views = FlatViews(bucket.flat, members);
      for (size_t j = 0; j < bucket.members.size(); ++j) {
        locator_[bucket.members[j]] = {b, j};
        if (options_.gradient_as_bucket_view) {
          at::Tensor& grad = members[j].mutable_grad();
          if (grad.defined()) bucket.views[j].copy_(grad);
          grad = bucket.views[j];
        }
      }
      switch (options_.compression) {
        case DdpOptions::Compression::kFp16:
          bucket.wire = comm_.NewBuffer(total, opts.dtype(at::kHalf));
          break;
        case DdpOptions::Compression::kBf16:
          bucket.wire = comm_.NewBuffer(total, opts.dtype(at::kBFloat16));
          break;
        default:
          bucket.wire = bucket.flat;
          break;
      }
      bucket.pending = bucket.members.size();
    }
  }

  // Called by the hook of synced parameter `i` once its .grad is written.
  void MarkReady(size_t i) {
    if (no_sync_) return;
    torch::NoGradGuard no_grad;
    if (ready_[i]) {
      if (hook_error_.ok()) {
        hook_error_ = absl::FailedPreconditionError(absl::StrCat(
            "ddp:", options_.name, ": parameter '", params_[i].name,
            "' received gradients from two backward passes in one iteration; call "
            "FinishGradientSync() after each backward, or use NoSync() to accumulate"));
      }
      return;
    }
    ready_[i] = 1;
    if (!rebuilt_) ready_order_.push_back(i);
    auto [b, j] = locator_[i];
    Bucket& bucket = buckets_[b];
    at::Tensor& grad = params_[i].tensor.mutable_grad();
    at::Tensor& view = bucket.views[j];
    if (!grad.defined()) {
      view.zero_();
    } else if (!grad.is_same(view)) {
      view.copy_(grad);
      if (options_.gradient_as_bucket_view) grad = view;
    }
    if (--bucket.pending == 0) LaunchReady();
  }

  // Launches, in index order, every bucket whose gradients are all ready.
  void LaunchReady() {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
      Bucket& bucket = buckets_[next_launch_];
      const std::string tag = Tag(absl::StrCat("bucket", next_launch_));
      // Note [Averaging].
      const bool one = comm_.size() == 1;  // Note [One rank]
      if (options_.compression == DdpOptions::Compression::kNone) {
        bucket.work = one ? std::make_shared<FinishedWork>()
                          : comm_.AllReduce(bucket.flat, ReduceOp::kAvg, tag);
      } else {
        at::mul_out(bucket.wire, bucket.flat, 1.0 / comm_.size());
        bucket.work = one ? std::make_shared<FinishedWork>()
                          : comm_.AllReduce(bucket.wire, ReduceOp::kSum, tag);
      }
      ++next_launch_;
    }
    if (next_launch_ == buckets_.size() && !used_work_) LaunchUsedCounts();
  }

  // Note [Used parameters]: every gradient is in its bucket (or was zeroed as
  // missing), so whether each parameter was used is final; its count over the
  // ranks follows the last bucket through the communicator.
  void LaunchUsedCounts() {
    const int64_t n = static_cast<int64_t>(synced_.size());
    const bool gpu = !comm_.device().is_cpu();
    // A new block each time: on a GPU the host may be an iteration ahead of
    // the copy (PyTorch's pinned-memory cache keeps a block until the copies
    // that read it are done).
    at::Tensor host = at::empty({n}, at::TensorOptions(at::kLong).pinned_memory(gpu));
    int64_t* flags = host.data_ptr<int64_t>();
    for (int64_t k = 0; k < n; ++k) flags[k] = ready_[synced_[k]];
    if (gpu) {
      if (!used_wire_.defined()) {
        used_wire_ = at::empty({n}, at::TensorOptions(at::kLong).device(comm_.device()));
      }
      used_wire_.copy_(host, /*non_blocking=*/true);
    } else {
      used_wire_ = host;
    }
    used_work_ = comm_.size() == 1  // Note [One rank]
                     ? std::make_shared<FinishedWork>()
                     : comm_.AllReduce(used_wire_, ReduceOp::kSum, Tag("used_parameters"));
  }

  absl::Status Finish() {
    if (no_sync_) return absl::OkStatus();
    torch::NoGradGuard no_grad;
    const std::vector<size_t> missing = ZeroMissingGradients();
    LaunchReady();
    absl::Status status = WaitForBuckets();
    std::vector<int64_t> used = ReadUsedCounts(missing, status);
    if (status.ok() && !options_.find_unused_parameters) status = CheckEveryParameterUsed(used);
    if (status.ok()) {
      InstallGradients(used);
      if (!rebuilt_) status = RebuildFromRankZeroOrder(missing);
    }
    ResetForNextIteration();
    return status;
  }

  // Parameters without a gradient this iteration contribute zeros, so that
  // every rank still launches every bucket (no rank is left waiting). Returns
  // their indices.
  std::vector<size_t> ZeroMissingGradients() {
    std::vector<size_t> missing;
    for (size_t i : synced_) {
      if (ready_[i]) continue;
      missing.push_back(i);
      auto [b, j] = locator_[i];
      buckets_[b].views[j].zero_();
      --buckets_[b].pending;
    }
    return missing;
  }

  // Note [Device buckets]: on a GPU the training stream, not the host, waits
  // for the buckets. The first error of the hooks or of a bucket.
  absl::Status WaitForBuckets() {
    absl::Status status = hook_error_;
    for (Bucket& bucket : buckets_) {
      absl::Status s = bucket.work ? bucket.work->WaitOnDevice(Deadline())
                                   : absl::InternalError("bucket was never launched");
      if (status.ok() && !s.ok()) status = s;
    }
    return status;
  }

  // How many ranks produced each gradient (Note [Used parameters]); an error
  // of that all-reduce goes into `status` unless it holds one already.
  std::vector<int64_t> ReadUsedCounts(const std::vector<size_t>& missing, absl::Status& status) {
    if (!used_work_) LaunchUsedCounts();
    const bool read_used = comm_.device().is_cpu() || !missing.empty();
    absl::Status used_status =
        read_used ? used_work_->Wait(Deadline()) : used_work_->WaitOnDevice(Deadline());
    if (status.ok() && !used_status.ok()) status = used_status;
    // Not read: this rank produced every gradient, so each was used.
    std::vector<int64_t> used(synced_.size(), comm_.size());
    if (read_used && used_status.ok() && !used.empty()) {
      const at::Tensor counts = used_wire_.to(at::kCPU);
      std::copy_n(counts.data_ptr<int64_t>(), used.size(), used.begin());
    }
    return used;
  }

  // Without find_unused_parameters, a parameter some rank gave no gradient is
  // an error naming it.
  absl::Status CheckEveryParameterUsed(const std::vector<int64_t>& used) const {
    std::vector<std::string> names;
    for (size_t k = 0; k < synced_.size(); ++k) {
      if (used[k] < comm_.size()) names.push_back(params_[synced_[k]].name);
    }
    if (names.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "ddp:", options_.name, ": ", names.size(),
        " parameter(s) got no gradient on at least one rank in this iteration: ",
        absl::StrJoin(names.begin(), names.begin() + std::min<size_t>(names.size(), 10), ", "),
        names.size() > 10 ? ", ..." : "",
        ". If parts of the model are legitimately unused, enable find_unused_parameters "
        "(strategy.ddp.find_unused_parameters: true); otherwise make every parameter "
        "contribute to the loss."));
  }

  // The averaged buckets become the parameters' gradients.
  void InstallGradients(const std::vector<int64_t>& used) {
    for (Bucket& bucket : buckets_) {
      if (options_.compression != DdpOptions::Compression::kNone) bucket.flat.copy_(bucket.wire);
    }
    for (size_t k = 0; k < synced_.size(); ++k) {
      const size_t i = synced_[k];
      auto [b, j] = locator_[i];
      at::Tensor& view = buckets_[b].views[j];
      at::Tensor& grad = params_[i].tensor.mutable_grad();
      if (used[k] == 0) {
        grad = at::Tensor();  // unused on every rank: no gradient, as in PyTorch
      } else if (options_.gradient_as_bucket_view) {
        if (!grad.is_same(view)) grad = view;
      } else if (grad.defined()) {
        grad.copy_(view);
      } else {
        grad = view.clone();
      }
    }
  }

  // Ready for the next iteration, whatever happened.
  void ResetForNextIteration() {
    std::fill(ready_.begin(), ready_.end(), 0);
    next_launch_ = 0;
    hook_error_ = absl::OkStatus();
    for (Bucket& bucket : buckets_) {
      bucket.pending = bucket.members.size();
      bucket.work.reset();
    }
    used_work_.reset();
    ++iterations_;
  }

  // Note [Bucket order]: adopt rank 0's gradient-ready order.
  absl::Status RebuildFromRankZeroOrder(const std::vector<size_t>& missing) {
    std::vector<size_t> order = ready_order_;
    order.insert(order.end(), missing.rbegin(), missing.rend());
    RETURN_IF_ERROR(BroadcastIndices(order, 0, comm_, Tag("bucket_order"), Deadline()));
    BuildBuckets(order);
    rebuilt_ = true;
    ready_order_.clear();
    return absl::OkStatus();
  }

  absl::Status BroadcastParameters(int root) {
    std::vector<at::Tensor> all;
    for (const NamedTensor& p : params_) all.push_back(p.tensor);
    for (const NamedTensor& b : buffers_) all.push_back(b.tensor);
    return BroadcastCoalesced(all, root, comm_, Tag("broadcast_parameters"), Deadline());
  }

  absl::Status Prepare() {
    if (std::any_of(ready_.begin(), ready_.end(), [](char r) { return r != 0; })) {
      return absl::FailedPreconditionError(
          absl::StrCat("ddp:", options_.name,
                       ": the previous backward's gradients were never synchronized; call "
                       "FinishGradientSync() after each backward (or wrap it in NoSync())"));
    }
    if (!options_.broadcast_buffers || comm_.size() == 1) return absl::OkStatus();
    std::vector<at::Tensor> floats;
    for (const NamedTensor& b : buffers_) {
      if (at::isFloatingType(b.tensor.scalar_type())) floats.push_back(b.tensor);
    }
    if (floats.empty()) return absl::OkStatus();
    return BroadcastCoalesced(floats, 0, comm_, Tag("buffers"), Deadline());
  }

  std::vector<NamedTensor> params_;
  std::vector<NamedTensor> buffers_;
  Communicator& comm_;
  const DdpOptions options_;
  std::vector<size_t> synced_;  // params with requires_grad, in declaration order
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> locator_;  // param -> (bucket, slot)
  std::unique_ptr<GradientReadyHooks> hooks_;

  // Per-parameter use flags (Note [Used parameters]), all-reduced on the
  // communicator's device.
  at::Tensor used_wire_;

  // Per iteration.
  std::shared_ptr<Work> used_work_;
  std::vector<char> ready_;
  std::vector<size_t> ready_order_;
  size_t next_launch_ = 0;
  absl::Status hook_error_;
  bool rebuilt_ = false;
  bool no_sync_ = false;
  int64_t iterations_ = 0;
};

void DistributedDataParallel::Impl::RegisterHooks() {
  std::vector<at::Tensor> tensors;
  for (size_t i : synced_) tensors.push_back(params_[i].tensor);
  hooks_ =
      std::make_unique<GradientReadyHooks>(tensors, [this](size_t k) { MarkReady(synced_[k]); });
}

absl::StatusOr<std::unique_ptr<DistributedDataParallel>> DistributedDataParallel::Create(
    std::vector<NamedTensor> parameters, std::vector<NamedTensor> buffers, Communicator& comm,
    DdpOptions options) {
  if (!(options.bucket_cap_mb > 0) || !(options.first_bucket_mb > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ddp: bucket_cap_mb and first_bucket_mb must be > 0, got ",
                     options.bucket_cap_mb, " and ", options.first_bucket_mb));
  }
  // A parameter shared by two submodules is synchronized once.
  parameters = WithoutRepeatedTensors(std::move(parameters));
  buffers = WithoutRepeatedTensors(std::move(buffers));
  std::vector<NamedTensor> params;
  for (NamedTensor& p : parameters) {
    if (!p.tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("ddp: parameter '", p.name, "' is undefined"));
    }
    if (!IsIgnored(p.name, options.ignored)) params.push_back(std::move(p));
  }
  std::vector<NamedTensor> kept_buffers;
  for (NamedTensor& b : buffers) {
    if (b.tensor.defined() && !IsIgnored(b.name, options.ignored))
      kept_buffers.push_back(std::move(b));
  }
  if ((options.compression != DdpOptions::Compression::kNone)) {
    for (const NamedTensor& p : params) {
      if (p.tensor.scalar_type() != at::kFloat && p.tensor.requires_grad()) {
        return absl::InvalidArgumentError(
            absl::StrCat("ddp: gradient compression needs float32 parameters; '", p.name, "' is ",
                         c10::toString(p.tensor.scalar_type())));
      }
    }
  }
  auto impl =
      std::make_unique<Impl>(std::move(params), std::move(kept_buffers), comm, std::move(options));
  for (size_t i = 0; i < impl->params_.size(); ++i) {
    if (impl->params_[i].tensor.requires_grad()) impl->synced_.push_back(i);
  }
  RETURN_IF_ERROR(impl->CheckParametersAgree());
  // Note [Bucket order]: reverse declaration order until the first iteration.
  std::vector<size_t> order(impl->synced_.rbegin(), impl->synced_.rend());
  impl->BuildBuckets(order);
  impl->RegisterHooks();
  return std::unique_ptr<DistributedDataParallel>(new DistributedDataParallel(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<DistributedDataParallel>> DistributedDataParallel::ForModule(
    torch::nn::Module& module, Communicator& comm, DdpOptions options) {
  std::vector<NamedTensor> params, buffers;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    params.push_back({item.key(), item.value()});
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    buffers.push_back({item.key(), item.value()});
  }
  return Create(std::move(params), std::move(buffers), comm, std::move(options));
}

absl::StatusOr<std::unique_ptr<DistributedDataParallel>> DistributedDataParallel::ForScriptModule(
    torch::jit::Module& module, Communicator& comm, DdpOptions options) {
  std::vector<NamedTensor> params, buffers;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    params.push_back({item.name, item.value});
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    buffers.push_back({item.name, item.value});
  }
  return Create(std::move(params), std::move(buffers), comm, std::move(options));
}

DistributedDataParallel::DistributedDataParallel(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

DistributedDataParallel::~DistributedDataParallel() = default;

absl::Status DistributedDataParallel::BroadcastParameters(int root) {
  return impl_->BroadcastParameters(root);
}

absl::Status DistributedDataParallel::PrepareForBackward() { return impl_->Prepare(); }

absl::Status DistributedDataParallel::FinishGradientSync() { return impl_->Finish(); }

DistributedDataParallel::NoSyncScope::NoSyncScope(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.impl_->no_sync_) {
  ddp_.impl_->no_sync_ = true;
}

DistributedDataParallel::NoSyncScope::~NoSyncScope() { ddp_.impl_->no_sync_ = previous_; }

size_t DistributedDataParallel::bucket_count() const { return impl_->buckets_.size(); }

std::vector<std::string> DistributedDataParallel::bucket_parameters(size_t b) const {
  std::vector<std::string> names;
  for (size_t i : impl_->buckets_.at(b).members) names.push_back(impl_->params_[i].name);
  return names;
}

int64_t DistributedDataParallel::iterations() const { return impl_->iterations_; }

}  // namespace chorus
