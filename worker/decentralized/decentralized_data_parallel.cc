#include "chorus/decentralized_data_parallel.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/replica/bucket_layout.h"
#include "worker/replica/gradient_clipping.h"
#include "worker/replica/gradient_ready_hooks.h"
#include "worker/replica/optimizer_state_key.h"
#include "worker/replica/replica_sync.h"

namespace chorus {

class DecentralizedDataParallel::Impl {
 public:
  struct Bucket {
    std::vector<size_t> members;  // indices into trained_
    at::Tensor block;             // the members' storage
    at::Tensor recv;              // the peer's block, or the group mean
    bool received = false;  // recv holds an exchange not mixed in yet (restored from a checkpoint)
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    size_t pending = 0;          // members whose gradient is not ready yet
    std::shared_ptr<Work> work;  // exchange launched by the previous step
    bool pair = false;           // work is a SendRecv (else a group mean)
    at::Tensor backup;           // own block while globally averaged
  };

  Impl(std::vector<NamedTensor> params, std::vector<NamedTensor> buffers, Communicator& comm,
       OptimizerFactory make_optimizer, LrSchedule lr_schedule, DecentralizedOptions options,
       Topology topology)
      : params_(std::move(params)),
        buffers_(std::move(buffers)),
        comm_(comm),
        make_optimizer_(std::move(make_optimizer)),
        lr_schedule_(std::move(lr_schedule)),
        options_(std::move(options)),
        topology_(std::move(topology)),
        training_(topology_.world_size()),
        self_group_{comm_.rank()} {}

  // Note [Hot spares] in the header.
  bool spare() const { return comm_.rank() >= training_; }

  // This rank's group at step t: a spare's is itself.
  const std::vector<int>& Group(int64_t t) const {
    return spare() ? self_group_ : topology_.GroupOf(t, comm_.rank());
  }

  std::string Tag(absl::string_view what) const {
    return absl::StrCat("dec:", options_.name, "/", what);
  }
  absl::Time Deadline() const { return absl::Now() + options_.timeout; }

  // Sub-communicators for every group of more than two ranks (but not the
  // whole world) this rank is in, made in schedule order so that every
  // member calls NewGroup in the same order.
  absl::Status MakeGroups() {
    for (int t = 0; t < topology_.period(); ++t) {
      const std::vector<int>& group = Group(t);
      if (group.size() <= 2 || static_cast<int>(group.size()) == comm_.size()) continue;
      const std::string key = absl::StrJoin(group, ",");
      if (groups_.count(key)) continue;
      ASSIGN_OR_RETURN(groups_[key], comm_.NewGroup(group));
    }
    return absl::OkStatus();
  }

  // Lays the trained parameters out in buckets following `order` (indices
  // into trained_), moving values and optimizer state.
  void BuildBuckets(const std::vector<size_t>& order) {
    at::NoGradGuard no_grad;
    // A restored exchange (nothing is in flight while the layout changes)
    // moves with its parameters.
    bool pair = false;
    const std::vector<at::Tensor> received = ReceivedByParam(&pair);
    std::vector<at::Tensor> tensors;
    for (size_t k = 0; k < trained_.size(); ++k) tensors.push_back(Param(k));
    const int64_t cap = BucketCapBytes(options_.bucket_cap_mb);
    std::vector<std::vector<size_t>> assignment = AssignTensorBuckets(tensors, order, cap, cap);
    std::vector<Bucket> old = std::move(buckets_);
    buckets_.clear();
    buckets_.resize(assignment.size());
    bucket_of_.assign(trained_.size(), 0);
    for (size_t b = 0; b < assignment.size(); ++b) {
      Bucket& bucket = buckets_[b];
      bucket.members = std::move(assignment[b]);
      std::vector<at::Tensor> members;
      for (size_t k : bucket.members) members.push_back(Param(k));
      const int64_t total = TotalElements(members);
      const at::TensorOptions opts = members[0].options().requires_grad(false);
      bucket.block = at::empty({total}, opts);
      bucket.recv = at::empty({total}, opts);
      // The parameters move into the block and stay leaves (Note [Flat views]).
      std::vector<at::Tensor> views = FlatViews(bucket.block, members);
      for (size_t j = 0; j < members.size(); ++j) {
        views[j].copy_(members[j]);
        members[j].set_data(views[j]);
        bucket_of_[bucket.members[j]] = b;
      }
      bucket.optimizer = make_optimizer_(members);
      bucket.pending = bucket.members.size();
    }
    // Optimizer state is keyed by the parameter, which kept its identity.
    std::map<OptimizerStateKey, torch::optim::Optimizer*> owner;
    for (Bucket& bucket : buckets_) {
      for (size_t k : bucket.members) owner[OptimizerStateKeyOf(Param(k))] = bucket.optimizer.get();
    }
    for (Bucket& bucket : old) {
      for (auto& [key, state] : bucket.optimizer->state()) {
        auto it = owner.find(key);
        if (it != owner.end()) it->second->state()[key] = std::move(state);
      }
    }
    SetReceived(received, pair);
  }

