#include "worker/train/trainer.h"

#include <torch/nn/functional/loss.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cpu_binding.h"
#include "common/job_spec.h"
#include "common/memory_estimate.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/train/checkpoint.h"
#include "worker/train/data.h"
#include "worker/train/metrics_window.h"
#include "worker/train/model.h"
#include "worker/train/sample_trace.h"
#include "worker/train/sampler.h"
#include "worker/train/shard_reader.h"
#include "worker/train/state_sync.h"
#include "worker/train/step_boundary.h"
#include "worker/train/training_checkpoints.h"
#include "worker/train/training_strategy.h"

namespace chorus {
namespace {

// Mean loss per target element. Token models give [B, T, V] logits for
// [B, T] targets; they are flattened to B*T predictions.
torch::Tensor Loss(const v1::JobSpec& spec, const torch::Tensor& out, const torch::Tensor& y) {
  if (spec.loss().kind() == v1::LossSpec::MSE) {
    return torch::mse_loss(out.reshape(y.sizes()), y);
  }
  const bool sequence = out.dim() > 2 && out.dim() == y.dim() + 1;
  return torch::nn::functional::cross_entropy(
      sequence ? out.reshape({-1, out.size(-1)}) : out, sequence ? y.reshape({-1}) : y,
      torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(
          spec.loss().label_smoothing()));
}

// Note [Batches on a GPU]
// The datasets stay in host memory. A step's rows are gathered into pinned
// memory and copied to the GPU without blocking the host: LibTorch's caching
// host allocator keeps a pinned block until the copy that reads it is done,
// then reuses it, so steady state allocates nothing. The losses add up on the
// device and are read once per report: reading each one (.item()) would make
// the host wait for every step and the GPU idle while the next is launched.

// The `len` rows of `data` from `begin` (`idx` undefined) or the rows `idx`,
// on `device` (Note [Batches on a GPU]).
torch::Tensor Rows(const torch::Tensor& data, const torch::Tensor& idx, int64_t begin, int64_t len,
                   const c10::Device& device) {
  if (device.is_cpu())
    return idx.defined() ? data.index_select(0, idx) : data.narrow(0, begin, len);
  std::vector<int64_t> shape(data.sizes().begin(), data.sizes().end());
  shape[0] = idx.defined() ? idx.numel() : len;
  torch::Tensor staged = at::empty(shape, data.options().pinned_memory(true));
  if (idx.defined()) {
    at::index_select_out(staged, data, 0, idx);
  } else {
    staged.copy_(data.narrow(0, begin, len));
  }
  return staged.to(device, /*non_blocking=*/true);
}

// The held-out split: in memory (`data`), or held-out shards streamed
// through `reader` (data.shards.eval_paths).
struct HeldOut {
  const Dataset* data = nullptr;
  ShardReader* reader = nullptr;
  int64_t size() const { return reader != nullptr ? reader->index().size() : data->size(); }
  int64_t num_classes() const {
    return reader != nullptr ? reader->probe().num_classes : data->num_classes;
  }
};

// Loss and accuracy of the model on `test`, each rank taking a contiguous
// share (in file order for shards), summed across ranks.
absl::Status Evaluate(const v1::JobSpec& spec, Model& model, const HeldOut& test,
                      Communicator& comm, v1::Metrics& metrics) {
  torch::NoGradGuard no_grad;
  model.SetTraining(false);
  const int64_t n = test.size();
  const int64_t begin = n * comm.rank() / comm.size();
  const int64_t end = n * (comm.rank() + 1) / comm.size();
  const int64_t limit = spec.eval().max_batches() > 0
                            ? spec.eval().max_batches() * spec.training().batch_size_per_rank()
                            : end - begin;
  const int64_t stop = std::min(end, begin + limit);
  // Loss sum, correct, target elements; added up where the model is.
  at::Tensor sums = at::zeros({3}, at::TensorOptions().dtype(at::kDouble).device(comm.device()));
  const int64_t batch = std::max<int64_t>(256, spec.training().batch_size_per_rank());
  if (test.reader != nullptr && stop > begin) {
    std::vector<int64_t> samples(stop - begin);
    std::iota(samples.begin(), samples.end(), begin);
    test.reader->Start(std::move(samples), batch);
  }
  for (int64_t i = begin; i < stop; i += batch) {
    const int64_t len = std::min(batch, stop - i);
    torch::Tensor x, y;
    if (test.reader != nullptr) {
      ASSIGN_OR_RETURN(ShardBatch read, test.reader->Next());
      x = read.x.to(comm.device());
      y = read.y.to(comm.device());
    } else {
      x = Rows(test.data->x, torch::Tensor(), i, len, comm.device());
      y = Rows(test.data->y, torch::Tensor(), i, len, comm.device());
    }
    ASSIGN_OR_RETURN(torch::Tensor out, model.Forward(x));
    sums[0] += Loss(spec, out, y).to(at::kDouble) * y.numel();
    if (test.num_classes() > 0) sums[1] += out.argmax(-1).reshape(y.sizes()).eq(y).sum();
    sums[2] += y.numel();
  }
  model.SetTraining(true);
  RETURN_IF_ERROR(
      comm.AllReduce(sums, ReduceOp::kSum, "eval/metrics")->Wait(absl::Now() + absl::Minutes(5)));
  sums = sums.cpu();
  const double count = std::max(1.0, sums[2].item<double>());
  metrics.set_eval_loss(sums[0].item<double>() / count);
  if (test.num_classes() > 0) metrics.set_eval_accuracy(sums[1].item<double>() / count);
  return absl::OkStatus();
}

// Deliberate failures from spec.fault_injection for this rank at this step
// (in the fault's generation). HANG and SLOW sleep in the DATA phase, before the
// step's collectives, so the other ranks wait for this one. SKIP_COLLECTIVE
// and MISMATCH_COLLECTIVE add collectives at the fault's step on every rank
// (every rank knows the spec) and make the faulty rank leave one out or swap
// two.
// Every fault announces itself on stderr with the wall-clock time it happens
// (unix microseconds), so tests and benchmarks can time the detection.
void Announce(int rank, int64_t step, const std::string& what) {
  std::cerr << "fault injection: rank " << rank << " " << what << " at step " << step
            << " (unix_us " << absl::ToUnixMicros(absl::Now()) << ")" << std::endl;
}

absl::Status InjectFaults(const v1::JobSpec& spec, Communicator& comm, int64_t generation,
                          int64_t step, TrainingProgress& p) {
  const int rank = comm.rank();
  const absl::Time deadline = absl::Now() + absl::Hours(1);
  const at::TensorOptions floats = at::TensorOptions().device(comm.device());
  for (const v1::Fault& f : spec.fault_injection().faults()) {
    // Generation 0 is the first (1): a rank that redoes the fault's step in
    // a re-formed generation does not fail again.
    if (std::max<int64_t>(f.generation(), 1) != generation) continue;
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
          if (now)
            Announce(rank, step,
                     absl::StrCat(f.kind() == v1::Fault::HANG ? "hangs" : "slows down", " for ",
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
          RETURN_IF_ERROR(comm.AllReduce(torch::ones({1}, floats), ReduceOp::kSum, "fault/skipped")
                              ->Wait(deadline));
        }
        break;
      case v1::Fault::MISMATCH_COLLECTIVE: {
        if (!now) break;
        if (mine) Announce(rank, step, "swaps fault/first and fault/second");
        p.Enter(v1::COLLECTIVE);
        torch::Tensor first = torch::ones({4}, floats);
        torch::Tensor second = torch::ones({8}, floats);
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

// A reader of data.shards.eval_paths, whose samples must have the types
// and shapes of the training shards' (`train`: their first sample).
absl::StatusOr<std::unique_ptr<ShardReader>> OpenHeldOutShards(const v1::ShardedData& shards,
                                                               const ShardReaderOptions& options,
                                                               const Dataset& train) {
  v1::ShardedData held_out = shards;
  *held_out.mutable_paths() = shards.eval_paths();
  held_out.clear_eval_paths();
  absl::StatusOr<std::unique_ptr<ShardReader>> reader = ShardReader::Open(held_out, options);
  if (!reader.ok()) {  // the reader's errors name data.shards(.paths)
    std::string message(reader.status().message());
    for (const char* field : {"data.shards.paths", "data.shards"}) {
      if (absl::StartsWith(message, field)) {
        message = absl::StrCat("data.shards.eval_paths", message.substr(strlen(field)));
        break;
      }
    }
    return absl::Status(reader.status().code(), message);
  }
  const Dataset& probe = (*reader)->probe();
  auto describe = [](const at::Tensor& t) {
    return absl::StrCat(c10::toString(t.scalar_type()), " [",
                        absl::StrJoin(t.sizes().slice(1), ", "), "]");
  };
  if (probe.x.scalar_type() != train.x.scalar_type() ||
      probe.x.sizes().slice(1) != train.x.sizes().slice(1) ||
      probe.y.scalar_type() != train.y.scalar_type() ||
      probe.y.sizes().slice(1) != train.y.sizes().slice(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.shards.eval_paths: ", (*reader)->index().shards()[0].path, " holds samples of ",
        describe(probe.x), " -> ", describe(probe.y), " but the training shards' are ",
        describe(train.x), " -> ", describe(train.y),
        "; held-out samples must have the training samples' types and shapes"));
  }
  return reader;
}

// The training and test splits; integer inputs become floats for the
// built-in mlp and cnn. Sharded data is streamed by `reader` instead:
// `train` is its first sample (for the model's shapes), there is no test
// split in memory, and held-out shards are streamed by `eval_reader`.
absl::Status LoadSplits(const v1::JobSpec& spec, Dataset& train, Dataset& test,
                        std::unique_ptr<ShardReader>& reader,
                        std::unique_ptr<ShardReader>& eval_reader) {
  const bool float_inputs = !spec.model().has_transformer_lm() && !spec.model().has_torchscript();
  if (spec.data().has_shards()) {
    ShardReaderOptions options;
    options.float_inputs = float_inputs;
    if (spec.model().has_transformer_lm())
      options.vocab_size = spec.model().transformer_lm().vocab_size();
    options.num_classes = spec.data().shards().num_classes();
    ASSIGN_OR_RETURN(reader, ShardReader::Open(spec.data().shards(), options));
    train = reader->probe();
    test = Dataset{};
    if (spec.data().shards().eval_paths_size() > 0) {
      ASSIGN_OR_RETURN(eval_reader, OpenHeldOutShards(spec.data().shards(), options, train));
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(train, LoadDataset(spec, Split::kTrain));
  ASSIGN_OR_RETURN(test, LoadDataset(spec, Split::kTest));
  if (float_inputs && !at::isFloatingType(train.x.scalar_type())) {
    train.x = train.x.to(at::kFloat);
    if (test.size() > 0) test.x = test.x.to(at::kFloat);
  }
  return absl::OkStatus();
}

// Where training starts: from scratch, or from checkpoint `resume` read
// through `checkpoints` (possibly written by another number of ranks: the
// sampler re-shards the rest of its epoch).
absl::StatusOr<TrainingPosition> StartingPosition(const v1::CheckpointManifest& resume,
                                                  CheckpointStorage* checkpoints,
                                                  Communicator& comm, Model& model,
                                                  TrainingStrategy& strategy, TrainingProgress& p) {
  TrainingPosition position;
  position.world_size = comm.size();
  if (resume.job_id().empty()) return position;
  if (checkpoints == nullptr)
    return absl::FailedPreconditionError("resuming needs a checkpoint source");
  p.Enter(v1::CHECKPOINT);
  // A per-rank checkpoint: each rank loads its own part when the world
  // size is the same (with the exchange it had received: an exact
  // continuation), else rank r loads part r mod (saved ranks).
  v1::CheckpointManifest part = resume;
  int source = 0;
  bool own = false;
  if (part.per_rank()) {
    const int saved = std::max(1, part.world_size());
    source = comm.rank() % saved;
    own = saved == comm.size();
    part.clear_files();
    for (const v1::CheckpointFile& f : resume.files()) {
      if (f.name() == ModelFileName(source) || f.name() == TrainStateFileName(source))
        *part.add_files() = f;
    }
  }
  ASSIGN_OR_RETURN(std::vector<CheckpointFileData> files, checkpoints->Load(part));
  for (CheckpointFileData& f : files) {
    if (f.name == ModelFileName(source)) f.name = kModelFile;
    if (f.name == TrainStateFileName(source)) f.name = kTrainStateFile;
  }
  ExchangeState exchange;
  ASSIGN_OR_RETURN(position, Restore(files, model, strategy.optimizers(), &exchange));
  position.world_size = comm.size();
  if (!own) exchange.received.clear();
  RETURN_IF_ERROR(strategy.Resume(position.step, std::move(exchange)));
  return position;
}

// Steps of the run from `position`: the rest of the current epoch, then
// whole epochs, capped by training.max_steps.
int64_t TotalSteps(const v1::JobSpec& spec, const SamplerOptions& sampler,
                   const TrainingPosition& position, int accum) {
  int64_t total_steps = 0;
  SamplerOptions first = sampler;
  first.start = position.epoch_offset;
  if (spec.training().epochs() > 0) {
    const int64_t epochs_left = spec.training().epochs() - position.epoch;
    const int64_t steps_per_epoch = BatchesPerEpoch(sampler) / accum;
    total_steps = position.step + (epochs_left > 0 ? BatchesPerEpoch(first) / accum +
                                                         (epochs_left - 1) * steps_per_epoch
                                                   : 0);
  }
  if (spec.training().max_steps() > 0) {
    total_steps = total_steps > 0 ? std::min(total_steps, spec.training().max_steps())
                                  : spec.training().max_steps();
  }
  return total_steps;
}

// The figures of a report window into `metrics` and `p`.
void AddWindowMetrics(const MetricsWindow::Summary& window, int64_t total_steps, int world_size,
                      const TrainingCheckpoints& checkpoints, const TrainingStrategy& strategy,
                      v1::Metrics& metrics, TrainingProgress& p) {
  metrics.set_loss(window.loss);
  metrics.set_step_time_seconds(window.step_seconds);
  p.step_seconds.store(window.step_seconds);
  p.compute_seconds.store(window.compute_seconds);
  p.comm_wait_seconds.store(window.wait_seconds);
  p.loss.store(window.loss);
  p.samples_per_second.store(window.samples_per_second / std::max(1, world_size));
  metrics.set_samples_per_second(window.samples_per_second);
  (*metrics.mutable_values())["total_steps"] = total_steps;
  checkpoints.AddMetrics(metrics);
  strategy.AddMetrics(window, metrics);
}

// The streamed data's figures over a report window: how long a step waited
// for its batch (the DATA phase's share that is I/O) and how fast the rank
// read its shards; nothing for data in memory.
class DataWindow {
 public:
  DataWindow(const ShardReader* reader, absl::Time start, int64_t step)
      : reader_(reader), start_(start), step_(step) {
    if (reader_ != nullptr) last_ = reader_->stats();
  }

  // Adds data_wait_seconds (per step) and data_read_bytes_per_second to
  // `metrics` for the window up to `now` and `step`, and starts the next.
  void Close(absl::Time now, int64_t step, v1::Metrics& metrics) {
    if (reader_ == nullptr) return;
    const ShardReader::Stats stats = reader_->stats();
    const double seconds = std::max(1e-9, absl::ToDoubleSeconds(now - start_));
    auto& values = *metrics.mutable_values();
    values["data_wait_seconds"] =
        (stats.wait_seconds - last_.wait_seconds) / std::max<int64_t>(1, step - step_);
    values["data_read_bytes_per_second"] = (stats.bytes_read - last_.bytes_read) / seconds;
    last_ = stats;
    start_ = now;
    step_ = step;
  }

 private:
  const ShardReader* reader_;
  ShardReader::Stats last_;
  absl::Time start_;
  int64_t step_;
};

// A failed collective: a member of the generation was lost or the transport
// broke (as opposed to a mistake in the spec or the data).
bool IsMembershipFailure(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kAborted ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

// Note [Step boundary]
// A planned change of an elastic job (a drain, a growth) must not cost a
// step: every rank has to stop after the same step. The coordinator's
// REFORM_AT_STEP_BOUNDARY reaches the ranks on their heartbeats, at
// different moments, so a rank does not act on it alone: at the start of
// every step the ranks all-reduce (max) the generation they were asked to
// re-form into. Everyone sees the same result, so either every rank trains
// the step or every rank stops before it, holding the same complete step,
// and joins the next generation (state_sync.h then finds nothing to send
// but the newcomers' state). A rank whose all-reduce fails is at that same
// boundary too: it treats the failure as a lost member, as any.
// The next generation re-shards the rest of the epoch among its world size;
// so that the rest fills whole global batches of whatever size the job
// takes (data.remainder DROP would lose a partial one), the ranks stop only
// where the samples of the epoch trained so far are a multiple of the
// global batch of every world size in [min_ranks, max_ranks]
// (`boundary_samples`); at the start of an epoch always. The coordinator
// sends the world size it plans for the next generation with the request;
// when the ranks know it, only that world's global batch must divide the
// samples trained so far (BoundarySamples in step_boundary.h), so a job
// with a wide [min_ranks, max_ranks] does not wait up to an epoch. Should
// the coordinator form another size after all (a slot went away
// meanwhile), the rest of the epoch may leave a partial batch, dropped as
// after a failure. With training.global_batch_size every step is a
// boundary: the global batch is the same at every world size, so the rest
// of the epoch is whole steps at any of them (Note [Global batch] in
// sampler.cc).
absl::Status CheckStepBoundary(Communicator& comm, const TrainingProgress& p, int64_t generation,
                               int64_t step, int64_t epoch_offset, const v1::JobSpec& spec,
                               int64_t per_rank_step, int64_t epoch_samples) {
  torch::Tensor asked = torch::tensor({p.reform_request.load()}, torch::kLong).to(comm.device());
  RETURN_IF_ERROR(comm.AllReduce(asked, ReduceOp::kMax, "elastic/step_boundary")
                      ->Wait(absl::Now() + absl::Minutes(5)));
  const ReformRequest next = UnpackReformRequest(asked.item<int64_t>());
  if (next.generation <= generation) return absl::OkStatus();
  // The next world's global batch is that of the ranks that will train in it.
  const absl::StatusOr<int> next_training =
      next.world_size > 0 ? TrainingRanks(spec, next.world_size) : absl::StatusOr<int>(0);
  // With training.global_batch_size every step ends on a whole global batch
  // of every world size.
  const int64_t boundary =
      spec.training().global_batch_size() > 0
          ? spec.training().global_batch_size()
          : BoundarySamples(spec.resources().min_ranks(), spec.resources().max_ranks(),
                            next_training.ok() ? *next_training : 0, per_rank_step, epoch_samples);
  if (epoch_offset % boundary != 0) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat("generation ", generation, " ends at the step boundary before step ", step,
                   ": the coordinator asked for generation ", next.generation));
}

// What a rank keeps across the generations of its job.
struct RankRun {
  const v1::JobSpec& spec;
  Model& model;
  const Dataset& train;
  const Dataset& test;
  // Sharded data: the stream of this rank's batches (train is then one
  // sample); null for data in memory.
  ShardReader* reader = nullptr;
  // Held-out shards (data.shards.eval_paths); null without them.
  ShardReader* eval_reader = nullptr;
  // Samples in the training split (in memory or in the shards).
  int64_t train_size = 0;
  const MetricsCallback& report;
  TrainingProgress& p;
  const TrainOptions& options;
  SampleTrace* trace = nullptr;
  // The state this rank held when its last generation failed: its newest
  // complete step's model, optimizer state and position. None for a
  // newcomer, a hot spare, and until a generation fails.
  std::optional<Snapshot> held;

  HeldOut held_out() const { return HeldOut{&test, eval_reader}; }
};

// StartingPosition for the first generation, or for one that starts over
// (Note [Starting over]), from `gen.resume`; with sharded data the
// checkpoint's shard fingerprints are checked against the shards' and the
// position carries theirs from here on, through every checkpoint and every
// later generation's shared state (Note [Shard fingerprints] in
// shard_index.cc).
absl::StatusOr<TrainingPosition> FirstPosition(RankRun& run, const Generation& gen,
                                               TrainingStrategy& strategy) {
  ASSIGN_OR_RETURN(TrainingPosition position, StartingPosition(gen.resume, gen.checkpoints,
                                                               *gen.comm, run.model, strategy,
                                                               run.p));
  if (run.reader != nullptr) {
    RETURN_IF_ERROR(CheckFingerprints(run.reader->index(), position.shard_fingerprints));
    position.shard_fingerprints = run.reader->index().Fingerprints();
  }
  return position;
}

// This rank's samples of `epoch` from `sampler.start` on, batch after
// batch. Sharded data: the stream order's share (Note [Streamed order] in
// sampler.cc), handed to the reader, which reads it ahead; the tensor is
// then undefined.
torch::Tensor EpochOrder(RankRun& run, const SamplerOptions& sampler, int64_t epoch, bool spare) {
  if (run.reader == nullptr) return torch::tensor(EpochIndices(sampler, epoch), torch::kLong);
  if (spare) return torch::Tensor();  // a hot spare trains on nothing: reads nothing
  const v1::ShardedData& s = run.spec.data().shards();
  // Drawn as read: the rank's share of the epoch is never held whole.
  StreamCursor cursor(run.reader->index().ShardSizes(), s.shuffle_buffer(), sampler, epoch);
  const int64_t count = cursor.size();
  run.reader->Start({count, [cursor]() mutable { return cursor.Next(); }}, sampler.batch_size);
  return torch::Tensor();
}

// The micro-batch of `len` samples from position `begin` of this rank's
// epoch (`order`), on `device`; from the reader for sharded data.
absl::StatusOr<ShardBatch> NextBatch(RankRun& run, const torch::Tensor& order, int64_t begin,
                                     int64_t len, const c10::Device& device) {
  ShardBatch batch;
  if (run.reader != nullptr) {
    ASSIGN_OR_RETURN(batch, run.reader->Next());
    if (!device.is_cpu()) {
      batch.x = Rows(batch.x, torch::Tensor(), 0, len, device);
      batch.y = Rows(batch.y, torch::Tensor(), 0, len, device);
    }
    return batch;
  }
  batch.indices = order.narrow(0, begin, len);
  batch.x = Rows(run.train.x, batch.indices, 0, 0, device);
  batch.y = Rows(run.train.y, batch.indices, 0, 0, device);
  return batch;
}

// The spec one generation trains with: elastic.scale_lr scales the learning
// rate with the ranks that train; training.global_batch_size sets the
// micro-batches each of them accumulates per step (Note [Global batch] in
// sampler.cc). INVALID_ARGUMENT naming the world size when the global
// batch does not split among its ranks.
absl::StatusOr<v1::JobSpec> GenerationSpec(const v1::JobSpec& spec, int world_size,
                                           int64_t generation) {
  v1::JobSpec out = spec;
  if (spec.has_elastic() && spec.elastic().scale_lr()) {
    out.mutable_optimizer()->set_lr(spec.optimizer().lr() * world_size /
                                    std::max(1, spec.resources().max_ranks()));
  }
  if (spec.training().global_batch_size() > 0) {
    const absl::StatusOr<int> micro = MicroBatchesPerStep(spec, world_size);
    if (!micro.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("generation ", generation, " cannot train: ", micro.status().message()));
    }
    out.mutable_strategy()->mutable_ddp()->set_grad_accum_steps(*micro);
  }
  return out;
}

// How `rank` of the `training` ranks of a generation takes its share of a
// split of `train_size` samples; INVALID_ARGUMENT when the split does not
// fill one global batch.
absl::StatusOr<SamplerOptions> GenerationSampler(const v1::JobSpec& spec, int64_t train_size,
                                                 int training, int rank) {
  SamplerOptions sampler{train_size,
                         training,
                         rank,
                         spec.training().batch_size_per_rank(),
                         spec.training().seed(),
                         spec.training().shuffle(),
                         spec.data().remainder() == v1::DataSpec::PAD};
  const int64_t global = spec.training().global_batch_size();
  if (global > 0) {  // whole micro-batches, whole steps (Note [Global batch] in sampler.cc)
    sampler.chunk = sampler.batch_size;
    sampler.step_batches = spec.strategy().ddp().grad_accum_steps();
  }
  if (BatchesPerEpoch(sampler) == 0) {
    return absl::InvalidArgumentError(
        global > 0
            ? absl::StrCat("the training split has ", train_size,
                           " samples, fewer than one global batch "
                           "(training.global_batch_size ",
                           global, ")")
            : absl::StrCat("the training split has ", train_size,
                           " samples, fewer than one global batch (", training,
                           " ranks x training.batch_size_per_rank ", sampler.batch_size, ")"));
  }
  return sampler;
}

// The model's output for micro-batch `k` of `step` (rank r's m-th of the
// step is number m x training ranks + r). Its random draws (dropout) are a
// function of (seed, step, k), so a resumed run draws exactly what an
// uninterrupted one would, ranks that share a process do not draw from each
// other's seeds (Note [Seeded draws] in model.h), and with
// training.global_batch_size, where micro-batch k of a step is the same
// samples at every world size, a sample gets the same draws at every world
// size (Note [Global batch] in sampler.cc).
absl::StatusOr<torch::Tensor> SeededForward(RankRun& run, int64_t step, int64_t k,
                                            const torch::Tensor& x) {
  const uint64_t seed = run.spec.training().seed() * 1000003 + (static_cast<uint64_t>(step) << 24) +
                        static_cast<uint64_t>(k);
  absl::StatusOr<torch::Tensor> out;
  WithSeed(seed, [&] { out = run.model.Forward(x); });
  return out;
}

// Note [Starting over]
// A generation after the first goes on from the newest step one of its
// members holds (state_sync.h). None holds one when every rank that had
// completed a step was lost, or when the job lost a rank before any had
// completed one: a rank killed while the others were still loading data
// and building their models fails their first collective (the strategy's
// parameter broadcast), and they join the next generation holding nothing.
// That generation then starts from where the job started, which every
// member rebuilds by itself, as the first generation built it:
//  - the seeded initial model: Model::Build under WithSeed(training.seed)
//    again (the same draws give the same bits), copied into the live
//    tensors, which the strategy's broadcast has just overwritten with
//    rank 0's (whatever an earlier generation or a failed broadcast left
//    there); the strategy's optimizers are fresh and the step is 0;
//  - then, when the generation's JoinResponse names a checkpoint
//    (Generation::resume), that checkpoint, loaded as FirstPosition loads
//    the first generation's. The coordinator names the job's newest
//    committed checkpoint, else the one the job was submitted to resume
//    from (Note [A generation's checkpoint] in
//    coordinator/scheduling/job_resume.h).
// Every member reads the same JoinResponse, so all make the same choice;
// one all-reduce checks it, since members that started from different
// states would train on silently apart.
// The steps trained since that starting point are trained again. That is
// correct, not only safe: training is deterministic. The order of an
// epoch's samples is a function of the seed and the epoch, the position
// says where in it the starting point is, and each micro-batch's random
// draws are a function of (seed, step, micro-batch) (SeededForward), so the
// generation trains the batches that were trained before, in the same
// way, and at the same world size ends with the parameters of an
// undisturbed run. What is lost is time: the steps since the checkpoint
// (all of them without one), which checkpoint.every_steps bounds. Rank 0
// logs which starting point the generation took and why.

// The step of the checkpoint every member of `gen` starts over from (-1:
// none) must be the same on all of them (Note [Starting over]).
absl::Status CheckSameStartingPoint(Communicator& comm, const Generation& gen) {
  const int64_t mine = gen.resume.job_id().empty() ? -1 : gen.resume.step();
  at::Tensor range = torch::tensor({mine, -mine}, torch::kLong).to(comm.device());
  RETURN_IF_ERROR(comm.AllReduce(range, ReduceOp::kMax, "elastic/starting_point")
                      ->Wait(absl::Now() + absl::Minutes(5)));
  range = range.cpu();
  const int64_t newest = range[0].item<int64_t>();
  const int64_t oldest = -range[1].item<int64_t>();
  if (newest == oldest) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      "the ranks of generation ", gen.generation, " were told different checkpoints to start ",
      "over from (steps ", oldest, " to ", newest, ", -1 for none); they must start from one "
      "state, so the generation fails (a bug)"));
}

// Puts the model Train built before any step back into the live
// parameters and buffers, in place (the strategy holds them): built again
// from the seed, the same draws give the same bits (Note [Seeded draws] in
// model.h).
absl::Status RestoreInitialModel(RankRun& run) {
  absl::StatusOr<std::unique_ptr<Model>> built;
  WithSeed(run.spec.training().seed(), [&] { built = Model::Build(run.spec.model(), run.train); });
  ASSIGN_OR_RETURN(std::unique_ptr<Model> initial, std::move(built));
  std::vector<NamedTensor> from = initial->NamedParameters();
  for (NamedTensor& b : initial->NamedBuffers()) from.push_back(std::move(b));
  std::vector<NamedTensor> to = run.model.NamedParameters();
  for (NamedTensor& b : run.model.NamedBuffers()) to.push_back(std::move(b));
  if (from.size() != to.size()) {
    return absl::InternalError(absl::StrCat("the model built again has ", from.size(),
                                            " tensors, the live one ", to.size()));
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < to.size(); ++i) {
    if (from[i].name != to[i].name || from[i].tensor.sizes() != to[i].tensor.sizes()) {
      return absl::InternalError(absl::StrCat("the model built again has ", from[i].name,
                                              " where the live one has ", to[i].name));
    }
    to[i].tensor.copy_(from[i].tensor);
  }
  return absl::OkStatus();
}

// A generation in which no member holds training state starts from the
// job's starting point (Note [Starting over]).
absl::StatusOr<TrainingPosition> StartOver(RankRun& run, const Generation& gen,
                                           TrainingStrategy& strategy) {
  Communicator& comm = *gen.comm;
  RETURN_IF_ERROR(CheckSameStartingPoint(comm, gen));
  RETURN_IF_ERROR(RestoreInitialModel(run));
  ASSIGN_OR_RETURN(TrainingPosition position, FirstPosition(run, gen, strategy));
  if (comm.rank() == 0) {
    const bool checkpoint = !gen.resume.job_id().empty();
    LOG(WARNING) << "generation " << gen.generation << " starts over from "
                 << (checkpoint ? absl::StrCat("checkpoint ", gen.resume.job_id(), " step ",
                                               gen.resume.step())
                                : absl::StrCat("the job's initial model (training.seed ",
                                               run.spec.training().seed(), ")"))
                 << ": none of its " << comm.size() << " ranks holds training state (every rank "
                 << "that had completed a step was lost, or none had completed one)"
                 << (checkpoint ? absl::StrCat("; the steps after step ", position.step,
                                               " that were trained before")
                                : std::string(" and the job has no checkpoint; the steps "
                                              "trained before, if any,"))
                 << " are trained again, on the same batches with the same random draws";
  }
  if (run.trace != nullptr) {
    run.trace->State(gen.generation, comm.rank(), /*source=*/-1, position.step, /*held=*/-1,
                     run.model);
  }
  return position;
}

// The position a generation after the first starts from: the newest
// state any member holds (state_sync.h), the mean of the survivors' models
// for a strategy whose replicas differ; the job's starting point when no
// member holds any (Note [Starting over]).
absl::StatusOr<TrainingPosition> SharedPosition(RankRun& run, const Generation& gen,
                                                TrainingStrategy& strategy) {
  Communicator& comm = *gen.comm;
  const absl::Time share_start = absl::Now();
  const int64_t had = run.held.has_value() ? run.held->position.step : -1;
  ASSIGN_OR_RETURN(std::optional<SharedState> newest,
                   ShareNewestState(comm, run.model, strategy.optimizers(),
                                    run.held.has_value() ? &*run.held : nullptr,
                                    absl::Now() + absl::Minutes(5)));
  if (!newest.has_value()) return StartOver(run, gen, strategy);
  const SharedState& shared = *newest;
  TrainingPosition position = shared.position;
  if (!strategy.replicas_identical()) {
    ASSIGN_OR_RETURN(const int averaged,
                     AverageHeldModels(comm, run.model, run.held.has_value() ? &*run.held : nullptr,
                                       absl::Now() + absl::Minutes(5)));
    if (comm.rank() == 0) {
      LOG(INFO) << "generation " << gen.generation << " starts from the mean of " << averaged
                << " survivor model(s) at step " << position.step;
    }
  }
  RETURN_IF_ERROR(strategy.Resume(position.step, ExchangeState{}));
  LOG(INFO) << "generation " << gen.generation << ": rank " << comm.rank() << " holds step "
            << position.step << " (" << shared.bytes << " bytes from rank " << shared.source
            << ", shared in "
            << absl::FormatDuration(absl::Trunc(absl::Now() - share_start, absl::Milliseconds(1)))
            << ")";
  if (run.trace != nullptr)
    run.trace->State(gen.generation, comm.rank(), shared.source, position.step, had, run.model);
  return position;
}

// One generation's training as this rank takes part in it.
struct GenerationRun {
  RankRun& run;
  const Generation& gen;
  Communicator& comm;
  const v1::JobSpec& spec;  // GenerationSpec's
  TrainingStrategy& strategy;
  const SamplerOptions& sampler;
  int accum = 1;             // micro-batches per step
  int training = 1;          // ranks that train
  int64_t global_batch = 0;  // samples per micro-batch over the training ranks
  bool spare = false;        // a hot spare: in every step's collectives, trains on nothing
  int64_t total_steps = 0;
  TrainingCheckpoints& checkpoints;
};

// The forward and backward passes of one step's micro-batches at `b`
// (this rank's batch number in the epoch's `order`); each micro-batch's
// loss into `window` (on the CPU) or `device_loss` (on a GPU).
absl::Status TrainMicroBatches(GenerationRun& g, int64_t step, int64_t epoch,
                               const torch::Tensor& order, int64_t b, MetricsWindow& window,
                               torch::Tensor& device_loss) {
  TrainingProgress& p = g.run.p;
  const c10::Device device = g.comm.device();
  const int64_t batch_size = g.sampler.batch_size;
  g.strategy.BeginStep();
  for (int m = 0; m < g.accum; ++m) {
    p.Enter(v1::DATA);
    ASSIGN_OR_RETURN(const ShardBatch batch,
                     NextBatch(g.run, order, (b + m) * batch_size, batch_size, device));
    if (g.run.trace != nullptr)
      g.run.trace->Step(g.gen.generation, g.comm.rank(), step, epoch, batch.indices);
    p.Enter(v1::FORWARD);
    RETURN_IF_ERROR(g.strategy.BeforeForward());
    ASSIGN_OR_RETURN(const torch::Tensor out,
                     SeededForward(g.run, step, int64_t{m} * g.training + g.comm.rank(), batch.x));
    const torch::Tensor loss = Loss(g.spec, out, batch.y) / g.accum;
    p.Enter(v1::BACKWARD);
    ASSIGN_OR_RETURN(const double waited, g.strategy.Backward(loss, m + 1 == g.accum));
    if (device.is_cpu()) {
      window.AddMicroBatch(loss.item<double>(), waited);
    } else {
      const torch::Tensor l = loss.detach().to(at::kDouble);
      device_loss = device_loss.defined() ? device_loss + l : l;
      window.AddMicroBatch(0, waited);
    }
  }
  return absl::OkStatus();
}

// What follows a step: progress, checkpoints, the report window's metrics
// every training.log_every_steps steps, and evaluation every
// eval.every_steps.
absl::Status AfterStep(GenerationRun& g, const TrainingPosition& position, int64_t epoch,
                       MetricsWindow& window, DataWindow& data_window, torch::Tensor& device_loss,
                       v1::Metrics& metrics) {
  const int64_t step = position.step;
  TrainingProgress& p = g.run.p;
  p.step.store(step);
  p.epoch.store(epoch);
  metrics.set_step(step);
  metrics.set_epoch(epoch);
  RETURN_IF_ERROR(g.checkpoints.AfterStep(position, g.total_steps));
  const bool log = step % g.spec.training().log_every_steps() == 0 || step == g.total_steps;
  if (log) {
    if (device_loss.defined()) {
      window.AddMicroBatch(device_loss.item<double>(), 0);
      device_loss = torch::Tensor();
    }
    AddWindowMetrics(window.Close(absl::Now(), g.accum * g.global_batch), g.total_steps,
                     g.comm.size(), g.checkpoints, g.strategy, metrics, p);
    data_window.Close(absl::Now(), step, metrics);
  }
  const bool eval = g.spec.eval().every_steps() > 0 && step % g.spec.eval().every_steps() == 0 &&
                    step < g.total_steps && !g.spec.eval().disabled() &&
                    g.run.held_out().size() > 0;
  if (eval) {
    p.Enter(v1::EVAL);
    RETURN_IF_ERROR(g.strategy.WithGlobalAverage(
        [&] { return Evaluate(g.spec, g.run.model, g.run.held_out(), g.comm, metrics); }));
  }
  if (log || eval) g.run.report(metrics);
  return absl::OkStatus();
}

// Trains the steps from `position` to the generation's total, epoch after
// epoch, then finishes the strategy, writes the final checkpoint and
// evaluates the final model.
absl::Status TrainSteps(GenerationRun& g, TrainingPosition& position, absl::Time start,
                        v1::Metrics& metrics) {
  MetricsWindow window(start);
  DataWindow data_window(g.run.reader, start, position.step);
  torch::Tensor device_loss;  // the window's losses on a GPU (Note [Batches on a GPU])
  int64_t& step = position.step;
  for (; step < g.total_steps; ++position.epoch, position.epoch_offset = 0) {
    const int64_t epoch = position.epoch;
    SamplerOptions current = g.sampler;
    current.start = position.epoch_offset;
    const torch::Tensor order = EpochOrder(g.run, current, epoch, g.spare);
    const int64_t epoch_batches = BatchesPerEpoch(current);
    for (int64_t b = 0; b + g.accum <= epoch_batches && step < g.total_steps; b += g.accum) {
      if (g.run.options.rejoin) {
        RETURN_IF_ERROR(CheckStepBoundary(g.comm, g.run.p, g.gen.generation, step,
                                          position.epoch_offset, g.spec,
                                          g.accum * g.sampler.batch_size, g.run.train_size));
      }
      RETURN_IF_ERROR(InjectFaults(g.spec, g.comm, g.gen.generation, step, g.run.p));
      if (g.spare) {
        RETURN_IF_ERROR(g.strategy.SpareStep());
      } else {
        RETURN_IF_ERROR(TrainMicroBatches(g, step, epoch, order, b, window, device_loss));
      }
      window.EndStep();
      RETURN_IF_ERROR(g.strategy.Step(step));
      ++step;
      position.epoch_offset += g.accum * g.global_batch;
      RETURN_IF_ERROR(AfterStep(g, position, epoch, window, data_window, device_loss, metrics));
    }
    if (step >= g.total_steps) break;
  }
  RETURN_IF_ERROR(g.strategy.Finish());
  RETURN_IF_ERROR(g.checkpoints.AtEnd(position));
  g.run.p.Enter(v1::EVAL);
  if (!g.spec.eval().disabled() && g.run.held_out().size() > 0) {
    RETURN_IF_ERROR(Evaluate(g.spec, g.run.model, g.run.held_out(), g.comm, metrics));
  }
  return absl::OkStatus();
}

// The strategy of a generation in which `training` of the ranks train.
absl::StatusOr<std::unique_ptr<TrainingStrategy>> GenerationStrategy(RankRun& run,
                                                                     const Generation& gen,
                                                                     const v1::JobSpec& spec,
                                                                     int training) {
  Communicator& comm = *gen.comm;
  const absl::Time setup_start = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<TrainingStrategy> strategy,
                   CreateTrainingStrategy(spec, run.model, comm, run.p));
  if (training != comm.size()) {
    LOG(INFO) << "generation " << gen.generation << ": " << training << " of " << comm.size()
              << " ranks train (the topology serves " << training << "); rank " << comm.rank()
              << (comm.rank() >= training ? " is a hot spare" : " trains");
  }
  if (gen.generation > 1) {
    LOG(INFO) << "generation " << gen.generation << ": rank " << comm.rank() << " built its "
              << "strategy in "
              << absl::FormatDuration(
                     absl::Trunc(absl::Now() - setup_start, absl::Milliseconds(1)));
  }
  return strategy;
}

// Trains in one generation until the run ends or a collective fails. A
// generation after the first starts from the newest state any member holds.
absl::StatusOr<v1::Metrics> TrainGeneration(RankRun& run, const Generation& gen) {
  Communicator& comm = *gen.comm;
  run.p.Enter(v1::SETUP);
  // Hot spares (Note [Hot spares] in decentralized_data_parallel.h) take part
  // in the collectives of every step and train on nothing; the ranks that
  // train share the data and set the learning rate's scale.
  ASSIGN_OR_RETURN(const int training, TrainingRanks(run.spec, comm.size()));
  const bool spare = comm.rank() >= training;
  ASSIGN_OR_RETURN(const v1::JobSpec spec, GenerationSpec(run.spec, training, gen.generation));
  ASSIGN_OR_RETURN(std::unique_ptr<TrainingStrategy> strategy,
                   GenerationStrategy(run, gen, spec, training));
  ASSIGN_OR_RETURN(const SamplerOptions sampler,
                   GenerationSampler(spec, run.train_size, training, spare ? 0 : comm.rank()));
  const int accum = strategy->accumulation_steps();
  TrainingPosition position;
  if (gen.generation > 1) {
    ASSIGN_OR_RETURN(position, SharedPosition(run, gen, *strategy));
  } else {
    ASSIGN_OR_RETURN(position, FirstPosition(run, gen, *strategy));
  }
  const int64_t total_steps = TotalSteps(spec, sampler, position, accum);
  strategy->set_total_steps(total_steps);
  TrainingCheckpoints checkpoints(gen.checkpoints, spec.checkpoint(), run.model, *strategy, comm,
                                  run.p);
  GenerationRun g{run,   gen,         comm,
                  spec,  *strategy,   sampler,
                  accum, training,    sampler.batch_size * training,
                  spare, total_steps, checkpoints};
  v1::Metrics metrics;
  const absl::Time start = absl::Now();
  if (absl::Status status = TrainSteps(g, position, start, metrics); !status.ok()) {
    // The model and the optimizers hold the last complete step (a failed
    // step never reaches the optimizer): keep them for the next generation.
    if (run.options.rejoin && IsMembershipFailure(status)) {
      // A spare's model trained nothing: it joins the next generation as a
      // newcomer does.
      run.held.reset();
      if (!spare) run.held = TakeSnapshot(run.model, strategy->optimizers(), position);
      // Fails what is still in flight (a gossip exchange with a live peer)
      // at once, so that tearing the strategy down does not wait for it.
      comm.Abort(status.message());
    }
    return status;
  }
  run.p.Enter(v1::FINISHED);
  if (run.trace != nullptr) run.trace->Final(gen.generation, comm.rank(), position.step, run.model);
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  (*metrics.mutable_values())["wall_seconds"] = wall;
  (*metrics.mutable_values())["total_steps"] = total_steps;
  if (training != comm.size()) (*metrics.mutable_values())["training_ranks"] = training;
  // What the job's memory estimate is checked against (docs/benchmarks.md).
  if (const int64_t peak = PeakResidentBytes(); peak > 0)
    (*metrics.mutable_values())["peak_rss_bytes"] = static_cast<double>(peak);
  checkpoints.AddMetrics(metrics);
  metrics.set_samples_per_second(position.step * accum * g.global_batch / std::max(wall, 1e-9));
  run.report(metrics);
  return metrics;
}

// Test mode (TrainOptions::setup_gate): waits until `gate` exists.
absl::Status WaitForSetupGate(const std::string& gate, const Communicator& comm) {
  LOG(INFO) << "rank " << comm.rank() << " (pid " << getpid() << ") waits for " << gate
            << " before its first collective (test mode)";
  const absl::Time deadline = absl::Now() + absl::Minutes(10);
  while (access(gate.c_str(), F_OK) != 0) {
    if (absl::Now() >= deadline) {
      return absl::FailedPreconditionError(
          absl::StrCat("test mode: ", gate, " did not appear within 10 minutes"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::Metrics> Train(const v1::JobSpec& spec, Communicator& comm,
                                  const MetricsCallback& report, TrainingProgress* progress,
                                  const TrainOptions& options) {
  TrainingProgress unused;
  TrainingProgress& p = progress != nullptr ? *progress : unused;
  p.Enter(v1::SETUP);
  const bool cuda = spec.resources().device() == v1::ResourceSpec::CUDA;
  if (cuda != comm.device().is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("resources.device is ", cuda ? "CUDA" : "CPU", " but rank ", comm.rank(),
                     "'s communicator works on ", comm.device().str(),
                     cuda ? ": a CUDA job needs an NCCL communicator (a build with --config=cuda)"
                          : ": a CPU job needs a Gloo communicator"));
  }
  at::set_num_threads(spec.resources().threads_per_rank());
  if (const std::vector<int> cpus = AllowedCpus();
      !cpus.empty() && static_cast<int>(cpus.size()) < spec.resources().threads_per_rank()) {
    LOG(WARNING) << "rank " << comm.rank() << ": resources.threads_per_rank is "
                 << spec.resources().threads_per_rank() << " but this rank may run on "
                 << cpus.size() << " CPU(s) (" << FormatCpuList(cpus)
                 << "), its slot's share, so its threads take turns; start the agent with "
                    "fewer slots (--slots auto --threads_per_slot "
                 << spec.resources().threads_per_rank() << ") or --bind_cpus=false";
  }
  const absl::Time load_start = absl::Now();
  Dataset train, test;
  std::unique_ptr<ShardReader> reader, eval_reader;
  RETURN_IF_ERROR(LoadSplits(spec, train, test, reader, eval_reader));
  const int64_t train_size = reader != nullptr ? reader->index().size() : train.size();
  // Built on the CPU from the seed, then moved: a GPU run starts from the
  // same parameters as a CPU run (Note [Seeded draws] in model.h).
  absl::StatusOr<std::unique_ptr<Model>> built;
  WithSeed(spec.training().seed(), [&] { built = Model::Build(spec.model(), train); });
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, std::move(built));
  if (cuda) model->To(comm.device());
  LOG(INFO) << "rank " << comm.rank() << (reader != nullptr ? " indexed " : " loaded ")
            << train_size << " training samples and built "
            << "its model in "
            << absl::FormatDuration(absl::Trunc(absl::Now() - load_start, absl::Milliseconds(1)));
  ASSIGN_OR_RETURN(std::unique_ptr<SampleTrace> trace, SampleTrace::Open(options.sample_trace_dir));
  RankRun run{spec,         *model,     train,  test, reader.get(), eval_reader.get(),
              train_size,   report,     p,      options, trace.get(), std::nullopt};
  if (!options.setup_gate.empty()) RETURN_IF_ERROR(WaitForSetupGate(options.setup_gate, comm));
  Generation generation{&comm, options.checkpoints, options.generation, options.resume};
  for (;;) {
    absl::StatusOr<v1::Metrics> result = TrainGeneration(run, generation);
    if (result.ok() || !options.rejoin || !IsMembershipFailure(result.status())) return result;
    ASSIGN_OR_RETURN(generation, options.rejoin(result.status()));
  }
}

}  // namespace chorus
