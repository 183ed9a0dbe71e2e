#include "worker/train/checkpoint.h"

#include <map>

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/train/accum_adam.h"

namespace chorus {
namespace {

std::string StateKey(const at::Tensor& param) { return c10::guts::to_string(param.unsafeGetTensorImpl()); }

at::Tensor Copy(const at::Tensor& t) { return t.detach().clone(); }

at::Tensor Scalar(int64_t v) { return torch::tensor({v}, torch::kLong); }

std::string Pickle(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t);
  std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  return std::string(bytes.begin(), bytes.end());
}

absl::StatusOr<std::map<std::string, at::Tensor>> Unpickle(const CheckpointFileData& file) {
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(std::vector<char>(file.bytes.begin(), file.bytes.end()));
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", file.name, " cannot be read: ", e.what()));
  }
  if (!value.isGenericDict()) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", file.name, " is not a dict of tensors"));
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor()) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", file.name, " holds a non-tensor entry"));
    }
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

// Each optimized parameter with its index among the model's parameters
// (the "optim.<i>." prefix of its state) and the optimizer that holds it.
struct OptimizedParam {
  int index;
  at::Tensor param;
  torch::optim::Optimizer* optimizer;
};

std::vector<OptimizedParam> OptimizedParams(Model& model, const std::vector<torch::optim::Optimizer*>& optimizers) {
  std::map<std::string, int> index;
  int i = 0;
  for (const at::Tensor& p : model.Parameters()) index[StateKey(p)] = i++;
  std::vector<OptimizedParam> out;
  for (torch::optim::Optimizer* optimizer : optimizers) {
    for (const auto& group : optimizer->param_groups()) {
      for (const at::Tensor& param : group.params()) {
        auto it = index.find(StateKey(param));
        if (it != index.end()) out.push_back({it->second, param, optimizer});
      }
    }
  }
  return out;
}

constexpr char kExchangePrefix[] = "exchange.";

}  // namespace

std::string ModelFileName(int rank) { return rank == 0 ? kModelFile : absl::StrCat("model.rank", rank, ".pt"); }

std::string TrainStateFileName(int rank) {
  return rank == 0 ? kTrainStateFile : absl::StrCat("train_state.rank", rank, ".pt");
}

