#include "worker/train/trainer.h"

#include <csignal>
#include <cmath>
#include <cstdlib>
#include <future>
#include <iostream>
#include <memory>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "worker/ddp/distributed_data_parallel.h"
#include "worker/decentralized/decentralized_data_parallel.h"
#include "worker/replica/gradient_clipping.h"
#include "worker/train/accum_adam.h"
#include "worker/train/checkpoint.h"
#include "worker/train/data.h"
#include "worker/train/model.h"
#include "worker/train/sampler.h"

namespace chorus {
namespace {

std::unique_ptr<torch::optim::Optimizer> BuildOptimizer(const v1::OptimizerSpec& o,
                                                        const std::vector<torch::Tensor>& params) {
  switch (o.kind()) {
    case v1::OptimizerSpec::ADAM:
      return std::make_unique<torch::optim::Adam>(
          params, torch::optim::AdamOptions(o.lr()).betas({o.beta1(), o.beta2()}).eps(o.eps())
                      .weight_decay(o.weight_decay()));
    case v1::OptimizerSpec::ACCUM_ADAM:
    case v1::OptimizerSpec::ACCUM_ADAMW:
      return std::make_unique<AccumAdam>(
          params, AccumAdamOptions(o.lr()).betas({o.beta1(), o.beta2()}).eps(o.eps()).weight_decay(o.weight_decay())
                      .decoupled_weight_decay(o.kind() == v1::OptimizerSpec::ACCUM_ADAMW).accum_iter(o.accum_iter()));
    case v1::OptimizerSpec::ADAMW:
      return std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(o.lr()).betas({o.beta1(), o.beta2()}).eps(o.eps())
                      .weight_decay(o.weight_decay()));
    default:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(o.lr()).momentum(o.momentum()).nesterov(o.nesterov())
                      .weight_decay(o.weight_decay()));
  }
}

double LearningRate(const v1::JobSpec& spec, int64_t step, int64_t total_steps) {
  const double lr = spec.optimizer().lr();
  const v1::LrScheduleSpec& s = spec.lr_schedule();
  if (s.has_cosine()) {
    const int64_t warmup = s.cosine().warmup_steps();
    const int64_t total = s.cosine().total_steps() > 0 ? s.cosine().total_steps() : total_steps;
    if (step < warmup) return lr * (step + 1) / static_cast<double>(warmup);
    const double progress = std::min(1.0, (step - warmup) / std::max(1.0, double(total - warmup)));
    const double floor = s.cosine().min_lr_ratio();
    return lr * (floor + (1 - floor) * 0.5 * (1 + std::cos(M_PI * progress)));
  }
  if (s.has_step()) return lr * std::pow(s.step().gamma(), step / s.step().step_size());
  return lr;
}

// Mean loss per target element. Token models give [B, T, V] logits for
// [B, T] targets; they are flattened to B*T predictions.
torch::Tensor Loss(const v1::JobSpec& spec, const torch::Tensor& out, const torch::Tensor& y) {
  if (spec.loss().kind() == v1::LossSpec::MSE) {
    return torch::mse_loss(out.reshape(y.sizes()), y);
  }
  const bool sequence = out.dim() > 2 && out.dim() == y.dim() + 1;
  return torch::nn::functional::cross_entropy(
      sequence ? out.reshape({-1, out.size(-1)}) : out, sequence ? y.reshape({-1}) : y,
      torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(spec.loss().label_smoothing()));
}

