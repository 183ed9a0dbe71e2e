#include "worker/train/checkpoint.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "checkpoint/store_retry.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/replica/optimizer_state_key.h"
#include "worker/tensor_file/tensor_file.h"
#include "worker/train/accum_adam.h"

namespace chorus {
namespace {

at::Tensor Copy(const at::Tensor& t) { return t.detach().clone(); }

at::Tensor Scalar(int64_t v) { return torch::tensor({v}, torch::kLong); }

// Each optimized parameter with its index among the model's parameters
// (the "optim.<i>." prefix of its state) and the optimizer that holds it.
struct OptimizedParam {
  int index;
  at::Tensor param;
  torch::optim::Optimizer* optimizer;
};

std::vector<OptimizedParam> OptimizedParams(
    Model& model, const std::vector<torch::optim::Optimizer*>& optimizers) {
  std::map<OptimizerStateKey, int> index;
  int i = 0;
  for (const at::Tensor& p : model.Parameters()) index[OptimizerStateKeyOf(p)] = i++;
  std::vector<OptimizedParam> out;
  for (torch::optim::Optimizer* optimizer : optimizers) {
    for (const auto& group : optimizer->param_groups()) {
      for (const at::Tensor& param : group.params()) {
        auto it = index.find(OptimizerStateKeyOf(param));
        if (it != index.end()) out.push_back({it->second, param, optimizer});
      }
    }
  }
  return out;
}

constexpr char kExchangePrefix[] = "exchange.";

// The position's "meta.*" entries of train_state.pt (checkpoint.h).
void AddPosition(const TrainingPosition& position,
                 std::vector<std::pair<std::string, at::Tensor>>& train_state) {
  train_state.emplace_back("meta.step", Scalar(position.step));
  train_state.emplace_back("meta.epoch", Scalar(position.epoch));
  train_state.emplace_back("meta.epoch_offset", Scalar(position.epoch_offset));
  train_state.emplace_back("meta.world_size", Scalar(position.world_size));
  if (!position.shard_fingerprints.empty()) {
    train_state.emplace_back("meta.shard_fingerprints",
                             torch::tensor(position.shard_fingerprints, torch::kLong));
  }
}

// The position AddPosition wrote; `get(key)` is train_state.pt's tensor
// `key`, undefined if it has none. REQUIRES: meta.step, meta.epoch and
// meta.epoch_offset defined.
TrainingPosition ReadPosition(const std::function<at::Tensor(const std::string&)>& get) {
  TrainingPosition position;
  position.step = get("meta.step").item<int64_t>();
  position.epoch = get("meta.epoch").item<int64_t>();
  position.epoch_offset = get("meta.epoch_offset").item<int64_t>();
  if (get("meta.world_size").defined())
    position.world_size = get("meta.world_size").item<int64_t>();
  if (const at::Tensor f = get("meta.shard_fingerprints"); f.defined()) {
    const at::Tensor flat = f.to(at::kLong).contiguous().view(-1);
    position.shard_fingerprints.assign(flat.data_ptr<int64_t>(),
                                       flat.data_ptr<int64_t>() + flat.numel());
  }
  return position;
}

using CopyAs = std::function<at::Tensor(const std::string&, const at::Tensor&)>;

// The model's entries of a snapshot, each tensor through `copy_as(key,
// tensor)` with key "m/<name>".
std::vector<std::pair<std::string, at::Tensor>> CollectModel(Model& model, const CopyAs& copy_as) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  // Each tensor is copied once; a tied weight's other names (state dict
  // entries) then refer to that copy, so model.pt lists every name PyTorch's
  // state_dict() has and stores the tensor once.
  std::map<const c10::TensorImpl*, at::Tensor> copies;
  auto copy_once = [&](const NamedTensor& t) {
    at::Tensor copy = copy_as("m/" + t.name, t.tensor);
    copies.emplace(t.tensor.unsafeGetTensorImpl(), copy);
    out.emplace_back(t.name, std::move(copy));
  };
  for (const NamedTensor& p : model.NamedParameters()) copy_once(p);
  for (const NamedTensor& b : model.NamedBuffers()) copy_once(b);
  std::set<std::string> named;
  for (const auto& [name, copy] : out) named.insert(name);
  for (const NamedTensor& entry : model.StateDictEntries()) {
    if (named.count(entry.name)) continue;
    auto it = copies.find(entry.tensor.unsafeGetTensorImpl());
    if (it == copies.end()) {
      copy_once(entry);
    } else {
      out.emplace_back(entry.name, it->second);
    }
    named.insert(entry.name);
  }
  return out;
}

// The optimizer state of one parameter ("optim.<i>.*" entries) into
// `train_state`, each tensor through `copy_as` with key "t/<entry>";
// nothing when its optimizer holds none yet.
void CollectOptimizerState(const OptimizedParam& op, const CopyAs& copy_as,
                           std::vector<std::pair<std::string, at::Tensor>>& train_state) {
  auto it = op.optimizer->state().find(OptimizerStateKeyOf(op.param));
  if (it == op.optimizer->state().end()) return;
  const std::string prefix = absl::StrCat("optim.", op.index, ".");
  auto copied = [&](const std::string& entry, const at::Tensor& t) {
    train_state.emplace_back(prefix + entry, copy_as("t/" + prefix + entry, t));
  };
  if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
    if (sgd->momentum_buffer().defined()) copied("momentum_buffer", sgd->momentum_buffer());
  } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
    train_state.emplace_back(prefix + "step", Scalar(adam->step()));
    copied("exp_avg", adam->exp_avg());
    copied("exp_avg_sq", adam->exp_avg_sq());
    if (adam->max_exp_avg_sq().defined()) copied("max_exp_avg_sq", adam->max_exp_avg_sq());
  } else if (auto* accum = dynamic_cast<AccumAdamParamState*>(it->second.get())) {
    train_state.emplace_back(prefix + "step", Scalar(accum->step()));
    train_state.emplace_back(prefix + "count", Scalar(accum->count()));
    copied("exp_avg", accum->exp_avg());
    copied("exp_avg_sq", accum->exp_avg_sq());
    copied("accum", accum->accum());
  } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
    train_state.emplace_back(prefix + "step", Scalar(adamw->step()));
    copied("exp_avg", adamw->exp_avg());
    copied("exp_avg_sq", adamw->exp_avg_sq());
    if (adamw->max_exp_avg_sq().defined()) copied("max_exp_avg_sq", adamw->max_exp_avg_sq());
  }
}

