// NormalizeJobSpec, ValidateJobSpec and CheckJobSpec (see job_spec.h).

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/memory_estimate.h"
#include "common/paths.h"
#include "common/program_spec.h"

namespace chorus {
namespace {

using v1::JobSpec;

constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
// resources.max_ranks at most; checks that enumerate ranks or world sizes
// skip a spec beyond it (the limit is its error). What one coordinator is
// shown to hold (bench/load_bench, docs/benchmarks.md): 16,384 ranks
// in 2,048 agents. The memory a rank needs is checked separately, against
// each agent's (common/memory_estimate.h).
constexpr int kMaxRanks = 16384;

// Collects errors with their field paths; every check says what is allowed.
class Checker {
 public:
  template <typename T>
  void Positive(const std::string& field, T value) {
    if (!(value > 0)) Fail(field, absl::StrCat("must be > 0, got ", value));
  }
  template <typename T>
  void AtLeast(const std::string& field, T value, T min) {
    if (!(value >= min)) {
      Fail(field, absl::StrCat("must be >= ", min, ", got ", value));
    }
  }
  template <typename T>
  void AtMost(const std::string& field, T value, T max) {
    if (!(value <= max)) {
      Fail(field, absl::StrCat("must be <= ", max, ", got ", value));
    }
  }
  // value in [lo, hi) or [lo, hi].
  void InRange(const std::string& field, double value, double lo, double hi, bool hi_inclusive) {
    bool ok = std::isfinite(value) && value >= lo && (hi_inclusive ? value <= hi : value < hi);
    if (!ok) {
      Fail(field,
           absl::StrCat("must be in [", lo, ", ", hi, hi_inclusive ? "]" : ")", ", got ", value));
    }
  }
  void Fail(const std::string& field, std::string message) {
    errors_.push_back({field, std::move(message)});
  }
  std::vector<SpecError> Take() { return std::move(errors_); }