Snapshot TakeSnapshot(Model& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                      const TrainingPosition& position, const Snapshot* reuse, const ExchangeState* exchange) {
  torch::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> spare;
  if (reuse != nullptr) {
    for (const auto& [name, t] : reuse->model) spare["m/" + name] = t;
    for (const auto& [name, t] : reuse->train_state) spare["t/" + name] = t;
  }
  auto copy_as = [&spare](const std::string& key, const at::Tensor& t) {
    auto it = spare.find(key);
    if (it != spare.end() && it->second.sizes() == t.sizes() && it->second.scalar_type() == t.scalar_type() &&
        it->second.is_contiguous()) {
      return it->second.copy_(t.detach());
    }
    return Copy(t);
  };
  Snapshot s;
  s.position = position;
  for (const NamedTensor& p : model.NamedParameters()) s.model.emplace_back(p.name, copy_as("m/" + p.name, p.tensor));
  for (const NamedTensor& b : model.NamedBuffers()) s.model.emplace_back(b.name, copy_as("m/" + b.name, b.tensor));
  for (const OptimizedParam& op : OptimizedParams(model, optimizers)) {
    {
      auto it = op.optimizer->state().find(StateKey(op.param));
      const std::string prefix = absl::StrCat("optim.", op.index, ".");
      if (it == op.optimizer->state().end()) continue;
      if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
        if (sgd->momentum_buffer().defined()) {
          s.train_state.emplace_back(prefix + "momentum_buffer",
                                     copy_as("t/" + prefix + "momentum_buffer", sgd->momentum_buffer()));
        }
      } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
        s.train_state.emplace_back(prefix + "step", Scalar(adam->step()));
        s.train_state.emplace_back(prefix + "exp_avg", copy_as("t/" + prefix + "exp_avg", adam->exp_avg()));
        s.train_state.emplace_back(prefix + "exp_avg_sq", copy_as("t/" + prefix + "exp_avg_sq", adam->exp_avg_sq()));
        if (adam->max_exp_avg_sq().defined()) s.train_state.emplace_back(prefix + "max_exp_avg_sq", copy_as("t/" + prefix + "max_exp_avg_sq", adam->max_exp_avg_sq()));
      } else if (auto* accum = dynamic_cast<AccumAdamParamState*>(it->second.get())) {
        s.train_state.emplace_back(prefix + "step", Scalar(accum->step()));
        s.train_state.emplace_back(prefix + "count", Scalar(accum->count()));
        s.train_state.emplace_back(prefix + "exp_avg", copy_as("t/" + prefix + "exp_avg", accum->exp_avg()));
        s.train_state.emplace_back(prefix + "exp_avg_sq", copy_as("t/" + prefix + "exp_avg_sq", accum->exp_avg_sq()));
        s.train_state.emplace_back(prefix + "accum", copy_as("t/" + prefix + "accum", accum->accum()));
      } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
        s.train_state.emplace_back(prefix + "step", Scalar(adamw->step()));
        s.train_state.emplace_back(prefix + "exp_avg", copy_as("t/" + prefix + "exp_avg", adamw->exp_avg()));
        s.train_state.emplace_back(prefix + "exp_avg_sq", copy_as("t/" + prefix + "exp_avg_sq", adamw->exp_avg_sq()));
        if (adamw->max_exp_avg_sq().defined()) s.train_state.emplace_back(prefix + "max_exp_avg_sq", copy_as("t/" + prefix + "max_exp_avg_sq", adamw->max_exp_avg_sq()));
      }
    }
  }
  s.train_state.emplace_back("meta.step", Scalar(position.step));
  s.train_state.emplace_back("meta.epoch", Scalar(position.epoch));
  s.train_state.emplace_back("meta.epoch_offset", Scalar(position.epoch_offset));
  s.train_state.emplace_back("meta.world_size", Scalar(position.world_size));
  if (exchange != nullptr && !exchange->received.empty()) {
    for (const NamedTensor& r : exchange->received) {
      s.train_state.emplace_back(kExchangePrefix + r.name, copy_as(std::string("t/") + kExchangePrefix + r.name, r.tensor));
    }
    s.train_state.emplace_back("meta.exchange_pair", Scalar(exchange->pair ? 1 : 0));
  }
  return s;
}