  // Offset of each trained parameter in its bucket's block.
  int64_t OffsetInBucket(size_t k) const {
    int64_t offset = 0;
    for (size_t m : buckets_[bucket_of_[k]].members) {
      if (m == k) break;
      offset += params_[trained_[m]].tensor.numel();
    }
    return offset;
  }

  // Per trained parameter, a copy of what its bucket received and has not
  // mixed in yet (undefined where nothing is pending).
  std::vector<at::Tensor> ReceivedByParam(bool* pair) const {
    std::vector<at::Tensor> out(trained_.size());
    for (const Bucket& bucket : buckets_) {
      if (!bucket.received) continue;
      *pair = bucket.pair;
      int64_t offset = 0;
      for (size_t k : bucket.members) {
        const at::Tensor& p = params_[trained_[k]].tensor;
        out[k] = bucket.recv.narrow(0, offset, p.numel()).view(p.sizes()).clone();
        offset += p.numel();
      }
    }
    return out;
  }

  // Puts per-parameter received values into the buckets; a bucket counts
  // as received when all its members have one.
  void SetReceived(const std::vector<at::Tensor>& received, bool pair) {
    for (Bucket& bucket : buckets_) {
      bool all = !bucket.members.empty();
      int64_t offset = 0;
      for (size_t k : bucket.members) {
        const int64_t n = params_[trained_[k]].tensor.numel();
        if (k < received.size() && received[k].defined()) {
          bucket.recv.narrow(0, offset, n).copy_(received[k].reshape({-1}));
        } else {
          all = false;
        }
        offset += n;
      }
      bucket.received = all;
      if (all) bucket.pair = pair;
    }
  }

  at::Tensor& Param(size_t k) { return params_[trained_[k]].tensor; }

  // Hook: trained parameter k's gradient is ready.
  void MarkReady(size_t k) {
    if (accumulating_) return;
    if (ready_[k]) {
      if (error_.ok()) {
        error_ = absl::FailedPreconditionError(absl::StrCat(
            "dec:", options_.name, ": parameter '", params_[trained_[k]].name,
            "' received gradients from two backward passes in one step; call FinishStep() after "
            "each backward, or use Accumulate() to accumulate"));
      }
      return;
    }
    ready_[k] = 1;
    if (!laid_out_) order_.push_back(k);
    --buckets_[bucket_of_[k]].pending;
    if (!Deferred()) UpdateReady();
  }

  // Updates happen in FinishStep (not in hooks) on the first step, when the bucket
  // layout is still to be decided, and with global-norm clipping, which
  // needs every gradient.
  bool Deferred() const {
    return !laid_out_ || (options_.clip_norm > 0 &&
                          options_.clip_mode == DecentralizedOptions::Clip::kGlobalNorm);
  }

  // Updates, in index order, every bucket whose gradients are all ready.
  void UpdateReady() {
    while (next_ < buckets_.size() && buckets_[next_].pending == 0) {
      absl::Status s = Update(next_);
      if (error_.ok() && !s.ok()) error_ = s;
      ++next_;
    }
  }