 private:
  std::vector<SpecError> errors_;
};

void ValidateModel(const JobSpec& spec, Checker& c) {
  const v1::ModelSpec& m = spec.model();
  switch (m.kind_case()) {
    case v1::ModelSpec::KIND_NOT_SET:
      c.Fail("model",
             "is required: set one of mlp, cnn, transformer_lm, torchscript (or set program to "
             "run your own training program, docs/programs.md)");
      break;
    case v1::ModelSpec::kMlp:
      for (int i = 0; i < m.mlp().hidden_sizes_size(); ++i) {
        c.Positive(absl::StrCat("model.mlp.hidden_sizes[", i, "]"), m.mlp().hidden_sizes(i));
      }
      c.InRange("model.mlp.dropout", m.mlp().dropout(), 0, 1, false);
      break;
    case v1::ModelSpec::kCnn:
      if (m.cnn().channels_size() != 2) {
        c.Fail("model.cnn.channels", absl::StrCat("must list 2 values (one per conv layer), got ",
                                                  m.cnn().channels_size()));
      }
      for (int i = 0; i < m.cnn().channels_size(); ++i) {
        c.Positive(absl::StrCat("model.cnn.channels[", i, "]"), m.cnn().channels(i));
      }
      if (m.cnn().kernel_size() <= 0 || m.cnn().kernel_size() % 2 == 0 ||
          m.cnn().kernel_size() > 11) {
        c.Fail("model.cnn.kernel_size",
               absl::StrCat("must be odd and in [1, 11], got ", m.cnn().kernel_size()));
      }
      c.Positive("model.cnn.fc_hidden", m.cnn().fc_hidden());
      c.InRange("model.cnn.dropout", m.cnn().dropout(), 0, 1, false);
      break;
    case v1::ModelSpec::kTransformerLm: {
      const v1::TransformerLmModel& t = m.transformer_lm();
      c.AtLeast("model.transformer_lm.vocab_size", t.vocab_size(), 2);
      c.Positive("model.transformer_lm.context_length", t.context_length());
      c.Positive("model.transformer_lm.d_model", t.d_model());
      c.Positive("model.transformer_lm.num_heads", t.num_heads());
      c.Positive("model.transformer_lm.num_layers", t.num_layers());
      c.Positive("model.transformer_lm.d_ff", t.d_ff());
      c.InRange("model.transformer_lm.dropout", t.dropout(), 0, 1, false);
      if (t.num_heads() > 0 && t.d_model() > 0 && t.d_model() % t.num_heads() != 0) {
        c.Fail("model.transformer_lm.d_model", absl::StrCat("must be divisible by num_heads (",
                                                            t.num_heads(), "), got ", t.d_model()));
      }
      break;
    }
    case v1::ModelSpec::kTorchscript:
      if (m.torchscript().path().empty()) {
        c.Fail("model.torchscript.path", "is required: the file written by torch.jit.save");
      }
      break;
  }
}

// A TAR member suffix (data.shards.input_member or target_member) of a type
// that is read, by its last extension ("x.npy", or WebDataset's "npy").
// Text labels (Note [Text label members] in worker/train/tar_members.cc)
// are targets only; images are not decoded.
void CheckTarMember(const std::string& field, const std::string& member, bool target,
                    Checker& c) {
  const size_t dot = member.rfind('.');
  const std::string ext = dot == std::string::npos ? member : member.substr(dot + 1);
  if (ext == "npy" || ext == "pt" || ext == "pth") return;
  const bool text = ext == "cls" || ext == "txt" || ext == "json";
  if (text && target) return;
  if (ext == "jpg" || ext == "jpeg" || ext == "png" || ext == "webp" || ext == "gif") {
    c.Fail(field, absl::StrCat("\"", member, "\" members are images, which are not decoded "
                               "(image decoding is out of scope): store each sample's decoded "
                               "pixels as a .npy member instead (uint8 [H, W, C], numpy.save), "
                               "e.g. KEY.x.npy, and set this field to \"x.npy\""));
    return;
  }
  c.Fail(field,
         absl::StrCat(text ? "a text member (.cls, .txt, .json) holds a label: it can be the "
                             "target_member, not the input; "
                           : "",
                      "must end in .npy (NumPy), .pt or .pth (torch.save of a tensor)",
                      target ? ", or .cls, .txt or .json (an integer class label as text)" : "",
                      ", the member types that are read; got \"", member, "\""));
}

// data.shards (normalized): files named, sizes positive, the fields of the
// other format left unset.
void ValidateShards(const JobSpec& spec, Checker& c) {
  const v1::ShardedData& s = spec.data().shards();
  if (s.format() == v1::ShardedData::FORMAT_UNSPECIFIED ||
      !v1::ShardedData::Format_IsValid(s.format())) {
    c.Fail("data.shards.format",
           absl::StrCat("must be TAR, TOKENS or TENSOR_FILES, got ", s.format()));
  }
  if (s.paths_size() == 0) {
    c.Fail("data.shards.paths",
           "is required: the shard files (paths or globs such as /data/train-*.tar)");
  }
  for (int i = 0; i < s.paths_size(); ++i) {
    if (s.paths(i).empty()) c.Fail(absl::StrCat("data.shards.paths[", i, "]"), "is empty");
  }
  for (int i = 0; i < s.eval_paths_size(); ++i) {
    if (s.eval_paths(i).empty()) {
      c.Fail(absl::StrCat("data.shards.eval_paths[", i, "]"), "is empty");
    }
  }
  c.Positive("data.shards.read_ahead_bytes", s.read_ahead_bytes());
  c.Positive("data.shards.shuffle_buffer", s.shuffle_buffer());
  c.AtLeast("data.shards.num_classes", s.num_classes(), 0);
  if (s.format() == v1::ShardedData::TAR) {
    if (s.input_member() == s.target_member()) {
      c.Fail("data.shards.target_member",
             absl::StrCat("must differ from input_member, both are \"", s.input_member(), "\""));
    }
    CheckTarMember("data.shards.input_member", s.input_member(), /*target=*/false, c);
    CheckTarMember("data.shards.target_member", s.target_member(), /*target=*/true, c);
  }
  if (s.format() == v1::ShardedData::TENSOR_FILES &&
      (!s.input_member().empty() || !s.target_member().empty())) {
    c.Fail("data.shards.input_member",
           "and target_member are for format TAR; TENSOR_FILES files hold dicts with keys 'x' "
           "and 'y'");
  }
  if (s.format() == v1::ShardedData::TAR || s.format() == v1::ShardedData::TENSOR_FILES) {
    if (s.sequence_length() != 0 || s.token_type() != v1::ShardedData::TOKEN_TYPE_UNSPECIFIED) {
      c.Fail("data.shards.sequence_length",
             absl::StrCat("and token_type are for format TOKENS, not ",
                          v1::ShardedData::Format_Name(s.format())));
    }
    if (spec.model().has_transformer_lm()) {
      if (s.num_classes() != 0) {
        c.Fail("data.shards.num_classes",
               "is for classification; a transformer_lm's classes are its tokens "
               "(model.transformer_lm.vocab_size)");
      }
    } else if (s.num_classes() == 0 && spec.loss().kind() == v1::LossSpec::CROSS_ENTROPY) {
      c.Fail("data.shards.num_classes",
             "is required with CROSS_ENTROPY loss: the number of classes of the targets");
    }
  }
  if (s.format() == v1::ShardedData::TOKENS) {
    c.Positive("data.shards.sequence_length", s.sequence_length());
    if (!v1::ShardedData::TokenType_IsValid(s.token_type())) {
      c.Fail("data.shards.token_type", absl::StrCat("unknown value ", s.token_type()));
    }
    if (!s.input_member().empty() || !s.target_member().empty() || s.num_classes() != 0) {
      c.Fail("data.shards.input_member",
             "target_member and num_classes are for format TAR, not TOKENS (the vocabulary is "
             "model.transformer_lm.vocab_size)");
    }
    if (spec.model().has_transformer_lm() &&
        s.sequence_length() > spec.model().transformer_lm().context_length()) {
      c.Fail("data.shards.sequence_length",
             absl::StrCat("must be at most model.transformer_lm.context_length (",
                          spec.model().transformer_lm().context_length(), "), got ",
                          s.sequence_length()));
    }
  }
}

void ValidateData(const JobSpec& spec, Checker& c) {
  const v1::DataSpec& d = spec.data();
  switch (d.source_case()) {
    case v1::DataSpec::SOURCE_NOT_SET:
      c.Fail("data", "is required: set one of fashion_mnist, synthetic, tensor_file, shards");
      break;
    case v1::DataSpec::kFashionMnist:
      c.AtLeast<int64_t>("data.fashion_mnist.train_limit", d.fashion_mnist().train_limit(), 0);
      break;
    case v1::DataSpec::kSynthetic: {
      const v1::SyntheticData& s = d.synthetic();
      c.Positive("data.synthetic.num_samples", s.num_samples());
      if (s.input_shape_size() == 0) {
        c.Fail("data.synthetic.input_shape", "must list at least one dimension");
      }
      for (int i = 0; i < s.input_shape_size(); ++i) {
        c.Positive(absl::StrCat("data.synthetic.input_shape[", i, "]"), s.input_shape(i));
      }
      if (s.kind() == v1::SyntheticData::CLASSIFICATION) {
        c.AtLeast("data.synthetic.num_classes", s.num_classes(), 2);
      }
      if (!v1::SyntheticData::Kind_IsValid(s.kind())) {
        c.Fail("data.synthetic.kind", absl::StrCat("unknown value ", s.kind()));
      }
      break;
    }
    case v1::DataSpec::kTensorFile:
      if (d.tensor_file().path().empty()) {
        c.Fail("data.tensor_file.path", "is required: a .pt file holding tensors x and y");
      }
      break;
    case v1::DataSpec::kShards:
      ValidateShards(spec, c);
      break;
  }
  if (!v1::DataSpec::Remainder_IsValid(d.remainder())) {
    c.Fail("data.remainder", absl::StrCat("unknown value ", d.remainder()));
  }

  // Model and data must fit together.
  const bool lm = spec.model().has_transformer_lm();
  const bool tokens = d.has_synthetic() && d.synthetic().kind() == v1::SyntheticData::TOKENS;
  const bool token_shards = d.has_shards() && d.shards().format() == v1::ShardedData::TOKENS;
  if (lm && !tokens && !d.has_tensor_file() && !d.has_shards()) {
    c.Fail("data",
           "model.transformer_lm needs token data: use synthetic { kind: TOKENS }, a tensor_file "
           "or shards (TOKENS, or TAR and TENSOR_FILES of int64 token sequences)");
  }
  if (token_shards && !lm && !spec.model().has_torchscript()) {
    c.Fail("data.shards.format", "TOKENS shards need model.transformer_lm or a torchscript model");
  }
  if (tokens && !lm && !spec.model().has_torchscript()) {
    c.Fail("data.synthetic.kind", "TOKENS data needs model.transformer_lm or a torchscript model");
  }
  if (d.has_fashion_mnist() && spec.loss().kind() == v1::LossSpec::MSE) {
    c.Fail("loss.kind", "Fashion-MNIST labels are classes: use CROSS_ENTROPY, got MSE");
  }
  if (d.has_synthetic() && d.synthetic().kind() == v1::SyntheticData::REGRESSION &&
      spec.loss().kind() != v1::LossSpec::MSE) {
    c.Fail("loss.kind", "synthetic REGRESSION data needs MSE loss");
  }
}

void ValidateOptimizer(const JobSpec& spec, Checker& c) {
  const v1::OptimizerSpec& o = spec.optimizer();
  if (!v1::OptimizerSpec::Kind_IsValid(o.kind())) {
    c.Fail("optimizer.kind", absl::StrCat("unknown value ", o.kind()));
  }
  c.Positive("optimizer.lr", o.lr());
  c.InRange("optimizer.momentum", o.momentum(), 0, 1, false);
  c.AtLeast("optimizer.weight_decay", o.weight_decay(), 0.0);
  c.InRange("optimizer.beta1", o.beta1(), 0, 1, false);
  c.InRange("optimizer.beta2", o.beta2(), 0, 1, false);
  c.Positive("optimizer.eps", o.eps());
  c.AtLeast("optimizer.accum_iter", o.accum_iter(), 1);
  if (o.nesterov() && (o.kind() != v1::OptimizerSpec::SGD || o.momentum() <= 0)) {
    c.Fail("optimizer.nesterov", "needs kind SGD and momentum > 0");
  }
  if (o.momentum() != 0 && o.kind() != v1::OptimizerSpec::SGD) {
    c.Fail("optimizer.momentum", "applies to SGD only; the Adam family uses beta1");
  }

  const v1::LrScheduleSpec& s = spec.lr_schedule();
  if (s.has_cosine()) {
    c.AtLeast<int64_t>("lr_schedule.cosine.warmup_steps", s.cosine().warmup_steps(), 0);
    c.AtLeast<int64_t>("lr_schedule.cosine.total_steps", s.cosine().total_steps(), 0);
    c.InRange("lr_schedule.cosine.min_lr_ratio", s.cosine().min_lr_ratio(), 0, 1, true);
    if (s.cosine().total_steps() > 0 && s.cosine().warmup_steps() >= s.cosine().total_steps()) {
      c.Fail("lr_schedule.cosine.warmup_steps",
             absl::StrCat("must be < total_steps (", s.cosine().total_steps(), "), got ",
                          s.cosine().warmup_steps()));
    }
  } else if (s.has_step()) {
    c.Positive("lr_schedule.step.step_size", s.step().step_size());
    c.InRange("lr_schedule.step.gamma", s.step().gamma(), 0, 1, true);
    if (s.step().gamma() == 0) c.Fail("lr_schedule.step.gamma", "must be > 0, got 0");
  }
  c.AtLeast("grad_clip_norm", spec.grad_clip_norm(), 0.0);
}

}  // namespace

TopologyConfig TopologyFromSpec(const v1::DecentralizedStrategy& d) {
  TopologyConfig config;
  switch (d.topology()) {
    case v1::DecentralizedStrategy::COMPLETE:
      config.kind = TopologyKind::kComplete;
      break;
    case v1::DecentralizedStrategy::RING:
      config.kind = TopologyKind::kRing;
      break;
    case v1::DecentralizedStrategy::ALTERNATING_EXPONENTIAL_RING:
      config.kind = TopologyKind::kAlternatingExponentialRing;
      break;
    case v1::DecentralizedStrategy::CUSTOM:
      config.kind = TopologyKind::kCustom;
      break;
    default:
      config.kind = TopologyKind::kOnePeerExponential;
      break;
  }
  config.local_world_size = std::max(1, d.local_world_size());
  for (const v1::TopologyStep& step : d.custom_steps()) {
    TopologyStep groups;
    for (const v1::TopologyGroup& g : step.groups())
      groups.emplace_back(g.ranks().begin(), g.ranks().end());
    config.custom_steps.push_back(std::move(groups));
  }
  return config;
}

bool MayHaveHotSpares(const v1::JobSpec& spec) {
  if (!spec.has_elastic() || !spec.strategy().has_decentralized()) return false;
  const TopologyConfig config = TopologyFromSpec(spec.strategy().decentralized());
  const int max_ranks = std::min(spec.resources().max_ranks(), kMaxRanks);
  for (int n = std::max(1, spec.resources().min_ranks()); n <= max_ranks; ++n) {
    if (!CheckWorldSize(config, n).ok()) return true;
  }
  return false;
}

absl::StatusOr<int> TrainingRanks(const v1::JobSpec& spec, int world_size) {
  if (!spec.has_elastic() || !spec.strategy().has_decentralized()) return world_size;
  return ServedWorldSize(TopologyFromSpec(spec.strategy().decentralized()), world_size);
}

absl::StatusOr<int> MicroBatchesPerStep(const v1::JobSpec& spec, int world_size) {
  const int64_t global = spec.training().global_batch_size();
  if (global <= 0) {
    return spec.strategy().has_ddp() ? std::max(1, spec.strategy().ddp().grad_accum_steps()) : 1;
  }
  const int64_t per_step = int64_t{spec.training().batch_size_per_rank()} * world_size;
  if (per_step <= 0 || global % per_step != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.global_batch_size ", global, " does not split into micro-batches of ",
        "training.batch_size_per_rank ", spec.training().batch_size_per_rank(), " on each of ",
        world_size, " ranks: it must be a multiple of ", spec.training().batch_size_per_rank(),
        " x ", world_size, " = ", per_step));
  }
  return static_cast<int>(global / per_step);
}