// What TakeSnapshot copies, each tensor through `copy_as(key, tensor)`: key
// "m/<name>" for the model's entries, "t/<name>" for the training state's.
Snapshot CollectSnapshot(Model& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                         const TrainingPosition& position, const ExchangeState* exchange,
                         const CopyAs& copy_as) {
  torch::NoGradGuard no_grad;
  Snapshot s;
  s.position = position;
  s.model = CollectModel(model, copy_as);
  for (const OptimizedParam& op : OptimizedParams(model, optimizers))
    CollectOptimizerState(op, copy_as, s.train_state);
  AddPosition(position, s.train_state);
  if (exchange != nullptr && !exchange->received.empty()) {
    for (const NamedTensor& r : exchange->received) {
      s.train_state.emplace_back(kExchangePrefix + r.name,
                                 copy_as(std::string("t/") + kExchangePrefix + r.name, r.tensor));
    }
    s.train_state.emplace_back("meta.exchange_pair", Scalar(exchange->pair ? 1 : 0));
  }
  return s;
}

// Copies the checkpoint's `weights` into the model's parameters and
// buffers; INVALID_ARGUMENT naming the tensor when one is missing or
// differs in shape or type (a checkpoint of another model).
absl::Status RestoreWeights(const std::map<std::string, at::Tensor>& weights, Model& model) {
  std::vector<NamedTensor> targets = model.NamedParameters();
  for (NamedTensor& b : model.NamedBuffers()) targets.push_back(b);
  for (NamedTensor& t : targets) {
    auto it = weights.find(t.name);
    if (it == weights.end()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", kModelFile, " has no tensor \"",
                                                     t.name,
                                                     "\": it was written by a different model"));
    }
    if (it->second.sizes() != t.tensor.sizes() ||
        it->second.scalar_type() != t.tensor.scalar_type()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint tensor \"", t.name, "\" is ", c10::str(it->second.sizes()),
                       ", the model's is ", c10::str(t.tensor.sizes()), ": a different model"));
    }
    t.tensor.copy_(it->second);
  }
  return absl::OkStatus();
}