  // Mix, local step, launch the next exchange (see the header).
  absl::Status Update(size_t b) {
    at::NoGradGuard no_grad;
    Bucket& bucket = buckets_[b];
    if (bucket.work) {
      const absl::Time start = absl::Now();
      absl::Status s = bucket.work->Wait(Deadline());
      wait_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
      std::shared_ptr<Work> work = std::move(bucket.work);
      RETURN_IF_ERROR(s);
      bucket.received = true;
    }
    if (bucket.received) {
      bucket.received = false;
      // After a global average that was kept, the exchanged values are
      // stale: the parameters are already in consensus.
      if (!averaged_) {
        if (bucket.pair) {
          bucket.block.add_(bucket.recv).mul_(0.5);
        } else {
          bucket.block.copy_(bucket.recv);
        }
      }
    }
    if (spare()) return absl::OkStatus();  // nothing to mix, no gradients, no exchange
    std::vector<at::Tensor> members;
    for (size_t k : bucket.members) members.push_back(Param(k));
    if (options_.clip_norm > 0 && options_.clip_mode == DecentralizedOptions::Clip::kPerBucket) {
      ClipGradientNorm(members, options_.clip_norm);
    }
    if (lr_schedule_) {
      const double lr = lr_schedule_(step_);
      for (auto& group : bucket.optimizer->param_groups()) group.options().set_lr(lr);
    }
    try {
      bucket.optimizer->step();
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("dec:", options_.name, ": optimizer step of bucket ",
                                              b, " failed: ", e.what_without_backtrace()));
    }
    bucket.optimizer->zero_grad();
    Launch(b, step_ + 1);
    return absl::OkStatus();
  }

  // Starts bucket b's exchange with its group of step t.
  void Launch(size_t b, int64_t t) {
    Bucket& bucket = buckets_[b];
    const std::vector<int>& group = Group(t);
    const std::string tag = Tag(absl::StrCat("bucket", b));
    const int64_t bytes = static_cast<int64_t>(bucket.block.nbytes());
    if (group.size() == 1) return;
    if (group.size() == 2) {
      const int peer = group[0] == comm_.rank() ? group[1] : group[0];
      bucket.pair = true;
      bucket.work = comm_.SendRecv(bucket.block, peer, bucket.recv, peer, tag);
      bytes_sent_ += bytes;
      return;
    }
    bucket.pair = false;
    bucket.recv.copy_(bucket.block);
    Communicator* c = &comm_;
    if (static_cast<int>(group.size()) != comm_.size())
      c = groups_.at(absl::StrJoin(group, ",")).get();
    bucket.work = c->AllReduce(bucket.recv, ReduceOp::kAvg, tag);
    // A ring all-reduce sends 2 (k-1)/k of the data.
    bytes_sent_ +=
        2 * (static_cast<int64_t>(group.size()) - 1) * bytes / static_cast<int64_t>(group.size());
  }

  absl::Status FinishStep() {
    if (accumulating_) return absl::OkStatus();
    absl::Status status = error_;
    if (!laid_out_ && status.ok()) status = AdoptRankZeroOrder();
    if (status.ok() && Deferred() && options_.clip_norm > 0 &&
        options_.clip_mode == DecentralizedOptions::Clip::kGlobalNorm) {
      at::NoGradGuard no_grad;
      std::vector<at::Tensor> all;
      for (size_t k = 0; k < trained_.size(); ++k) all.push_back(Param(k));
      ClipGradientNorm(all, options_.clip_norm);
    }
    if (status.ok()) {
      // Parameters that got no gradient count as ready: their optimizer
      // skips them (or sees the zeros of an earlier zero_grad()).
      for (Bucket& bucket : buckets_) bucket.pending = 0;
      UpdateReady();
      status = error_;
    }
    std::fill(ready_.begin(), ready_.end(), 0);
    for (Bucket& bucket : buckets_) bucket.pending = bucket.members.size();
    next_ = 0;
    error_ = absl::OkStatus();
    averaged_ = false;
    ++step_;
    return status;
  }

  // Step 0's gradient-ready order of rank 0 becomes every rank's bucket
  // layout (Note [Bucket order] in sdk/distributed_data_parallel.h).
  absl::Status AdoptRankZeroOrder() {
    std::vector<size_t> order = order_;
    for (size_t k = trained_.size(); k-- > 0;) {
      if (!ready_[k]) order.push_back(k);
    }
    RETURN_IF_ERROR(BroadcastIndices(order, 0, comm_, Tag("bucket_order"), Deadline()));
    BuildBuckets(order);
    order_.clear();
    laid_out_ = true;
    return absl::OkStatus();
  }