namespace {

// training.global_batch_size: a DDP job's, without grad_accum_steps or
// elastic.scale_lr (which would make the steps differ by world size), and
// one that splits into whole micro-batches at every world size the job may
// run at; the first that does not is named, with the least global batch
// that fits all of them.
void ValidateGlobalBatch(const JobSpec& spec, Checker& c) {
  const std::string field = "training.global_batch_size";
  const int64_t global = spec.training().global_batch_size();
  c.AtLeast<int64_t>(field, global, 0);
  if (global <= 0) return;
  if (!spec.strategy().has_ddp()) {
    c.Fail(field, "needs strategy ddp: gossip averaging has no global batch to keep");
    return;
  }
  if (spec.strategy().ddp().grad_accum_steps() > 1) {
    c.Fail(field, absl::StrCat("sets the micro-batches per step itself; remove "
                               "strategy.ddp.grad_accum_steps (",
                               spec.strategy().ddp().grad_accum_steps(), ")"));
  }
  if (spec.has_elastic() && spec.elastic().scale_lr()) {
    c.Fail(field,
           "keeps every step the same at every world size, elastic.scale_lr changes the learning "
           "rate with it: use one of them");
  }
  const int min_ranks = std::max(1, spec.resources().min_ranks());
  const int max_ranks = spec.resources().max_ranks();
  const int64_t batch = spec.training().batch_size_per_rank();
  if (batch <= 0 || max_ranks > kMaxRanks) return;  // their own errors
  // batch x lcm(min_ranks..max_ranks); 0 once it would pass 2^40
  int64_t fits = batch;
  for (int w = min_ranks; w <= max_ranks && fits > 0; ++w) {
    const int64_t step = batch * w;
    const int64_t factor = fits / std::gcd(fits, step);
    fits = factor <= (int64_t{1} << 40) / step ? factor * step : 0;
  }
  for (int w = min_ranks; w <= max_ranks; ++w) {
    const absl::StatusOr<int> micro = MicroBatchesPerStep(spec, w);
    if (micro.ok()) continue;
    std::string message(micro.status().message());
    message.erase(0, field.size() + 1);
    c.Fail(field, absl::StrCat(message, ", and so at every world size from resources.min_ranks ",
                               min_ranks, " to max_ranks ", max_ranks,
                               fits > 0 ? absl::StrCat(" (e.g. ", fits, ")") : std::string()));
    return;
  }
}

// Every world size the job may run at must be one the topology serves; an
// elastic job trains with the largest served size up to its world and keeps
// the other ranks as hot spares, so it only needs one. Reports the first 8
// sizes that fail. REQUIRES: a valid, non-CUSTOM topology.
void ValidateServedWorldSizes(const JobSpec& spec, Checker& c) {
  const v1::DecentralizedStrategy& d = spec.strategy().decentralized();
  const std::string p = "strategy.decentralized";
  const int min_ranks = spec.resources().min_ranks();
  const int max_ranks = spec.resources().max_ranks();
  const TopologyConfig config = TopologyFromSpec(d);
  std::vector<int> bad;
  std::string first_reason;
  for (int n = min_ranks; n <= max_ranks && bad.size() < 8; ++n) {
    absl::Status s =
        spec.has_elastic() ? ServedWorldSize(config, n).status() : CheckWorldSize(config, n);
    if (s.ok()) continue;
    if (bad.empty()) first_reason = std::string(s.message());
    bad.push_back(n);
  }
  if (bad.empty()) return;
  c.Fail(d.topology() == v1::DecentralizedStrategy::ALTERNATING_EXPONENTIAL_RING &&
                 (min_ranks % d.local_world_size() != 0 || max_ranks % d.local_world_size() != 0)
             ? p + ".local_world_size"
             : p + ".topology",
         absl::StrCat(first_reason, " (resources allow ", min_ranks, "..", max_ranks,
                      " ranks; unservable: ", absl::StrJoin(bad, ","),
                      bad.size() == 8 ? ",..." : "", ")"));
}

// One step of a CUSTOM topology (field path `sp`) over `world_size` ranks:
// its groups are non-empty and together hold every rank exactly once.
void ValidateCustomStep(const v1::TopologyStep& step, const std::string& sp, int world_size,
                        Checker& c) {
  std::set<int> seen;
  for (int g = 0; g < step.groups_size(); ++g) {
    const v1::TopologyGroup& group = step.groups(g);
    const std::string gp = absl::StrCat(sp, ".groups[", g, "].ranks");
    if (group.ranks_size() == 0) c.Fail(gp, "must not be empty");
    for (int r : group.ranks()) {
      if (r < 0 || r >= world_size) {
        c.Fail(gp, absl::StrCat("rank ", r, " is outside [0, ", world_size, ")"));
      } else if (!seen.insert(r).second) {
        c.Fail(gp, absl::StrCat("rank ", r, " appears in more than one group of this step"));
      }
    }
  }
  if (static_cast<int>(seen.size()) == world_size) return;
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r) {
    if (!seen.count(r)) missing.push_back(r);
  }
  if (!missing.empty()) {
    c.Fail(sp, absl::StrCat("every rank must be in exactly one group; missing ranks ",
                            absl::StrJoin(missing, ",")));
  }
}