// Loss and accuracy of the model on `test`, each rank taking a contiguous
// share, summed across ranks.
absl::Status Evaluate(const v1::JobSpec& spec, Model& model, const Dataset& test,
                      Communicator& comm, v1::Metrics& metrics) {
  torch::NoGradGuard no_grad;
  model.SetTraining(false);
  const int64_t n = test.size();
  const int64_t begin = n * comm.rank() / comm.size();
  const int64_t end = n * (comm.rank() + 1) / comm.size();
  int64_t limit = spec.eval().max_batches() > 0 ? spec.eval().max_batches() * spec.training().batch_size_per_rank() : end - begin;
  at::Tensor sums = at::zeros({3}, at::kDouble);  // loss sum, correct, target elements
  const int64_t batch = std::max<int64_t>(256, spec.training().batch_size_per_rank());
  for (int64_t i = begin; i < std::min(end, begin + limit); i += batch) {
    const int64_t len = std::min({batch, end - i, begin + limit - i});
    torch::Tensor x = test.x.narrow(0, i, len);
    torch::Tensor y = test.y.narrow(0, i, len);
    ASSIGN_OR_RETURN(torch::Tensor out, model.Forward(x));
    sums[0] += Loss(spec, out, y).item<double>() * y.numel();
    if (test.num_classes > 0) sums[1] += out.argmax(-1).reshape(y.sizes()).eq(y).sum().item<double>();
    sums[2] += y.numel();
  }
  model.SetTraining(true);
  RETURN_IF_ERROR(comm.AllReduce(sums, ReduceOp::kSum, "eval/metrics")->Wait(absl::Now() + absl::Minutes(5)));
  const double count = std::max(1.0, sums[2].item<double>());
  metrics.set_eval_loss(sums[0].item<double>() / count);
  metrics.set_eval_accuracy(sums[1].item<double>() / count);
  return absl::OkStatus();
}

// Deliberate failures from spec.fault_injection for this rank at this step
// (first generation only). HANG and SLOW sleep in the DATA phase, before the
// step's collectives, so the other ranks wait for this one. SKIP_COLLECTIVE
// and MISMATCH_COLLECTIVE add collectives at the fault's step on every rank
// (every rank knows the spec) and make the faulty rank leave one out or swap
// two.
// Every fault announces itself on stderr with the wall-clock time it happens
// (unix microseconds), so tests and benchmarks can time the detection.
void Announce(int rank, int64_t step, const std::string& what) {
  std::cerr << "fault injection: rank " << rank << " " << what << " at step " << step << " (unix_us "
            << absl::ToUnixMicros(absl::Now()) << ")" << std::endl;
}