  // Waits for every exchange in flight, keeping its result.
  absl::Status WaitAll() {
    absl::Status status;
    for (Bucket& bucket : buckets_) {
      if (!bucket.work) continue;
      absl::Status s = bucket.work->Wait(Deadline());
      if (status.ok() && !s.ok()) status = s;
    }
    return status;
  }

  std::vector<at::Tensor> FloatBuffers() const {
    std::vector<at::Tensor> out;
    if (!options_.average_buffers) return out;
    for (const NamedTensor& b : buffers_) {
      if (at::isFloatingType(b.tensor.scalar_type())) out.push_back(b.tensor);
    }
    return out;
  }

  absl::Status GlobalAverage() {
    at::NoGradGuard no_grad;
    RETURN_IF_ERROR(WaitAll());
    if (!averaged_) {
      for (Bucket& bucket : buckets_) {
        if (!bucket.backup.defined()) bucket.backup = at::empty_like(bucket.block);
        bucket.backup.copy_(bucket.block);
      }
      const std::vector<at::Tensor> buffers = FloatBuffers();
      buffer_backup_.resize(buffers.size());
      for (size_t i = 0; i < buffers.size(); ++i) buffer_backup_[i] = buffers[i].clone();
    }
    for (size_t b = 0; b < buckets_.size(); ++b) {
      RETURN_IF_ERROR(
          AverageOfTrainers(buckets_[b].block, Tag(absl::StrCat("global_average/bucket", b))));
    }
    for (const at::Tensor& buffer : FloatBuffers()) {
      RETURN_IF_ERROR(AverageOfTrainers(buffer, Tag("global_average/buffers")));
    }
    averaged_ = true;
    return absl::OkStatus();
  }

  // Replaces `t` by the mean of the training ranks' values, on every rank.
  absl::Status AverageOfTrainers(const at::Tensor& t, const std::string& tag) {
    if (training_ == comm_.size()) return comm_.AllReduce(t, ReduceOp::kAvg, tag)->Wait(Deadline());
    at::Tensor target = t;  // a handle: zero_ and div_ act on the caller's tensor
    if (spare()) target.zero_();
    RETURN_IF_ERROR(comm_.AllReduce(target, ReduceOp::kSum, tag)->Wait(Deadline()));
    target.div_(training_);
    return absl::OkStatus();
  }

  absl::Status RevertGlobalAverage() {
    if (!averaged_) {
      return absl::FailedPreconditionError(
          absl::StrCat("dec:", options_.name, ": no global average to revert since the last step"));
    }
    at::NoGradGuard no_grad;
    if (spare()) {  // keeps the average: the newest model it can hold
      averaged_ = false;
      return absl::OkStatus();
    }
    for (Bucket& bucket : buckets_) bucket.block.copy_(bucket.backup);
    const std::vector<at::Tensor> buffers = FloatBuffers();
    for (size_t i = 0; i < buffers.size() && i < buffer_backup_.size(); ++i)
      buffers[i].copy_(buffer_backup_[i]);
    averaged_ = false;
    return absl::OkStatus();
  }

  absl::StatusOr<DecentralizedDataParallel::PendingExchange> TakePendingExchange() {
    at::NoGradGuard no_grad;
    DecentralizedDataParallel::PendingExchange out;
    for (Bucket& bucket : buckets_) {
      if (!bucket.work) continue;
      const absl::Time start = absl::Now();
      absl::Status s = bucket.work->Wait(Deadline());
      wait_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
      bucket.work.reset();
      RETURN_IF_ERROR(s);
      bucket.received = true;
    }
    if (averaged_) return out;  // the next step mixes nothing
    const std::vector<at::Tensor> received = ReceivedByParam(&out.pair);
    for (size_t k = 0; k < received.size(); ++k) {
      if (received[k].defined()) out.received.push_back({params_[trained_[k]].name, received[k]});
    }
    return out;
  }