// A CUSTOM topology: at least one step, a fixed world size, and every step
// valid (ValidateCustomStep).
void ValidateCustomSteps(const JobSpec& spec, Checker& c) {
  const v1::DecentralizedStrategy& d = spec.strategy().decentralized();
  const std::string p = "strategy.decentralized";
  const int min_ranks = spec.resources().min_ranks();
  const int max_ranks = spec.resources().max_ranks();
  if (d.custom_steps_size() == 0) {
    c.Fail(p + ".custom_steps", "topology CUSTOM needs at least one step");
    return;
  }
  if (min_ranks != max_ranks) {
    c.Fail(p + ".custom_steps",
           absl::StrCat("a CUSTOM topology fixes the world size: set resources.min_ranks == "
                        "max_ranks, got ",
                        min_ranks, " and ", max_ranks));
    return;
  }
  if (max_ranks > kMaxRanks) return;
  for (int s = 0; s < d.custom_steps_size(); ++s) {
    ValidateCustomStep(d.custom_steps(s), absl::StrCat(p, ".custom_steps[", s, "]"), max_ranks, c);
  }
}

void ValidateTopology(const JobSpec& spec, Checker& c) {
  const v1::DecentralizedStrategy& d = spec.strategy().decentralized();
  const std::string p = "strategy.decentralized";
  const int min_ranks = spec.resources().min_ranks();
  const int max_ranks = spec.resources().max_ranks();
  c.Positive(p + ".bucket_cap_mb", d.bucket_cap_mb());
  c.AtLeast(p + ".local_world_size", d.local_world_size(), 1);
  c.AtLeast<int64_t>(p + ".global_average_every_steps", d.global_average_every_steps(), 0);
  if (!v1::DecentralizedStrategy::Topology_IsValid(d.topology())) {
    c.Fail(p + ".topology", absl::StrCat("unknown value ", d.topology()));
    return;
  }
  if (!v1::DecentralizedStrategy::ClipMode_IsValid(d.clip_mode())) {
    c.Fail(p + ".clip_mode", absl::StrCat("unknown value ", d.clip_mode()));
  }
  if (d.topology() != v1::DecentralizedStrategy::CUSTOM && d.custom_steps_size() > 0) {
    c.Fail(p + ".custom_steps", "is only allowed with topology CUSTOM");
  }
  if (d.topology() != v1::DecentralizedStrategy::CUSTOM && min_ranks >= 1 &&
      max_ranks >= min_ranks && max_ranks <= kMaxRanks && d.local_world_size() >= 1) {
    ValidateServedWorldSizes(spec, c);
  }
  if (d.topology() == v1::DecentralizedStrategy::CUSTOM) ValidateCustomSteps(spec, c);
}