absl::Status InjectFaults(const v1::JobSpec& spec, Communicator& comm, int64_t step, TrainingProgress& p) {
  const int rank = comm.rank();
  const absl::Time deadline = absl::Now() + absl::Hours(1);
  for (const v1::Fault& f : spec.fault_injection().faults()) {
    if (f.generation() != 0) continue;
    const bool now = step == f.at_step();
    const bool mine = f.rank() == rank;
    switch (f.kind()) {
      case v1::Fault::EXIT:
        if (now && mine) {
          Announce(rank, step, absl::StrCat("exits with code ", f.exit_code()));
          std::_Exit(f.exit_code());
        }
        break;
      case v1::Fault::CRASH:
        if (now && mine) {
          Announce(rank, step, "kills itself (SIGKILL)");
          raise(SIGKILL);
        }
        break;
      case v1::Fault::STOP:
        if (now && mine) {
          Announce(rank, step, "stops itself (SIGSTOP)");
          raise(SIGSTOP);
        }
        break;
      case v1::Fault::HANG:
      case v1::Fault::SLOW:
        if (mine && (now || (f.kind() == v1::Fault::SLOW && step > f.at_step()))) {
          if (now) Announce(rank, step, absl::StrCat(f.kind() == v1::Fault::HANG ? "hangs" : "slows down", " for ",
                                                     f.duration_seconds(), " s"));
          p.Enter(v1::DATA);
          absl::SleepFor(absl::Seconds(f.duration_seconds()));
        }
        break;
      case v1::Fault::SKIP_COLLECTIVE:
        if (!now) break;
        if (mine) {
          Announce(rank, step, "skips collective fault/skipped");
          p.Enter(v1::DATA);
          absl::SleepFor(absl::Seconds(f.duration_seconds()));
        } else {
          p.Enter(v1::COLLECTIVE);
          RETURN_IF_ERROR(comm.AllReduce(torch::ones({1}), ReduceOp::kSum, "fault/skipped")->Wait(deadline));
        }
        break;
      case v1::Fault::MISMATCH_COLLECTIVE: {
        if (!now) break;
        if (mine) Announce(rank, step, "swaps fault/first and fault/second");
        p.Enter(v1::COLLECTIVE);
        torch::Tensor first = torch::ones({4});
        torch::Tensor second = torch::ones({8});
        std::shared_ptr<Work> a, b;
        if (mine) {
          b = comm.AllReduce(second, ReduceOp::kSum, "fault/second");
          a = comm.AllReduce(first, ReduceOp::kSum, "fault/first");
        } else {
          a = comm.AllReduce(first, ReduceOp::kSum, "fault/first");
          b = comm.AllReduce(second, ReduceOp::kSum, "fault/second");
        }
        RETURN_IF_ERROR(a->Wait(deadline));
        RETURN_IF_ERROR(b->Wait(deadline));
        break;
      }
      default:
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace

void TrainingProgress::Enter(v1::Phase p) {
  phase.store(p);
  phase_since_us.store(absl::ToUnixMicros(absl::Now()));
}

absl::StatusOr<v1::Metrics> Train(const v1::JobSpec& spec, Communicator& comm,
                                  const MetricsCallback& report, TrainingProgress* progress,
                                  const TrainOptions& options) {
  TrainingProgress unused;
  TrainingProgress& p = progress != nullptr ? *progress : unused;
  p.Enter(v1::SETUP);
  RETURN_IF_ERROR(CheckRuntimeSupport(spec));
  at::set_num_threads(spec.resources().threads_per_rank());
  ASSIGN_OR_RETURN(Dataset train, LoadDataset(spec, Split::kTrain));
  ASSIGN_OR_RETURN(Dataset test, LoadDataset(spec, Split::kTest));
  torch::manual_seed(spec.training().seed());
  if (!spec.model().has_transformer_lm() && !spec.model().has_torchscript() &&
      !at::isFloatingType(train.x.scalar_type())) {
    train.x = train.x.to(at::kFloat);
    if (test.size() > 0) test.x = test.x.to(at::kFloat);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Build(spec.model(), train));

  // The strategy: DDP (one optimizer, gradients averaged) or decentralized
  // (per-bucket optimizers stepped by the engine, parameters gossiped).
  int64_t total_steps = 0;
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<DecentralizedDataParallel> gossip;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  // The decentralized engine replaces its optimizers once, after step 0.
  auto optimizers = [&] {
    return gossip ? gossip->optimizers() : std::vector<torch::optim::Optimizer*>{optimizer.get()};
  };
  const v1::DdpStrategy& ddp_spec = spec.strategy().ddp();
  if (spec.strategy().has_decentralized()) {
    const v1::DecentralizedStrategy& d = spec.strategy().decentralized();
    DecentralizedOptions options;
    options.topology = TopologyFromSpec(d);
    options.bucket_cap_mb = d.bucket_cap_mb();
    options.clip_norm = spec.grad_clip_norm();
    options.clip_mode = d.clip_mode() == v1::DecentralizedStrategy::PER_BUCKET ? DecentralizedOptions::Clip::kPerBucket
                                                                              : DecentralizedOptions::Clip::kGlobalNorm;
    options.average_buffers = true;
    ASSIGN_OR_RETURN(gossip, DecentralizedDataParallel::Create(
                                 model->NamedParameters(), model->NamedBuffers(), comm,
                                 [&spec](const std::vector<at::Tensor>& params) { return BuildOptimizer(spec.optimizer(), params); },
                                 [&spec, &total_steps](int64_t step) { return LearningRate(spec, step, total_steps); },
                                 options));
    RETURN_IF_ERROR(gossip->BroadcastParameters(0));
  } else {
    DdpOptions ddp_options;
    ddp_options.bucket_cap_mb = ddp_spec.bucket_cap_mb();
    ddp_options.first_bucket_mb = ddp_spec.first_bucket_mb();
    ddp_options.gradient_as_bucket_view = ddp_spec.gradient_as_bucket_view();
    ddp_options.find_unused_parameters = ddp_spec.find_unused_parameters();
    ddp_options.broadcast_buffers = ddp_spec.broadcast_buffers();
    ddp_options.ignored.assign(ddp_spec.ignored().begin(), ddp_spec.ignored().end());
    ddp_options.compression = ddp_spec.compression() == v1::DdpStrategy::FP16   ? DdpOptions::Compression::kFp16
                          : ddp_spec.compression() == v1::DdpStrategy::BF16 ? DdpOptions::Compression::kBf16
                                                                              : DdpOptions::Compression::kNone;
    ASSIGN_OR_RETURN(ddp, DistributedDataParallel::Create(model->NamedParameters(), model->NamedBuffers(), comm,
                                                          ddp_options));
    RETURN_IF_ERROR(ddp->BroadcastParameters(0));
    optimizer = BuildOptimizer(spec.optimizer(), model->Parameters());
  }
  // Evaluation and checkpoints of decentralized training see the global
  // average; the ranks' own models come back afterwards.
  bool final_average = false;  // set once the final model is the kept global average
  auto with_global_average = [&](const std::function<absl::Status()>& body) -> absl::Status {
    if (!gossip || final_average) return body();
    RETURN_IF_ERROR(gossip->GlobalAverage());
    absl::Status status = body();
    absl::Status revert = gossip->RevertGlobalAverage();
    return status.ok() ? revert : status;
  };

  SamplerOptions sampler{train.size(), comm.size(), comm.rank(), spec.training().batch_size_per_rank(),
                         spec.training().seed(), spec.training().shuffle(),
                         spec.data().remainder() == v1::DataSpec::PAD};
  const int64_t batches = BatchesPerEpoch(sampler);
  if (batches == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training split has ", train.size(), " samples, fewer than one global batch (",
        comm.size(), " ranks x training.batch_size_per_rank ", sampler.batch_size, ")"));
  }
  const int accum = ddp ? ddp_spec.grad_accum_steps() : 1;
  const int64_t steps_per_epoch = batches / accum;
  const int64_t global_batch = sampler.batch_size * comm.size();

  // Where training starts: from scratch, or from a checkpoint (possibly
  // written by another number of ranks: the sampler re-shards the rest of
  // its epoch).
  TrainingPosition position;
  position.world_size = comm.size();
  if (!options.resume.job_id().empty()) {
    if (options.checkpoints == nullptr) return absl::FailedPreconditionError("resuming needs a checkpoint source");
    p.Enter(v1::CHECKPOINT);
    // A per-rank checkpoint: each rank loads its own part when the world
    // size is the same (with the exchange it had received: an exact
    // continuation), else rank r loads part r mod (saved ranks).
    v1::CheckpointManifest part = options.resume;
    int source = 0;
    bool own = false;
    if (part.per_rank()) {
      const int saved = std::max(1, part.world_size());
      source = comm.rank() % saved;
      own = saved == comm.size();
      part.clear_files();
      for (const v1::CheckpointFile& f : options.resume.files()) {
        if (f.name() == ModelFileName(source) || f.name() == TrainStateFileName(source)) *part.add_files() = f;
      }
    }
    ASSIGN_OR_RETURN(std::vector<CheckpointFileData> files, options.checkpoints->Load(part));
    for (CheckpointFileData& f : files) {
      if (f.name == ModelFileName(source)) f.name = kModelFile;
      if (f.name == TrainStateFileName(source)) f.name = kTrainStateFile;
    }
    ExchangeState exchange;
    ASSIGN_OR_RETURN(position, Restore(files, *model, optimizers(), &exchange));
    position.world_size = comm.size();
    if (gossip) {
      gossip->SetStep(position.step);
      if (own && !exchange.received.empty()) {
        RETURN_IF_ERROR(gossip->RestorePendingExchange({exchange.pair, std::move(exchange.received)}));
      }
    }
  }
  // Steps left: the rest of the current epoch, then whole epochs.
  SamplerOptions first = sampler;
  first.start = position.epoch_offset;
  if (spec.training().epochs() > 0) {
    const int64_t epochs_left = spec.training().epochs() - position.epoch;
    total_steps = position.step + (epochs_left > 0 ? BatchesPerEpoch(first) / accum + (epochs_left - 1) * steps_per_epoch : 0);
  }
  if (spec.training().max_steps() > 0) {
    total_steps = total_steps > 0 ? std::min(total_steps, spec.training().max_steps()) : spec.training().max_steps();
  }
  const v1::CheckpointSpec& ckpt = spec.checkpoint();
  // checkpoint.per_rank: every decentralized rank stores its own model.
  const bool per_rank = gossip != nullptr && ckpt.per_rank();
  std::unique_ptr<CheckpointWriter> writer;
  if (options.checkpoints != nullptr && (comm.rank() == 0 || per_rank)) {
    writer = std::make_unique<CheckpointWriter>(*options.checkpoints);
  }
  double checkpoint_stall = 0;
  // The previous snapshot's memory is reused once the writer is done with it.
  Snapshot spare;
  // Memory for the first snapshot, allocated on another thread after the
  // first step (with periodic checkpoints): the first one then stalls only
  // for the copy, as the later ones do.
  std::future<Snapshot> first_spare;
  bool first_spare_started = false;
  auto take_first_spare = [&] {
    if (first_spare.valid()) spare = first_spare.get();
  };
  // `force` (the final checkpoint, or one asked for): waits for an upload
  // still running instead of skipping.
  auto checkpoint_own_models = [&](bool final, bool force) -> absl::Status {
    p.Enter(v1::CHECKPOINT);
    if (final || force) RETURN_IF_ERROR(writer->Drain());
    // Every rank takes it or none does (a part missing would leave the
    // checkpoint incomplete): skipped if any rank is still uploading.
    at::Tensor busy = at::full({1}, writer->busy() ? 1 : 0, at::kInt);
    RETURN_IF_ERROR(comm.AllReduce(busy, ReduceOp::kMax, "checkpoint/busy")->Wait(absl::Now() + absl::Minutes(5)));
    if (busy.item<int>() != 0) {
      writer->NoteSkipped();
      return absl::OkStatus();
    }
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(DecentralizedDataParallel::PendingExchange pending, gossip->TakePendingExchange());
    const ExchangeState exchange{pending.pair, std::move(pending.received)};
    take_first_spare();
    Snapshot snapshot = TakeSnapshot(*model, optimizers(), position, &spare, &exchange);
    snapshot.rank = comm.rank();
    checkpoint_stall = absl::ToDoubleSeconds(absl::Now() - start);
    spare = snapshot;
    writer->Offer(std::move(snapshot));
    if (final) return writer->Drain();
    return absl::OkStatus();
  };
  auto checkpoint = [&](bool final, bool force = false) -> absl::Status {
    if (options.checkpoints == nullptr) return absl::OkStatus();
    if (per_rank) return checkpoint_own_models(final, force);
    // Only rank 0 stores; decentralized ranks all join the global average.
    const bool take = writer != nullptr && (final || force || !writer->busy());
    if (writer != nullptr && !take) writer->NoteSkipped();  // the previous one is still being written
    if (!take && !gossip) return absl::OkStatus();
    p.Enter(v1::CHECKPOINT);
    if (take && (final || force)) RETURN_IF_ERROR(writer->Drain());
    const absl::Time start = absl::Now();
    if (take) take_first_spare();
    Snapshot snapshot;
    RETURN_IF_ERROR(with_global_average([&] {
      if (take) snapshot = TakeSnapshot(*model, optimizers(), position, &spare);
      return absl::OkStatus();
    }));
    if (!take) return absl::OkStatus();
    checkpoint_stall = absl::ToDoubleSeconds(absl::Now() - start);
    spare = snapshot;  // the same tensors: written again only after the writer is idle
    writer->Offer(std::move(snapshot));
    if (final) return writer->Drain();
    return absl::OkStatus();
  };

  // Checkpoint requests (`chorus checkpoint`): whether one is due at this step.
  // DDP: rank 0 alone stores, so it acts on its own. Decentralized: the
  // ranks must agree (all join the global average or upload a part), so
  // every kCheckpointRequestCheckSteps steps they all-reduce the highest
  // request count any of them has seen.
  // The same start on every rank (a request that came during setup is
  // honoured at the first check).
  int64_t handled_request = 0;
  auto checkpoint_requested = [&]() -> absl::StatusOr<bool> {
    if (options.checkpoints == nullptr) return false;
    if (!gossip) {
      const int64_t seen = p.checkpoint_request.load();
      if (comm.rank() != 0 || seen <= handled_request) return false;
      handled_request = seen;
      return true;
    }
    if (position.step % kCheckpointRequestCheckSteps != 0) return false;
    at::Tensor newest = at::full({1}, p.checkpoint_request.load(), at::kLong);
    RETURN_IF_ERROR(comm.AllReduce(newest, ReduceOp::kMax, "checkpoint/request")->Wait(absl::Now() + absl::Minutes(5)));
    const int64_t agreed = newest.item<int64_t>();
    if (agreed <= handled_request) return false;
    handled_request = agreed;
    return true;
  };

  v1::Metrics metrics;
  auto add_checkpoint_metrics = [&] {
    if (writer == nullptr) return;
    auto& values = *metrics.mutable_values();
    values["checkpoints_stored"] = writer->stored();
    values["checkpoints_skipped_busy"] = writer->skipped();
    values["checkpoint_stall_seconds"] = checkpoint_stall;
    values["checkpoint_serialize_seconds"] = writer->last_serialize_seconds();
    values["checkpoint_store_seconds"] = writer->last_store_seconds();
    values["checkpoint_bytes"] = writer->last_bytes();
  };
  int64_t& step = position.step;
  double interval_loss = 0;
  double interval_wait = 0;
  int interval_count = 0;
  const absl::Time start = absl::Now();
  absl::Time interval_start = start;
  for (; step < total_steps; ++position.epoch, position.epoch_offset = 0) {
    const int64_t epoch = position.epoch;
    SamplerOptions current = sampler;
    current.start = position.epoch_offset;
    std::vector<int64_t> indices = EpochIndices(current, epoch);
    const int64_t epoch_batches = BatchesPerEpoch(current);
    torch::Tensor all = torch::tensor(indices, torch::kLong);
    for (int64_t b = 0; b + accum <= epoch_batches && step < total_steps; b += accum) {
      RETURN_IF_ERROR(InjectFaults(spec, comm, step, p));
      // Random draws (dropout) are a function of (seed, rank, step), so a
      // resumed run draws exactly what an uninterrupted one would.
      torch::manual_seed(spec.training().seed() * 1000003 + comm.rank() * 7919 + step);
      if (optimizer) optimizer->zero_grad();  // the decentralized engine zeroes after its steps
      for (int m = 0; m < accum; ++m) {
        p.Enter(v1::DATA);
        torch::Tensor idx = all.narrow(0, (b + m) * sampler.batch_size, sampler.batch_size);
        torch::Tensor x = train.x.index_select(0, idx);
        torch::Tensor y = train.y.index_select(0, idx);
        p.Enter(v1::FORWARD);
        if (ddp) RETURN_IF_ERROR(ddp->PrepareForBackward());
        ASSIGN_OR_RETURN(torch::Tensor out, model->Forward(x));
        torch::Tensor loss = Loss(spec, out, y) / accum;
        p.Enter(v1::BACKWARD);
        if (m + 1 < accum) {
          auto no_sync = ddp->NoSync();
          loss.backward();
        } else if (ddp) {
          loss.backward();
          p.Enter(v1::COLLECTIVE);
          const absl::Time wait_start = absl::Now();
          RETURN_IF_ERROR(ddp->FinishGradientSync());
          interval_wait += absl::ToDoubleSeconds(absl::Now() - wait_start);
        } else {
          // Buckets mix, step and launch their exchanges from the hooks.
          const double waited = gossip->exchange_wait_seconds();
          loss.backward();
          p.Enter(v1::OPTIMIZER);
          RETURN_IF_ERROR(gossip->FinishStep());
          interval_wait += gossip->exchange_wait_seconds() - waited;
        }
        interval_loss += loss.item<double>();
      }
      ++interval_count;
      if (ddp) {
        if (spec.grad_clip_norm() > 0) {
          ClipGradientNorm(model->Parameters(), spec.grad_clip_norm());
        }
        p.Enter(v1::OPTIMIZER);
        const double lr = LearningRate(spec, step, total_steps);
        for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
        optimizer->step();
      }
      ++step;
      const int64_t average_every = gossip ? spec.strategy().decentralized().global_average_every_steps() : 0;
      if (average_every > 0 && step % average_every == 0) {
        p.Enter(v1::COLLECTIVE);
        RETURN_IF_ERROR(gossip->GlobalAverage());  // kept: the ranks restart from consensus
      }
      position.epoch_offset += accum * global_batch;
      p.step.store(step);
      p.epoch.store(epoch);
      metrics.set_step(step);
      metrics.set_epoch(epoch);
      if (writer != nullptr && ckpt.every_steps() > 0 && !first_spare_started) {
        // The optimizer's state exists now. The layout is read here, on the
        // training thread; the allocation runs beside the next steps.
        first_spare_started = true;
        first_spare = std::async(std::launch::async, [layout = SnapshotLayout(*model, optimizers())] {
          try {
            return AllocateLike(layout);
          } catch (const std::exception& e) {  // out of memory: the first snapshot allocates its own
            std::cerr << "could not set memory aside for the first checkpoint: " << e.what() << "\n";
            return Snapshot{};
          }
        });
      }
      const bool periodic = ckpt.every_steps() > 0 && step % ckpt.every_steps() == 0;
      ASSIGN_OR_RETURN(const bool requested, checkpoint_requested());
      if ((periodic || requested) && step < total_steps) {
        RETURN_IF_ERROR(checkpoint(/*final=*/false, /*force=*/requested));
      }
      const bool log = step % spec.training().log_every_steps() == 0 || step == total_steps;
      if (log) {
        const double seconds = absl::ToDoubleSeconds(absl::Now() - interval_start);
        metrics.set_loss(interval_loss / std::max(1, interval_count));
        metrics.set_step_time_seconds(seconds / std::max(1, interval_count));
        p.step_seconds.store(metrics.step_time_seconds());
        p.compute_seconds.store((seconds - interval_wait) / std::max(1, interval_count));
        metrics.set_samples_per_second(interval_count * accum * global_batch / std::max(seconds, 1e-9));
        (*metrics.mutable_values())["total_steps"] = total_steps;
        add_checkpoint_metrics();
        if (gossip) {
          (*metrics.mutable_values())["exchange_bytes_per_step"] = gossip->bytes_sent() / std::max<int64_t>(1, gossip->step());
          (*metrics.mutable_values())["exchange_wait_seconds_per_step"] = interval_wait / std::max(1, interval_count);
        }
        interval_loss = 0;
        interval_wait = 0;
        interval_count = 0;
        interval_start = absl::Now();
      }
      const bool eval = spec.eval().every_steps() > 0 && step % spec.eval().every_steps() == 0 &&
                        step < total_steps && !spec.eval().disabled() && test.size() > 0;
      if (eval) {
        p.Enter(v1::EVAL);
        RETURN_IF_ERROR(with_global_average([&] { return Evaluate(spec, *model, test, comm, metrics); }));
      }
      if (log || eval) report(metrics);
    }
    if (step >= total_steps) break;
  }
  // The final model of decentralized training is the global average.
  if (gossip) {
    RETURN_IF_ERROR(gossip->GlobalAverage());
    final_average = true;
  }
  if (!ckpt.has_at_end() || ckpt.at_end()) RETURN_IF_ERROR(checkpoint(/*final=*/true));
  if (writer != nullptr) RETURN_IF_ERROR(writer->Drain());
  p.Enter(v1::EVAL);
  if (!spec.eval().disabled() && test.size() > 0) {
    RETURN_IF_ERROR(Evaluate(spec, *model, test, comm, metrics));
  }
  p.Enter(v1::FINISHED);
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  (*metrics.mutable_values())["wall_seconds"] = wall;
  (*metrics.mutable_values())["total_steps"] = total_steps;
  add_checkpoint_metrics();
  metrics.set_samples_per_second(step * accum * global_batch / std::max(wall, 1e-9));
  report(metrics);
  return metrics;
}

}  // namespace chorus