  absl::Status RestorePendingExchange(const DecentralizedDataParallel::PendingExchange& pending) {
    at::NoGradGuard no_grad;
    for (const Bucket& bucket : buckets_) {
      if (bucket.work) {
        return absl::FailedPreconditionError(absl::StrCat(
            "dec:", options_.name, ": cannot restore an exchange while one is in flight"));
      }
    }
    std::map<std::string, size_t> index;
    for (size_t k = 0; k < trained_.size(); ++k) index[params_[trained_[k]].name] = k;
    std::vector<at::Tensor> received(trained_.size());
    for (const NamedTensor& r : pending.received) {
      auto it = index.find(r.name);
      if (it == index.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("dec:", options_.name, ": the saved exchange names parameter '", r.name,
                         "', which this model does not train"));
      }
      const at::Tensor& p = Param(it->second);
      if (r.tensor.sizes() != p.sizes() || r.tensor.scalar_type() != p.scalar_type()) {
        return absl::InvalidArgumentError(
            absl::StrCat("dec:", options_.name, ": the saved exchange of '", r.name, "' is ",
                         c10::str(r.tensor.sizes()), ", the parameter ", c10::str(p.sizes())));
      }
      received[it->second] = r.tensor;
    }
    SetReceived(received, pending.pair);
    return absl::OkStatus();
  }

  absl::Status BroadcastParameters(int root) {
    RETURN_IF_ERROR(WaitAll());
    for (Bucket& bucket : buckets_) {
      bucket.work.reset();
      bucket.received = false;
    }
    std::vector<at::Tensor> all;
    for (const NamedTensor& p : params_) all.push_back(p.tensor);
    for (const NamedTensor& b : buffers_) all.push_back(b.tensor);
    return BroadcastCoalesced(all, root, comm_, Tag("broadcast_parameters"), Deadline());
  }

  std::vector<NamedTensor> params_;
  std::vector<NamedTensor> buffers_;
  Communicator& comm_;
  OptimizerFactory make_optimizer_;
  LrSchedule lr_schedule_;
  const DecentralizedOptions options_;
  const Topology topology_;
  const int training_;  // ranks that train (Note [Hot spares])
  const std::vector<int> self_group_;
  std::map<std::string, std::shared_ptr<Communicator>> groups_;  // by "r1,r2,..."
  std::vector<size_t> trained_;                                  // params_ with requires_grad
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // trained index -> bucket
  std::unique_ptr<GradientReadyHooks> hooks_;
  std::vector<at::Tensor> buffer_backup_;

  // Per step.
  std::vector<char> ready_;
  std::vector<size_t> order_;  // first step: gradient-ready order
  bool laid_out_ = false;      // buckets follow rank 0's gradient-ready order
  size_t next_ = 0;            // next bucket to update
  absl::Status error_;
  bool accumulating_ = false;
  bool averaged_ = false;

  int64_t step_ = 0;
  int64_t bytes_sent_ = 0;
  double wait_seconds_ = 0;
};

absl::StatusOr<std::unique_ptr<DecentralizedDataParallel>> DecentralizedDataParallel::Create(
    std::vector<NamedTensor> parameters, std::vector<NamedTensor> buffers, Communicator& comm,
    OptimizerFactory make_optimizer, LrSchedule lr_schedule, DecentralizedOptions options) {
  if (!(options.bucket_cap_mb > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("decentralized: bucket_cap_mb must be > 0, got ", options.bucket_cap_mb));
  }
  if (!make_optimizer)
    return absl::InvalidArgumentError("decentralized: an optimizer factory is required");
  if (options.training_ranks < 0 || options.training_ranks > comm.size()) {
    return absl::InvalidArgumentError(absl::StrCat("decentralized: training_ranks must be in [0, ",
                                                   comm.size(), "], got ", options.training_ranks));
  }
  const int training = options.training_ranks > 0 ? options.training_ranks : comm.size();
  ASSIGN_OR_RETURN(Topology topology, Topology::Create(options.topology, training));
  // A parameter shared by two submodules lives in one bucket slot.
  parameters = WithoutRepeatedTensors(std::move(parameters));
  buffers = WithoutRepeatedTensors(std::move(buffers));
  for (const NamedTensor& p : parameters) {
    if (!p.tensor.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("decentralized: parameter '", p.name, "' is undefined"));
    }
    if (p.tensor.requires_grad() && !p.tensor.is_contiguous()) {
      return absl::InvalidArgumentError(
          absl::StrCat("decentralized: parameter '", p.name,
                       "' is not contiguous (e.g. channels_last); bucket blocks need "
                       "contiguous parameters"));
    }
  }
  auto impl = std::make_unique<Impl>(std::move(parameters), std::move(buffers), comm,
                                     std::move(make_optimizer), std::move(lr_schedule),
                                     std::move(options), std::move(topology));
  for (size_t i = 0; i < impl->params_.size(); ++i) {
    if (impl->params_[i].tensor.requires_grad()) impl->trained_.push_back(i);
  }
  std::vector<NamedTensor> all = impl->params_;
  all.insert(all.end(), impl->buffers_.begin(), impl->buffers_.end());
  RETURN_IF_ERROR(
      CheckReplicasAgree(all, comm, absl::StrCat("dec:", impl->options_.name), impl->Deadline()));
  RETURN_IF_ERROR(impl->MakeGroups());
  // Reverse declaration order until the first step has shown the real one.
  std::vector<size_t> order(impl->trained_.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = order.size() - 1 - k;
  if (!order.empty()) impl->BuildBuckets(order);
  impl->ready_.assign(impl->trained_.size(), 0);
  std::vector<at::Tensor> tensors;
  for (size_t k = 0; k < impl->trained_.size(); ++k) tensors.push_back(impl->Param(k));
  Impl* raw = impl.get();
  impl->hooks_ =
      std::make_unique<GradientReadyHooks>(tensors, [raw](size_t k) { raw->MarkReady(k); });
  return std::unique_ptr<DecentralizedDataParallel>(new DecentralizedDataParallel(std::move(impl)));
}