void ValidateStrategy(const JobSpec& spec, Checker& c) {
  const v1::StrategySpec& s = spec.strategy();
  if (s.has_ddp()) {
    const v1::DdpStrategy& d = s.ddp();
    c.Positive("strategy.ddp.bucket_cap_mb", d.bucket_cap_mb());
    c.Positive("strategy.ddp.first_bucket_mb", d.first_bucket_mb());
    c.AtLeast("strategy.ddp.grad_accum_steps", d.grad_accum_steps(), 1);
    if (!v1::DdpStrategy::Compression_IsValid(d.compression())) {
      c.Fail("strategy.ddp.compression", absl::StrCat("unknown value ", d.compression()));
    }
    for (int i = 0; i < d.ignored_size(); ++i) {
      if (d.ignored(i).empty()) {
        c.Fail(absl::StrCat("strategy.ddp.ignored[", i, "]"),
               "must be a parameter or buffer name or prefix, got an empty string");
      }
    }
  } else if (s.has_decentralized()) {
    ValidateTopology(spec, c);
  }
  if (spec.checkpoint().per_rank() && !s.has_decentralized()) {
    c.Fail("checkpoint.per_rank", "needs strategy.decentralized (DDP replicas are identical)");
  }
}

// resources: rank counts, threads, device and the per-rank limits (Note
// [Rank cgroups] in worker/agent/rank_cgroup.cc).
void ValidateResources(const v1::ResourceSpec& r, Checker& c) {
  c.AtLeast("resources.min_ranks", r.min_ranks(), 1);
  c.AtMost("resources.max_ranks", r.max_ranks(), kMaxRanks);
  if (r.max_ranks() < r.min_ranks()) {
    c.Fail("resources.max_ranks",
           absl::StrCat("must be >= min_ranks (", r.min_ranks(), "), got ", r.max_ranks()));
  }
  c.AtLeast("resources.threads_per_rank", r.threads_per_rank(), 1);
  c.AtMost("resources.threads_per_rank", r.threads_per_rank(), 256);
  if (r.memory_bytes() != 0 && r.memory_bytes() < kMinRankMemoryBytes) {
    c.Fail("resources.memory_bytes",
           absl::StrCat("must be at least ", kMinRankMemoryBytes, " (64 MiB: a rank's runtime "
                        "alone needs more), or unset for the default; got ", r.memory_bytes()));
  }
  if (r.memory_bytes() > static_cast<int64_t>(kMaxRankMemoryBytes)) {
    c.Fail("resources.memory_bytes",
           absl::StrCat("must be at most ", static_cast<int64_t>(kMaxRankMemoryBytes),
                        " (64 TiB, more than any one machine holds); got ", r.memory_bytes()));
  }
  c.AtLeast("resources.max_processes", r.max_processes(), 32);
  c.AtMost("resources.max_processes", r.max_processes(), 4194304);
  if (!v1::ResourceSpec::Device_IsValid(r.device())) {
    c.Fail("resources.device", absl::StrCat("unknown value ", r.device()));
  }
}

// What every job has, built-in trainer or program: its name, resources,
// checkpoints and hang detection.
void ValidateCommon(const JobSpec& spec, Checker& c) {
  const std::string& name = spec.name();
  if (name.size() > 128) {
    c.Fail("name", absl::StrCat("must be at most 128 characters, got ", name.size()));
  }
  for (char ch : name) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.')) {
      c.Fail("name",
             absl::StrCat("may hold letters, digits, '-', '_' and '.', got \"", name, "\""));
      break;
    }
  }

  ValidateResources(spec.resources(), c);
  if (!v1::JobSpec::Priority_IsValid(spec.priority())) {
    c.Fail("priority",
           absl::StrCat("unknown value ", spec.priority(), "; use LOW, NORMAL or HIGH"));
  }

  const v1::CheckpointSpec& k = spec.checkpoint();
  c.AtLeast<int64_t>("checkpoint.every_steps", k.every_steps(), 0);
  c.AtLeast("checkpoint.keep_last", k.keep_last(), 0);
  c.AtLeast("checkpoint.unreachable_retry_seconds", k.unreachable_retry_seconds(), 0);
  if (!v1::CheckpointSpec::Storage_IsValid(k.storage())) {
    c.Fail("checkpoint.storage", absl::StrCat("unknown value ", k.storage()));
  } else if (k.storage() == v1::CheckpointSpec::SHARED_DIR) {
    if (k.shared_dir().empty() || k.shared_dir()[0] != '/') {
      c.Fail("checkpoint.shared_dir",
             absl::StrCat("storage SHARED_DIR needs an absolute directory path, got \"",
                          k.shared_dir(), "\""));
    }
  } else if (!k.shared_dir().empty()) {
    c.Fail("checkpoint.shared_dir", "is only used with storage SHARED_DIR");
  }

  const v1::HangDetectionSpec& h = spec.hang_detection();
  if (!v1::HangDetectionSpec::Action_IsValid(h.action())) {
    c.Fail("hang_detection.action", absl::StrCat("unknown value ", h.action()));
  }
  c.Positive("hang_detection.dead_after_seconds", h.dead_after_seconds());
  c.Positive("hang_detection.stall_after_seconds", h.stall_after_seconds());
  if (!(h.straggler_ratio() > 1)) {
    c.Fail("hang_detection.straggler_ratio",
           absl::StrCat("must be > 1, got ", h.straggler_ratio()));
  }
  c.Positive("hang_detection.phase_limit_seconds", h.phase_limit_seconds());

  if (spec.has_elastic()) {
    const v1::ElasticSpec& e = spec.elastic();
    c.AtLeast<int32_t>("elastic.max_restarts", e.max_restarts(), 0);
    c.Positive("elastic.wait_seconds", e.wait_seconds());
    c.Positive("elastic.scale_up_interval_seconds", e.scale_up_interval_seconds());
    if (spec.resources().preemptible()) {
      c.Fail("resources.preemptible",
             "an elastic job is preempted by giving up ranks at a step boundary, never sent "
             "back to the queue; remove preemptible or the elastic block");
    }
  }
}