// The optimizer state of one parameter from train_state.pt (`get(key)`,
// undefined when absent), on the parameter's device; none when the
// checkpoint holds none for it.
void RestoreOptimizerState(const OptimizedParam& op,
                           const std::function<at::Tensor(const std::string&)>& get) {
  torch::optim::Optimizer& optimizer = *op.optimizer;
  const bool adam = dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr;
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  const bool accum = dynamic_cast<AccumAdam*>(&optimizer) != nullptr;
  // The state on its parameter's device (a checkpoint holds CPU tensors).
  const auto placed = [&op](const at::Tensor& t) {
    return t.to(at::TensorOptions().device(op.param.device()), /*non_blocking=*/false,
                /*copy=*/true);
  };
  const std::string prefix = absl::StrCat("optim.", op.index, ".");
  const OptimizerStateKey key = OptimizerStateKeyOf(op.param);
  if (accum) {
    if (!get(prefix + "exp_avg").defined()) return;
    auto st = std::make_unique<AccumAdamParamState>();
    st->step(get(prefix + "step").item<int64_t>());
    st->count(get(prefix + "count").item<int64_t>());
    st->exp_avg(placed(get(prefix + "exp_avg")));
    st->exp_avg_sq(placed(get(prefix + "exp_avg_sq")));
    st->accum(placed(get(prefix + "accum")));
    optimizer.state()[key] = std::move(st);
  } else if (adam || adamw) {
    if (!get(prefix + "exp_avg").defined()) return;
    auto fill = [&](auto s) {
      s->step(get(prefix + "step").item<int64_t>());
      s->exp_avg(placed(get(prefix + "exp_avg")));
      s->exp_avg_sq(placed(get(prefix + "exp_avg_sq")));
      if (get(prefix + "max_exp_avg_sq").defined())
        s->max_exp_avg_sq(placed(get(prefix + "max_exp_avg_sq")));
      optimizer.state()[key] = std::move(s);
    };
    if (adam) fill(std::make_unique<torch::optim::AdamParamState>());
    if (adamw) fill(std::make_unique<torch::optim::AdamWParamState>());
  } else if (get(prefix + "momentum_buffer").defined()) {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(placed(get(prefix + "momentum_buffer")));
    optimizer.state()[key] = std::move(s);
  }
}

// What one store's result means for the run.
struct StoreOutcome {
  absl::Status status;             // what fails the run when not OK
  bool skipped = false;            // a periodic one given up: training goes on
  bool already_committed = false;  // Note [A final checkpoint already committed]
};

// Note [A final checkpoint already committed]
// A generation that formed after the job's last step (a rank was lost while the
// others shut down) holds the same state at that step as the generation that
// committed its final checkpoint; storing it again is refused ALREADY_EXISTS,
// and the checkpoint the job ends with is there. Failing the rank for it
// restarted such jobs until they ran out of restarts. A periodic step is never
// stored twice, so there ALREADY_EXISTS stays an error.
StoreOutcome OutcomeOf(const StoreRetryResult& stored, bool final, int64_t step) {
  StoreOutcome outcome;
  outcome.status = stored.status;
  if (final && absl::IsAlreadyExists(stored.status)) {
    LOG(INFO) << "final checkpoint step " << step << " was committed by an earlier generation ("
              << stored.status.message() << ")";
    outcome.status = absl::OkStatus();
    outcome.already_committed = true;
  }
  outcome.skipped = !final && stored.gave_up_unreachable;
  if (outcome.skipped) {
    LOG(WARNING) << "checkpoint step " << step
                 << " skipped, training goes on: " << stored.status.message();
  }
  return outcome;
}

}  // namespace

