#include "worker/train/ddp_strategy.h"

#include <torch/optim/optimizer.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "chorus/distributed_data_parallel.h"
#include "common/status_macros.h"
#include "worker/replica/gradient_clipping.h"
#include "worker/train/optimizer.h"

namespace chorus {
namespace {

DdpOptions OptionsFromSpec(const v1::DdpStrategy& d) {
  DdpOptions options;
  options.bucket_cap_mb = d.bucket_cap_mb();
  options.first_bucket_mb = d.first_bucket_mb();
  // On by default (NormalizeJobSpec): the trainer reads gradients only after
  // FinishGradientSync() (Note [Gradients as bucket views]).
  options.gradient_as_bucket_view = d.gradient_as_bucket_view();
  options.find_unused_parameters = d.find_unused_parameters();
  options.broadcast_buffers = d.broadcast_buffers();
  options.ignored.assign(d.ignored().begin(), d.ignored().end());
  options.compression = d.compression() == v1::DdpStrategy::FP16   ? DdpOptions::Compression::kFp16
                        : d.compression() == v1::DdpStrategy::BF16 ? DdpOptions::Compression::kBf16
                                                                   : DdpOptions::Compression::kNone;
  return options;
}

class DdpStrategy final : public TrainingStrategy {
 public:
  DdpStrategy(const v1::JobSpec& spec, Model& model, Communicator& comm, TrainingProgress& progress,
              std::unique_ptr<DistributedDataParallel> ddp,
              std::unique_ptr<torch::optim::Optimizer> optimizer)
      : spec_(spec),
        model_(model),
        comm_(comm),
        progress_(progress),
        ddp_(std::move(ddp)),
        optimizer_(std::move(optimizer)) {}

  int accumulation_steps() const override { return spec_.strategy().ddp().grad_accum_steps(); }
  void set_total_steps(int64_t total_steps) override { total_steps_ = total_steps; }
  std::vector<torch::optim::Optimizer*> optimizers() const override { return {optimizer_.get()}; }
  bool replicas_identical() const override { return true; }
  absl::Status SpareStep() override {
    return absl::FailedPreconditionError("DDP has no spare ranks: every rank trains");
  }
  absl::Status Resume(int64_t /*step*/, ExchangeState /*exchange*/) override {
    return absl::OkStatus();
  }

  void BeginStep() override { optimizer_->zero_grad(); }
  absl::Status BeforeForward() override { return ddp_->PrepareForBackward(); }

  absl::StatusOr<double> Backward(const at::Tensor& loss, bool last_micro_batch) override {
    if (!last_micro_batch) {
      auto no_sync = ddp_->NoSync();
      loss.backward();
      return 0.0;
    }
    loss.backward();
    progress_.Enter(v1::COLLECTIVE);
    const absl::Time wait_start = absl::Now();
    RETURN_IF_ERROR(ddp_->FinishGradientSync());
    return absl::ToDoubleSeconds(absl::Now() - wait_start);
  }

  absl::Status Step(int64_t step) override {
    if (spec_.grad_clip_norm() > 0) ClipGradientNorm(model_.Parameters(), spec_.grad_clip_norm());
    progress_.Enter(v1::OPTIMIZER);
    const double lr = LearningRate(spec_, step, total_steps_);
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
    optimizer_->step();
    return absl::OkStatus();
  }

  // Every replica is the same model.
  absl::Status WithGlobalAverage(const std::function<absl::Status()>& body) override {
    return body();
  }
  absl::Status Finish() override { return absl::OkStatus(); }

  absl::StatusOr<std::optional<int64_t>> AgreedCheckpointRequests(int64_t /*step*/,
                                                                  int64_t seen) override {
    if (comm_.rank() != 0) return std::optional<int64_t>();
    return std::optional<int64_t>(seen);
  }
  CheckpointParts checkpoint_parts() const override { return CheckpointParts{}; }
  absl::StatusOr<ExchangeState> TakeExchangeForCheckpoint() override { return ExchangeState{}; }
  void AddMetrics(const MetricsWindow::Summary& /*window*/,
                  v1::Metrics& /*metrics*/) const override {}

 private:
  const v1::JobSpec spec_;
  Model& model_;
  Communicator& comm_;
  TrainingProgress& progress_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  int64_t total_steps_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingStrategy>> CreateDdpStrategy(const v1::JobSpec& spec,
                                                                    Model& model,
                                                                    Communicator& comm,
                                                                    TrainingProgress& progress) {
  const v1::DdpStrategy& d = spec.strategy().ddp();
  if (d.grad_accum_steps() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec: strategy.ddp.grad_accum_steps must be >= 1, got ", d.grad_accum_steps()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DistributedDataParallel> ddp,
                   DistributedDataParallel::Create(model.NamedParameters(), model.NamedBuffers(),
                                                   comm, OptionsFromSpec(d)));
  RETURN_IF_ERROR(ddp->BroadcastParameters(0));
  std::unique_ptr<torch::optim::Optimizer> optimizer =
      BuildOptimizer(spec.optimizer(), model.Parameters());
  return std::make_unique<DdpStrategy>(spec, model, comm, progress, std::move(ddp),
                                       std::move(optimizer));
}

}  // namespace chorus