// The built-in trainer's own fields beyond model, data and optimizer.
void ValidateTraining(const JobSpec& spec, Checker& c) {
  if (!v1::LossSpec::Kind_IsValid(spec.loss().kind())) {
    c.Fail("loss.kind", absl::StrCat("unknown value ", spec.loss().kind()));
  }
  c.InRange("loss.label_smoothing", spec.loss().label_smoothing(), 0, 1, false);

  const v1::TrainingSpec& t = spec.training();
  c.Positive("training.batch_size_per_rank", t.batch_size_per_rank());
  c.AtLeast("training.epochs", t.epochs(), 0);
  c.AtLeast<int64_t>("training.max_steps", t.max_steps(), 0);
  c.Positive("training.log_every_steps", t.log_every_steps());
  ValidateGlobalBatch(spec, c);

  c.AtLeast<int64_t>("eval.every_steps", spec.eval().every_steps(), 0);
  c.AtLeast<int64_t>("eval.max_batches", spec.eval().max_batches(), 0);

  const v1::ResourceSpec& r = spec.resources();

  for (int i = 0; i < spec.fault_injection().faults_size(); ++i) {
    const v1::Fault& f = spec.fault_injection().faults(i);
    const std::string p = absl::StrCat("fault_injection.faults[", i, "]");
    if (f.kind() == v1::Fault::KIND_UNSPECIFIED || !v1::Fault::Kind_IsValid(f.kind())) {
      c.Fail(p + ".kind",
             "is required: one of EXIT, CRASH, HANG, SLOW, SKIP_COLLECTIVE, MISMATCH_COLLECTIVE");
    }
    if (f.rank() < 0 || f.rank() >= r.max_ranks()) {
      c.Fail(p + ".rank", absl::StrCat("must be in [0, ", r.max_ranks(), "), got ", f.rank()));
    }
    c.AtLeast<int64_t>(p + ".at_step", f.at_step(), 0);
    c.AtLeast<int64_t>(p + ".generation", f.generation(), 0);
    if (f.kind() == v1::Fault::HANG || f.kind() == v1::Fault::SLOW) {
      c.Positive(p + ".duration_seconds", f.duration_seconds());
    }
    if (f.kind() == v1::Fault::EXIT && (f.exit_code() < 1 || f.exit_code() > 255)) {
      c.Fail(p + ".exit_code", absl::StrCat("must be in [1, 255], got ", f.exit_code()));
    }
  }
}

// A program job: its command, and none of the built-in trainer's fields
// (they would be silently ignored otherwise).
void ValidateProgram(const JobSpec& spec, Checker& c) {
  const v1::ProgramSpec& p = spec.program();
  const std::string why =
      "is the built-in trainer's; a program job trains in its own code: "
      "remove it (or remove program to use the built-in trainer)";
  if (spec.has_model()) c.Fail("model", why);
  if (spec.has_loss()) c.Fail("loss", why);
  if (spec.has_data()) c.Fail("data", why);
  if (spec.has_training()) c.Fail("training", why);
  if (spec.has_optimizer()) c.Fail("optimizer", why);
  if (spec.has_lr_schedule()) c.Fail("lr_schedule", why);
  if (spec.has_strategy()) c.Fail("strategy", why);
  if (spec.grad_clip_norm() != 0) c.Fail("grad_clip_norm", why);
  if (spec.has_eval()) c.Fail("eval", why);
  if (spec.has_fault_injection()) c.Fail("fault_injection", why);
  // elastic is allowed: the program re-forms through the SDK's hooks
  // (docs/sdk.md "Elastic programs").

  if (p.argv_size() == 0) {
    c.Fail("program.argv",
           "is required: the command each rank runs, e.g. [\"/usr/bin/python3\", \"train.py\"]");
  } else if (p.argv(0).empty()) {
    c.Fail("program.argv[0]", "must name the program to run, got an empty string");
  }
  const std::string& dir = p.working_dir();
  if (!dir.empty() && dir[0] != '/') {
    c.Fail("program.working_dir", absl::StrCat("must be an absolute path, got \"", dir, "\""));
  }
  if (p.argv_size() > 0 && !p.argv(0).empty() && p.argv(0)[0] != '/' && dir.empty()) {
    c.Fail("program.argv[0]",
           absl::StrCat("relative path ", p.argv(0),
                        " needs program.working_dir (an absolute directory) to resolve against; "
                        "or give an absolute path (no PATH lookup: /usr/bin/python3, not "
                        "python3)"));
  }
  // In name order: a map's own order would change from run to run.
  std::map<std::string, std::string> env(p.env().begin(), p.env().end());
  for (const auto& [name, value] : env) {
    const std::string field = absl::StrCat("program.env[", name, "]");
    if (name.empty()) {
      c.Fail("program.env", "variable names must not be empty");
    } else if (name.find('=') != std::string::npos || name.find('\0') != std::string::npos) {
      c.Fail(field, "variable names must not hold '=' or NUL");
    } else if (IsChorusSetVariable(name)) {
      c.Fail(field, "is set by Chorus for each rank (docs/programs.md); choose another name");
    }
    if (value.find('\0') != std::string::npos) c.Fail(field, "must not hold a NUL character");
  }
  for (int i = 0; i < p.argv_size(); ++i) {
    if (p.argv(i).find('\0') != std::string::npos) {
      c.Fail(absl::StrCat("program.argv[", i, "]"), "must not hold a NUL character");
    }
  }
}

// What every job has: resources, checkpoints, hang detection.
// Note [Paths in one form]
// Every path a spec names is stored lexically normal and without a trailing
// slash, so that the coordinator, agents and ranks that build paths from it
// agree byte for byte. A coordinator restart once deleted committed checkpoints
// because "/ckpt/" + "/" + job was compared with "/ckpt" / job.
void NormalizePaths(JobSpec& spec) {
  auto normal = [](std::string* path) { *path = NormalPath(*path); };
  normal(spec.mutable_checkpoint()->mutable_shared_dir());
  if (spec.has_program()) normal(spec.mutable_program()->mutable_working_dir());
  if (spec.model().has_torchscript())
    normal(spec.mutable_model()->mutable_torchscript()->mutable_path());
  if (!spec.has_data()) return;  // a program job has none: none is made here
  v1::DataSpec& d = *spec.mutable_data();
  if (d.has_fashion_mnist()) normal(d.mutable_fashion_mnist()->mutable_dir());
  if (d.has_tensor_file()) {
    normal(d.mutable_tensor_file()->mutable_path());
    normal(d.mutable_tensor_file()->mutable_eval_path());
  }
  if (d.has_shards()) {
    for (std::string& path : *d.mutable_shards()->mutable_paths()) {
      if (!path.empty()) normal(&path);
    }
    for (std::string& path : *d.mutable_shards()->mutable_eval_paths()) {
      if (!path.empty()) normal(&path);
    }
  }
}