Snapshot TakeSnapshot(Model& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                      const TrainingPosition& position, const Snapshot* reuse,
                      const ExchangeState* exchange) {
  std::map<std::string, at::Tensor> spare;
  if (reuse != nullptr) {
    for (const auto& [name, t] : reuse->model) spare["m/" + name] = t;
    for (const auto& [name, t] : reuse->train_state) spare["t/" + name] = t;
  }
  // The GPU whose copies to the host were queued, if any (Note
  // [Asynchronous device snapshots]).
  int queued_on = -1;
  Snapshot s = CollectSnapshot(
      model, optimizers, position, exchange,
      [&spare, &queued_on, to_host = reuse != nullptr](const std::string& key,
                                                       const at::Tensor& t) {
        if (!to_host) return Copy(t);
        const bool cuda = t.is_cuda();
        if (cuda) queued_on = t.get_device();
        auto it = spare.find(key);
        if (it != spare.end() && it->second.is_cpu() && it->second.sizes() == t.sizes() &&
            it->second.scalar_type() == t.scalar_type() && it->second.is_contiguous() &&
            (!cuda || it->second.is_pinned())) {
          return it->second.copy_(t.detach(), /*non_blocking=*/cuda);
        }
        if (!cuda) return Copy(t);
        at::Tensor host =
            at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).pinned_memory(true));
        return host.copy_(t.detach(), /*non_blocking=*/true);
      });
  if (queued_on >= 0) {
    absl::StatusOr<std::shared_ptr<DeviceFence>> fence = DeviceFence::Record(queued_on);
    if (fence.ok()) {
      s.ready = *std::move(fence);
    } else {
      // Without a fence nobody could tell when the copies are done: wait
      // for them here, as a synchronous copy would.
      LOG(WARNING) << fence.status() << "; the checkpoint's copies are waited for at once";
      // A synchronous copy on the same stream returns after the queued ones.
      (void)at::zeros({1}, at::TensorOptions().device(at::kCUDA, queued_on)).item<float>();
    }
  }
  return s;
}

Snapshot SnapshotLayout(Model& model, const std::vector<torch::optim::Optimizer*>& optimizers) {
  return CollectSnapshot(
      model, optimizers, TrainingPosition{}, nullptr, [](const std::string&, const at::Tensor& t) {
        return at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).device(at::kMeta));
      });
}

Snapshot AllocateLike(const Snapshot& layout, bool pinned) {
  auto allocate = [pinned](const std::vector<std::pair<std::string, at::Tensor>>& from,
                           std::vector<std::pair<std::string, at::Tensor>>& to) {
    // A tied weight's names share one copy in the layout, and so here.
    std::map<const c10::TensorImpl*, at::Tensor> made;
    for (const auto& [name, t] : from) {
      if (!t.device().is_meta())
        continue;  // step counters and the like: made afresh by every snapshot
      if (auto it = made.find(t.unsafeGetTensorImpl()); it != made.end()) {
        to.emplace_back(name, it->second);
        continue;
      }
      at::Tensor memory =
          at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).pinned_memory(pinned));
      // Written once here, so that its pages are faulted in off the
      // training thread.
      std::memset(memory.data_ptr(), 0, memory.nbytes());
      made.emplace(t.unsafeGetTensorImpl(), memory);
      to.emplace_back(name, std::move(memory));
    }
  };
  Snapshot s;
  allocate(layout.model, s.model);
  allocate(layout.train_state, s.train_state);
  return s;
}

std::vector<CheckpointFileSource> StreamFiles(const Snapshot& snapshot) {
  return {TensorFileSource(ModelFileName(snapshot.rank), snapshot.model),
          TensorFileSource(TrainStateFileName(snapshot.rank), snapshot.train_state)};
}

absl::StatusOr<TrainingPosition> Restore(const std::vector<CheckpointFileData>& files, Model& model,
                                         const std::vector<torch::optim::Optimizer*>& optimizers,
                                         ExchangeState* exchange) {
  const CheckpointFileData* model_file = nullptr;
  const CheckpointFileData* state_file = nullptr;
  for (const CheckpointFileData& f : files) {
    if (f.name == kModelFile) model_file = &f;
    if (f.name == kTrainStateFile) state_file = &f;
  }
  if (model_file == nullptr || state_file == nullptr) {
    return absl::DataLossError(
        absl::StrCat("a checkpoint needs ", kModelFile, " and ", kTrainStateFile));
  }
  ASSIGN_OR_RETURN(auto weights, ReadTensorFile(*model_file));
  ASSIGN_OR_RETURN(auto state, ReadTensorFile(*state_file));
  torch::NoGradGuard no_grad;
  RETURN_IF_ERROR(RestoreWeights(weights, model));
  auto get = [&](const std::string& key) -> at::Tensor {
    auto it = state.find(key);
    return it == state.end() ? at::Tensor() : it->second;
  };
  for (const char* key : {"meta.step", "meta.epoch", "meta.epoch_offset"}) {
    if (!get(key).defined())
      return absl::DataLossError(absl::StrCat("checkpoint ", kTrainStateFile, " lacks ", key));
  }
  for (const OptimizedParam& op : OptimizedParams(model, optimizers))
    RestoreOptimizerState(op, get);
  const TrainingPosition position = ReadPosition(get);
  if (exchange != nullptr) {
    *exchange = ExchangeState();
    exchange->pair =
        get("meta.exchange_pair").defined() && get("meta.exchange_pair").item<int64_t>() != 0;
    for (const auto& [key, tensor] : state) {
      if (absl::StartsWith(key, kExchangePrefix)) {
        exchange->received.push_back({key.substr(sizeof(kExchangePrefix) - 1), tensor});
      }
    }
  }
  return position;
}

