#include "worker/train/decentralized_strategy.h"

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <algorithm>
#include <utility>

#include "chorus/decentralized_data_parallel.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "worker/train/optimizer.h"

namespace chorus {
namespace {

class DecentralizedStrategy final : public TrainingStrategy {
 public:
  DecentralizedStrategy(const v1::JobSpec& spec, Communicator& comm, TrainingProgress& progress)
      : spec_(spec), comm_(comm), progress_(progress) {}

  // Builds the engine over `model`; its LR schedule reads total_steps_.
  absl::Status Start(Model& model) {
    const v1::DecentralizedStrategy& d = spec_.strategy().decentralized();
    DecentralizedOptions options;
    options.topology = TopologyFromSpec(d);
    options.bucket_cap_mb = d.bucket_cap_mb();
    options.clip_norm = spec_.grad_clip_norm();
    options.clip_mode = d.clip_mode() == v1::DecentralizedStrategy::PER_BUCKET
                            ? DecentralizedOptions::Clip::kPerBucket
                            : DecentralizedOptions::Clip::kGlobalNorm;
    options.average_buffers = true;
    ASSIGN_OR_RETURN(options.training_ranks, TrainingRanks(spec_, comm_.size()));
    ASSIGN_OR_RETURN(
        engine_,
        DecentralizedDataParallel::Create(
            model.NamedParameters(), model.NamedBuffers(), comm_,
            [this](const std::vector<at::Tensor>& params) {
              return BuildOptimizer(spec_.optimizer(), params);
            },
            [this](int64_t step) { return LearningRate(spec_, step, total_steps_); }, options));
    return engine_->BroadcastParameters(0);
  }

  int accumulation_steps() const override { return 1; }
  void set_total_steps(int64_t total_steps) override { total_steps_ = total_steps; }
  bool replicas_identical() const override { return false; }
  // No backward: the engine's step updates nothing and exchanges nothing
  // for a spare, and takes part in the first step's layout broadcast.
  absl::Status SpareStep() override {
    progress_.Enter(v1::OPTIMIZER);
    return engine_->FinishStep();
  }
  // The engine replaces its optimizers once, after step 0: ask every time.
  std::vector<torch::optim::Optimizer*> optimizers() const override {
    return engine_->optimizers();
  }

  absl::Status Resume(int64_t step, ExchangeState exchange) override {
    engine_->SetStep(step);
    if (exchange.received.empty()) return absl::OkStatus();
    return engine_->RestorePendingExchange({exchange.pair, std::move(exchange.received)});
  }

  // The engine zeroes the gradients after its own steps.
  void BeginStep() override {}
  absl::Status BeforeForward() override { return absl::OkStatus(); }

  absl::StatusOr<double> Backward(const at::Tensor& loss, bool last_micro_batch) override {
    if (!last_micro_batch) {
      auto accumulate = engine_->Accumulate();
      loss.backward();
      return 0.0;
    }
    // Buckets mix, step and launch their exchanges from the hooks.
    const double waited = engine_->exchange_wait_seconds();
    loss.backward();
    progress_.Enter(v1::OPTIMIZER);
    RETURN_IF_ERROR(engine_->FinishStep());
    return engine_->exchange_wait_seconds() - waited;
  }

  absl::Status Step(int64_t step) override {
    const int64_t every = spec_.strategy().decentralized().global_average_every_steps();
    if (every <= 0 || (step + 1) % every != 0) return absl::OkStatus();
    progress_.Enter(v1::COLLECTIVE);
    return engine_->GlobalAverage();  // kept: the ranks restart from consensus
  }

  absl::Status WithGlobalAverage(const std::function<absl::Status()>& body) override {
    if (final_average_) return body();
    RETURN_IF_ERROR(engine_->GlobalAverage());
    absl::Status status = body();
    absl::Status revert = engine_->RevertGlobalAverage();
    return status.ok() ? revert : status;
  }

  // The final model of decentralized training is the global average.
  absl::Status Finish() override {
    RETURN_IF_ERROR(engine_->GlobalAverage());
    final_average_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<int64_t>> AgreedCheckpointRequests(int64_t step,
                                                                  int64_t seen) override {
    if (step % kCheckpointRequestCheckSteps != 0) return std::optional<int64_t>();
    at::Tensor newest =
        at::full({1}, seen, at::TensorOptions().dtype(at::kLong).device(comm_.device()));
    RETURN_IF_ERROR(comm_.AllReduce(newest, ReduceOp::kMax, "checkpoint/request")
                        ->Wait(absl::Now() + absl::Minutes(5)));
    return std::optional<int64_t>(newest.item<int64_t>());
  }

  CheckpointParts checkpoint_parts() const override {
    CheckpointParts parts;
    parts.per_rank = spec_.checkpoint().per_rank();
    parts.every_rank_joins = true;
    return parts;
  }

  absl::StatusOr<ExchangeState> TakeExchangeForCheckpoint() override {
    ASSIGN_OR_RETURN(DecentralizedDataParallel::PendingExchange pending,
                     engine_->TakePendingExchange());
    return ExchangeState{pending.pair, std::move(pending.received)};
  }

  void AddMetrics(const MetricsWindow::Summary& window, v1::Metrics& metrics) const override {
    auto& values = *metrics.mutable_values();
    values["exchange_bytes_per_step"] =
        engine_->bytes_sent() / std::max<int64_t>(1, engine_->step());
    values["exchange_wait_seconds_per_step"] = window.wait_seconds;
  }

 private:
  const v1::JobSpec spec_;
  Communicator& comm_;
  TrainingProgress& progress_;
  std::unique_ptr<DecentralizedDataParallel> engine_;
  int64_t total_steps_ = 0;
  // Set once the final model is the kept global average.
  bool final_average_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingStrategy>> CreateDecentralizedStrategy(
    const v1::JobSpec& spec, Model& model, Communicator& comm, TrainingProgress& progress) {
  auto strategy = std::make_unique<DecentralizedStrategy>(spec, comm, progress);
  RETURN_IF_ERROR(strategy->Start(model));
  return std::unique_ptr<TrainingStrategy>(std::move(strategy));
}

}  // namespace chorus