void NormalizeCommon(JobSpec& spec) {
  NormalizePaths(spec);
  v1::ResourceSpec& r = *spec.mutable_resources();
  if (r.min_ranks() == 0) r.set_min_ranks(1);
  if (r.max_ranks() == 0) r.set_max_ranks(r.min_ranks());
  if (r.threads_per_rank() == 0) r.set_threads_per_rank(1);
  if (r.max_processes() == 0) r.set_max_processes(kDefaultMaxProcesses);
  if (r.device() == v1::ResourceSpec::DEVICE_UNSPECIFIED) r.set_device(v1::ResourceSpec::CPU);

  v1::CheckpointSpec& k = *spec.mutable_checkpoint();
  if (!k.has_keep_last()) k.set_keep_last(3);
  if (k.storage() == v1::CheckpointSpec::STORAGE_UNSPECIFIED) {
    k.set_storage(v1::CheckpointSpec::COORDINATOR);
  }
  if (!k.has_at_end()) k.set_at_end(true);

  v1::HangDetectionSpec& h = *spec.mutable_hang_detection();
  if (h.action() == v1::HangDetectionSpec::ACTION_UNSPECIFIED) {
    h.set_action(v1::HangDetectionSpec::REPORT);
  }
  if (h.dead_after_seconds() == 0) h.set_dead_after_seconds(5);
  if (h.stall_after_seconds() == 0) h.set_stall_after_seconds(3);
  if (h.straggler_ratio() == 0) h.set_straggler_ratio(1.5);
  if (h.phase_limit_seconds() == 0) h.set_phase_limit_seconds(600);

  // A program job's elastic block too: without these, `elastic {}` on a
  // program meant no restart at all and a generation that had to form
  // within 0 s.
  if (spec.has_elastic()) {
    v1::ElasticSpec& e = *spec.mutable_elastic();
    if (!e.has_max_restarts()) e.set_max_restarts(3);
    if (e.wait_seconds() == 0) e.set_wait_seconds(60);
    if (e.scale_up_interval_seconds() == 0) e.set_scale_up_interval_seconds(60);
  }
}

void NormalizeModel(v1::ModelSpec& m) {
  if (m.has_mlp() && m.mlp().hidden_sizes_size() == 0) {
    m.mutable_mlp()->add_hidden_sizes(256);
    m.mutable_mlp()->add_hidden_sizes(128);
  }
  if (m.has_cnn()) {
    v1::CnnModel& cnn = *m.mutable_cnn();
    if (cnn.channels_size() == 0) {
      cnn.add_channels(32);
      cnn.add_channels(64);
    }
    if (cnn.kernel_size() == 0) cnn.set_kernel_size(5);
    if (cnn.fc_hidden() == 0) cnn.set_fc_hidden(128);
  }
  if (m.has_transformer_lm()) {
    v1::TransformerLmModel& t = *m.mutable_transformer_lm();
    if (t.vocab_size() == 0) t.set_vocab_size(256);
    if (t.context_length() == 0) t.set_context_length(64);
    if (t.d_model() == 0) t.set_d_model(128);
    if (t.num_heads() == 0) t.set_num_heads(4);
    if (t.num_layers() == 0) t.set_num_layers(2);
    if (t.d_ff() == 0) t.set_d_ff(4 * t.d_model());
  }
}

// data.shards' defaults (the proto's comments say them).
void NormalizeShards(const v1::ModelSpec& m, v1::ShardedData& s) {
  if (s.read_ahead_bytes() == 0) s.set_read_ahead_bytes(int64_t{64} << 20);
  if (s.shuffle_buffer() == 0) s.set_shuffle_buffer(4096);
  if (s.format() == v1::ShardedData::TAR) {
    if (s.input_member().empty()) s.set_input_member("x.npy");
    if (s.target_member().empty()) s.set_target_member("y.npy");
  }
  if (s.format() == v1::ShardedData::TOKENS) {
    if (s.token_type() == v1::ShardedData::TOKEN_TYPE_UNSPECIFIED) {
      s.set_token_type(v1::ShardedData::UINT16);
    }
    if (s.sequence_length() == 0 && m.has_transformer_lm()) {
      s.set_sequence_length(m.transformer_lm().context_length());
    }
  }
}

// The data's defaults; synthetic data's follow the (normalized) model and
// the training seed.
void NormalizeData(JobSpec& spec) {
  const v1::ModelSpec& m = spec.model();
  v1::DataSpec& d = *spec.mutable_data();
  if (d.remainder() == v1::DataSpec::REMAINDER_UNSPECIFIED) {
    d.set_remainder(v1::DataSpec::DROP);
  }
  if (d.has_fashion_mnist() && d.fashion_mnist().dir().empty()) {
    d.mutable_fashion_mnist()->set_dir(kDefaultFashionMnistDir);
  }
  if (d.has_shards()) NormalizeShards(m, *d.mutable_shards());
  if (!d.has_synthetic()) return;
  v1::SyntheticData& s = *d.mutable_synthetic();
  if (s.kind() == v1::SyntheticData::KIND_UNSPECIFIED) {
    s.set_kind(m.has_transformer_lm() ? v1::SyntheticData::TOKENS
                                      : v1::SyntheticData::CLASSIFICATION);
  }
  if (s.num_samples() == 0) s.set_num_samples(4096);
  if (s.input_shape_size() == 0) {
    s.add_input_shape(s.kind() == v1::SyntheticData::TOKENS && m.has_transformer_lm()
                          ? m.transformer_lm().context_length()
                          : 32);
  }
  if (s.num_classes() == 0) s.set_num_classes(10);
  if (!s.has_seed()) s.set_seed(spec.training().seed());
}

// Training, optimizer and learning-rate schedule.
void NormalizeTraining(JobSpec& spec) {
  v1::TrainingSpec& t = *spec.mutable_training();
  if (t.batch_size_per_rank() == 0) t.set_batch_size_per_rank(64);
  if (t.epochs() == 0 && t.max_steps() == 0) t.set_epochs(1);
  if (!t.has_shuffle()) t.set_shuffle(true);
  if (t.log_every_steps() == 0) t.set_log_every_steps(10);

  v1::OptimizerSpec& o = *spec.mutable_optimizer();
  if (o.kind() == v1::OptimizerSpec::KIND_UNSPECIFIED) o.set_kind(v1::OptimizerSpec::SGD);
  if (o.lr() == 0) o.set_lr(o.kind() == v1::OptimizerSpec::SGD ? 0.01 : 0.001);
  if (o.beta1() == 0) o.set_beta1(0.9);
  if (o.beta2() == 0) o.set_beta2(0.999);
  if (o.eps() == 0) o.set_eps(1e-8);
  if (o.accum_iter() == 0) o.set_accum_iter(4);

  v1::LrScheduleSpec& lr = *spec.mutable_lr_schedule();
  if (lr.kind_case() == v1::LrScheduleSpec::KIND_NOT_SET) lr.mutable_constant();
  if (lr.has_step() && lr.step().gamma() == 0) lr.mutable_step()->set_gamma(0.1);
}