CheckpointWriter::CheckpointWriter(CheckpointStorage& storage, CheckpointWriterOptions options)
    : storage_(storage), options_(options), thread_([this] { Loop(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool CheckpointWriter::Offer(Snapshot snapshot, bool final) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_) {
      ++skipped_;
      return false;
    }
    pending_ = std::move(snapshot);
    pending_final_ = final;
    busy_ = true;
  }
  cv_.notify_all();
  return true;
}

absl::Status CheckpointWriter::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_; });
  return error_;
}

bool CheckpointWriter::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

void CheckpointWriter::NoteSkipped() {
  std::lock_guard<std::mutex> lock(mu_);
  ++skipped_;
}

int64_t CheckpointWriter::skipped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return skipped_;
}

int64_t CheckpointWriter::stored() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stored_;
}

int64_t CheckpointWriter::skipped_unreachable() const {
  std::lock_guard<std::mutex> lock(mu_);
  return skipped_unreachable_;
}

int64_t CheckpointWriter::store_retries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return store_retries_;
}

double CheckpointWriter::last_serialize_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_serialize_seconds_;
}

double CheckpointWriter::last_store_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_store_seconds_;
}

int64_t CheckpointWriter::last_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_bytes_;
}

void CheckpointWriter::Loop() {
  while (true) {
    Snapshot snapshot;
    bool final = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || pending_.has_value(); });
      if (!pending_.has_value()) return;
      snapshot = std::move(*pending_);
      final = pending_final_;
      pending_.reset();
    }
    // The copies out of a GPU were only queued (Note [Asynchronous device
    // snapshots]); a failed device fails this checkpoint.
    absl::Status ready = snapshot.ready != nullptr ? snapshot.ready->Wait() : absl::OkStatus();
    // Time inside the sources minus time inside the storage's byte consumers
    // called from them (writing, uploading) = serializing. Storages write one
    // file at a time.
    absl::Duration in_sources, in_storage;
    std::vector<CheckpointFileSource> files = StreamFiles(snapshot);
    std::vector<int64_t> sizes(files.size(), 0);
    for (size_t i = 0; i < files.size(); ++i) {
      files[i].write = [&, i, write = std::move(files[i].write)](const CheckpointByteSink& out) {
        const absl::Time begin = absl::Now();
        sizes[i] = 0;
        absl::Status s = write([&](absl::string_view piece) {
          const absl::Time t = absl::Now();
          absl::Status s = out(piece);
          in_storage += absl::Now() - t;
          sizes[i] += static_cast<int64_t>(piece.size());
          return s;
        });
        in_sources += absl::Now() - begin;
        return s;
      };
    }
    const absl::Time start = absl::Now();
    StoreRetryOptions retry;
    retry.give_up_after = final ? options_.final_give_up_after : options_.periodic_give_up_after;
    retry.clock = options_.clock;
    StoreRetryResult stored;
    if (ready.ok()) {
      stored = StoreRetrying(storage_, snapshot.position.step, files, retry);
    } else {
      stored.status = ready;
      stored.attempts = 1;
    }
    const StoreOutcome outcome = OutcomeOf(stored, final, snapshot.position.step);
    // With retries, serializing counts every attempt and storing the waits
    // between them too.
    const absl::Duration serializing = in_sources - in_storage;
    const absl::Duration storing = (absl::Now() - start) - serializing;
    int64_t bytes = 0;
    for (int64_t n : sizes) bytes += n;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (outcome.status.ok() && !outcome.already_committed) {
        ++stored_;
        last_serialize_seconds_ = absl::ToDoubleSeconds(serializing);
        last_store_seconds_ = absl::ToDoubleSeconds(storing);
        last_bytes_ = bytes;
      }
      store_retries_ += stored.attempts - 1;
      if (outcome.skipped) {
        ++skipped_unreachable_;
      } else if (!outcome.status.ok() && error_.ok()) {
        error_ = outcome.status;
      }
      busy_ = false;
    }
    cv_.notify_all();
  }
}

}  // namespace chorus