DecentralizedDataParallel::DecentralizedDataParallel(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

DecentralizedDataParallel::~DecentralizedDataParallel() {
  // Peers expect the exchanges in flight to complete; a broken communicator
  // fails them at once.
  for (auto& bucket : impl_->buckets_) {
    if (bucket.work)
      bucket.work->Wait(absl::Now() + std::min(impl_->options_.timeout, absl::Seconds(30)))
          .IgnoreError();
  }
}

absl::Status DecentralizedDataParallel::BroadcastParameters(int root) {
  return impl_->BroadcastParameters(root);
}

absl::Status DecentralizedDataParallel::FinishStep() { return impl_->FinishStep(); }

bool DecentralizedDataParallel::spare() const { return impl_->spare(); }

absl::Status DecentralizedDataParallel::GlobalAverage() { return impl_->GlobalAverage(); }

absl::Status DecentralizedDataParallel::RevertGlobalAverage() {
  return impl_->RevertGlobalAverage();
}

DecentralizedDataParallel::AccumulateScope::AccumulateScope(DecentralizedDataParallel& engine)
    : engine_(engine), previous_(engine.impl_->accumulating_) {
  engine_.impl_->accumulating_ = true;
}

DecentralizedDataParallel::AccumulateScope::~AccumulateScope() {
  engine_.impl_->accumulating_ = previous_;
}

int64_t DecentralizedDataParallel::step() const { return impl_->step_; }

void DecentralizedDataParallel::SetStep(int64_t step) { impl_->step_ = step; }

size_t DecentralizedDataParallel::bucket_count() const { return impl_->buckets_.size(); }

std::vector<std::string> DecentralizedDataParallel::bucket_parameters(size_t b) const {
  std::vector<std::string> names;
  for (size_t k : impl_->buckets_.at(b).members)
    names.push_back(impl_->params_[impl_->trained_[k]].name);
  return names;
}

std::vector<torch::optim::Optimizer*> DecentralizedDataParallel::optimizers() const {
  std::vector<torch::optim::Optimizer*> out;
  for (const auto& bucket : impl_->buckets_) out.push_back(bucket.optimizer.get());
  return out;
}

absl::StatusOr<DecentralizedDataParallel::PendingExchange>
DecentralizedDataParallel::TakePendingExchange() {
  return impl_->TakePendingExchange();
}

absl::Status DecentralizedDataParallel::RestorePendingExchange(const PendingExchange& pending) {
  return impl_->RestorePendingExchange(pending);
}

int64_t DecentralizedDataParallel::bytes_sent() const { return impl_->bytes_sent_; }

double DecentralizedDataParallel::exchange_wait_seconds() const { return impl_->wait_seconds_; }

}  // namespace chorus