void NormalizeStrategy(v1::StrategySpec& s) {
  if (s.kind_case() == v1::StrategySpec::KIND_NOT_SET) s.mutable_ddp();
  if (s.has_ddp()) {
    v1::DdpStrategy& ddp = *s.mutable_ddp();
    if (ddp.bucket_cap_mb() == 0) ddp.set_bucket_cap_mb(25);
    if (ddp.first_bucket_mb() == 0) ddp.set_first_bucket_mb(1);
    if (ddp.compression() == v1::DdpStrategy::COMPRESSION_UNSPECIFIED) {
      ddp.set_compression(v1::DdpStrategy::NONE);
    }
    if (ddp.grad_accum_steps() == 0) ddp.set_grad_accum_steps(1);
    if (!ddp.has_broadcast_buffers()) ddp.set_broadcast_buffers(true);
    if (!ddp.has_gradient_as_bucket_view()) ddp.set_gradient_as_bucket_view(true);
  }
  if (s.has_decentralized()) {
    v1::DecentralizedStrategy& dec = *s.mutable_decentralized();
    if (dec.topology() == v1::DecentralizedStrategy::TOPOLOGY_UNSPECIFIED) {
      dec.set_topology(v1::DecentralizedStrategy::ONE_PEER_EXPONENTIAL);
    }
    if (dec.bucket_cap_mb() == 0) dec.set_bucket_cap_mb(25);
    if (dec.local_world_size() == 0) dec.set_local_world_size(1);
    if (dec.clip_mode() == v1::DecentralizedStrategy::CLIP_MODE_UNSPECIFIED) {
      dec.set_clip_mode(v1::DecentralizedStrategy::GLOBAL_NORM);
    }
  }
}

}  // namespace

void NormalizeJobSpec(JobSpec& spec) {
  if (spec.name().empty()) spec.set_name("job");
  if (spec.has_program()) {
    // A program job has none of the built-in trainer's fields to fill:
    // only what every job has (validation refuses the trainer's).
    NormalizeCommon(spec);
    return;
  }
  // -0 means no clipping, as 0 does; JSON would print it as "-0" and read it
  // back as another value (found by job_spec_fuzzer).
  if (spec.grad_clip_norm() == 0) spec.set_grad_clip_norm(0);
  NormalizeModel(*spec.mutable_model());
  if (spec.loss().kind() == v1::LossSpec::KIND_UNSPECIFIED) {
    spec.mutable_loss()->set_kind(v1::LossSpec::CROSS_ENTROPY);
  }
  NormalizeData(spec);
  NormalizeTraining(spec);
  NormalizeStrategy(*spec.mutable_strategy());
  NormalizeCommon(spec);
}

std::vector<SpecError> ValidateJobSpec(const JobSpec& spec) {
  Checker c;
  if (const size_t bytes = spec.ByteSizeLong(); bytes > kMaxJobSpecBytes) {
    c.Fail("spec", absl::StrCat("is ", FormatBytes(static_cast<double>(bytes)),
                                " serialized, more than the ",
                                FormatBytes(static_cast<double>(kMaxJobSpecBytes)),
                                " a job spec may hold; pass large values (program.env, "
                                "program.argv) in files"));
  }
  if (spec.has_program()) {
    ValidateProgram(spec, c);
    ValidateCommon(spec, c);
    return c.Take();
  }
  ValidateModel(spec, c);
  ValidateData(spec, c);
  ValidateOptimizer(spec, c);
  ValidateStrategy(spec, c);
  ValidateCommon(spec, c);
  ValidateTraining(spec, c);
  std::vector<SpecError> errors = c.Take();
  // Sizes are only worth estimating once every field is in range. Files are
  // not read here: a spec is validated where its files may not be.
  if (errors.empty()) {
    const RankMemoryEstimate memory = EstimateRankMemory(spec);
    if (memory.total() > kMaxRankMemoryBytes) {
      errors.push_back(
          {memory.field, RankMemoryMessage(memory, kMaxRankMemoryBytes, "any one machine holds")});
    }
  }
  return errors;
}

std::string RankMemoryMessage(const RankMemoryEstimate& memory, double limit_bytes,
                              absl::string_view what) {
  return absl::StrCat("a rank needs ", memory.ToString(), ", more than the ",
                      FormatBytes(limit_bytes), " ", what, "; make the job smaller");
}

int64_t RankMemoryLimitBytes(const JobSpec& spec) {
  if (spec.resources().memory_bytes() > 0) return spec.resources().memory_bytes();
  // Only where the spec alone gives every size: a TorchScript module's,
  // tensor files' and shards' sizes or shapes are in files, which the
  // coordinator does not read, and a limit from an estimate missing them
  // would kill jobs that fit.
  const v1::DataSpec& data = spec.data();
  if (spec.has_program() || spec.model().has_torchscript() ||
      !(data.has_synthetic() || data.has_fashion_mnist())) {
    return 0;
  }
  const RankMemoryEstimate memory = EstimateRankMemory(spec);
  constexpr double kStep = 64.0 * (1 << 20);
  constexpr double kGiB = 1024.0 * (1 << 20);
  // The CUDA runtime's own host memory (its libraries, context, pinned
  // pools) is not in the estimate.
  const double cuda = spec.resources().device() == v1::ResourceSpec::CUDA ? 4 * kGiB : 0;
  const double limit = std::ceil((2 * memory.total() + kGiB + cuda) / kStep) * kStep;
  return limit < kMaxRankMemoryBytes ? static_cast<int64_t>(limit)
                                     : static_cast<int64_t>(kMaxRankMemoryBytes);
}

int RankProcessLimit(const JobSpec& spec) {
  return spec.resources().max_processes() > 0 ? spec.resources().max_processes()
                                              : kDefaultMaxProcesses;
}

std::string SharedCheckpointRoot(const v1::CheckpointSpec& checkpoint) {
  if (checkpoint.shared_dir_namespace().empty()) return checkpoint.shared_dir();
  return absl::StrCat(checkpoint.shared_dir() == "/" ? "" : checkpoint.shared_dir(), "/",
                      checkpoint.shared_dir_namespace());
}

absl::Status CheckJobSpec(const JobSpec& spec, absl::string_view source) {
  std::vector<SpecError> errors = ValidateJobSpec(spec);
  if (errors.empty()) return absl::OkStatus();
  std::string message = absl::StrCat("job spec ", source, " has ", errors.size(),
                                     errors.size() == 1 ? " problem:" : " problems:");
  for (const SpecError& e : errors) absl::StrAppend(&message, "\n  ", e.field, ": ", e.message);
  return absl::InvalidArgumentError(message);
}

}  // namespace chorus