std::vector<CheckpointFileData> Serialize(const Snapshot& snapshot) {
  return {{ModelFileName(snapshot.rank), Pickle(snapshot.model)},
          {TrainStateFileName(snapshot.rank), Pickle(snapshot.train_state)}};
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
    return absl::DataLossError(absl::StrCat("a checkpoint needs ", kModelFile, " and ", kTrainStateFile));
  }
  ASSIGN_OR_RETURN(auto weights, Unpickle(*model_file));
  ASSIGN_OR_RETURN(auto state, Unpickle(*state_file));
  torch::NoGradGuard no_grad;
  std::vector<NamedTensor> targets = model.NamedParameters();
  for (NamedTensor& b : model.NamedBuffers()) targets.push_back(b);
  for (NamedTensor& t : targets) {
    auto it = weights.find(t.name);
    if (it == weights.end()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", kModelFile, " has no tensor \"", t.name,
                                                     "\": it was written by a different model"));
    }
    if (it->second.sizes() != t.tensor.sizes() || it->second.scalar_type() != t.tensor.scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint tensor \"", t.name, "\" is ",
                                                     c10::str(it->second.sizes()), ", the model's is ",
                                                     c10::str(t.tensor.sizes()), ": a different model"));
    }
    t.tensor.copy_(it->second);
  }
  auto get = [&](const std::string& key) -> at::Tensor {
    auto it = state.find(key);
    return it == state.end() ? at::Tensor() : it->second;
  };
  for (const char* key : {"meta.step", "meta.epoch", "meta.epoch_offset"}) {
    if (!get(key).defined()) return absl::DataLossError(absl::StrCat("checkpoint ", kTrainStateFile, " lacks ", key));
  }
  for (const OptimizedParam& op : OptimizedParams(model, optimizers)) {
    torch::optim::Optimizer& optimizer = *op.optimizer;
    const bool adam = dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr;
    const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
    const bool accum = dynamic_cast<AccumAdam*>(&optimizer) != nullptr;
    {
      const std::string prefix = absl::StrCat("optim.", op.index, ".");
      const std::string key = StateKey(op.param);
      if (accum) {
        if (!get(prefix + "exp_avg").defined()) continue;
        auto st = std::make_unique<AccumAdamParamState>();
        st->step(get(prefix + "step").item<int64_t>());
        st->count(get(prefix + "count").item<int64_t>());
        st->exp_avg(get(prefix + "exp_avg").clone());
        st->exp_avg_sq(get(prefix + "exp_avg_sq").clone());
        st->accum(get(prefix + "accum").clone());
        optimizer.state()[key] = std::move(st);
      } else if (adam || adamw) {
        if (!get(prefix + "exp_avg").defined()) continue;
        auto fill = [&](auto s) {
          s->step(get(prefix + "step").item<int64_t>());
          s->exp_avg(get(prefix + "exp_avg").clone());
          s->exp_avg_sq(get(prefix + "exp_avg_sq").clone());
          if (get(prefix + "max_exp_avg_sq").defined()) s->max_exp_avg_sq(get(prefix + "max_exp_avg_sq").clone());
          optimizer.state()[key] = std::move(s);
        };
        if (adam) fill(std::make_unique<torch::optim::AdamParamState>());
        if (adamw) fill(std::make_unique<torch::optim::AdamWParamState>());
      } else if (get(prefix + "momentum_buffer").defined()) {
        auto s = std::make_unique<torch::optim::SGDParamState>();
        s->momentum_buffer(get(prefix + "momentum_buffer").clone());
        optimizer.state()[key] = std::move(s);
      }
    }
  }
  TrainingPosition position;
  position.step = get("meta.step").item<int64_t>();
  position.epoch = get("meta.epoch").item<int64_t>();
  position.epoch_offset = get("meta.epoch_offset").item<int64_t>();
  if (get("meta.world_size").defined()) position.world_size = get("meta.world_size").item<int64_t>();
  if (exchange != nullptr) {
    *exchange = ExchangeState();
    exchange->pair = get("meta.exchange_pair").defined() && get("meta.exchange_pair").item<int64_t>() != 0;
    for (const auto& [key, tensor] : state) {
      if (absl::StartsWith(key, kExchangePrefix)) {
        exchange->received.push_back({key.substr(sizeof(kExchangePrefix) - 1), tensor});
      }
    }
  }
  return position;
}

CheckpointWriter::CheckpointWriter(CheckpointSink& sink) : sink_(sink), thread_([this] { Loop(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool CheckpointWriter::Offer(Snapshot snapshot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_) {
      ++skipped_;
      return false;
    }
    pending_ = std::move(snapshot);
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
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || pending_.has_value(); });
      if (!pending_.has_value()) return;
      snapshot = std::move(*pending_);
      pending_.reset();
    }
    const absl::Time start = absl::Now();
    std::vector<CheckpointFileData> files = Serialize(snapshot);
    const absl::Time serialized = absl::Now();
    absl::Status s = sink_.Store(snapshot.position.step, files);
    const absl::Time stored = absl::Now();
    int64_t bytes = 0;
    for (const CheckpointFileData& f : files) bytes += static_cast<int64_t>(f.bytes.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (s.ok()) {
        ++stored_;
        last_serialize_seconds_ = absl::ToDoubleSeconds(serialized - start);
        last_store_seconds_ = absl::ToDoubleSeconds(stored - serialized);
        last_bytes_ = bytes;
      }
      if (!s.ok() && error_.ok()) error_ = s;
      busy_ = false;
    }
    cv_.notify_all();
  }
}

}  // namespace chorus
