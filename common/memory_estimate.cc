#include "common/memory_estimate.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace chorus {
namespace {

constexpr double kFloat = 4;  // bytes of a float32 value
constexpr double kLong = 8;   // bytes of an int64 value
// A count only the data's files know: as many as a batch could take.
constexpr double kUnknownCount = std::numeric_limits<double>::infinity();

// What the data source says about samples: their shape (empty when the spec
// does not say), the model's output width, and the bytes held in memory.
struct DataFacts {
  std::vector<double> sample;  // per-sample input dims
  double features = 0;         // product of `sample`
  double outputs = 1;          // classes, vocabulary, or 1 for regression
  double bytes = 0;            // training + test split
  double eval_samples = 0;     // held-out samples; infinite when only the files know
  std::string field;           // what drives `bytes`
};

double Product(const std::vector<double>& dims) {
  double p = 1;
  for (double d : dims) p *= d;
  return dims.empty() ? 0 : p;
}

DataFacts DescribeData(const v1::JobSpec& spec, const FileSizeFn& file_size) {
  DataFacts f;
  const v1::DataSpec& d = spec.data();
  if (d.has_synthetic()) {
    const v1::SyntheticData& s = d.synthetic();
    for (int64_t dim : s.input_shape()) f.sample.push_back(static_cast<double>(dim));
    f.features = Product(f.sample);
    const double n_train = static_cast<double>(s.num_samples());
    const double n_test = static_cast<double>(std::max<int64_t>(1, s.num_samples() / 5));
    f.eval_samples = n_test;
    double per_sample;
    if (s.kind() == v1::SyntheticData::TOKENS) {
      f.outputs = spec.model().has_transformer_lm() ? spec.model().transformer_lm().vocab_size()
                                                    : s.num_classes();
      per_sample = 2 * f.features * kLong;  // x and y: token sequences
    } else if (s.kind() == v1::SyntheticData::REGRESSION) {
      f.outputs = 1;
      per_sample = f.features * kFloat + kFloat;
    } else {
      f.outputs = s.num_classes();
      per_sample = f.features * kFloat + kLong;
    }
    f.bytes = (n_train + n_test) * per_sample;
    f.field = f.features >= n_train ? "data.synthetic.input_shape" : "data.synthetic.num_samples";
  } else if (d.has_fashion_mnist()) {
    f.sample = {1, 28, 28};
    f.features = 784;
    f.outputs = 10;
    const int64_t limit = d.fashion_mnist().train_limit();
    const double n_train = limit > 0 && limit < 60000 ? static_cast<double>(limit) : 60000;
    f.bytes = (n_train + 10000) * (784 * kFloat + kLong);
    f.eval_samples = 10000;
    f.field = "data.fashion_mnist.train_limit";
  } else if (d.has_tensor_file()) {
    // Shapes are inside the file: its size is a lower bound of what it holds.
    for (const std::string& path : {d.tensor_file().path(), d.tensor_file().eval_path()}) {
      if (path.empty() || !file_size) continue;
      f.bytes += std::max<double>(0, static_cast<double>(file_size(path)));
    }
    f.field = "data.tensor_file.path";
    if (!d.tensor_file().eval_path().empty()) f.eval_samples = kUnknownCount;
  } else if (d.has_shards()) {
    // Streamed: a rank holds its read-ahead buffer (the step's own batch is
    // counted with the activations). The index (24 bytes a sample for TAR)
    // and the epoch's share of sample numbers (8 bytes a sample / ranks)
    // depend on a sample count only the files' headers tell: not counted.
    const v1::ShardedData& s = d.shards();
    if (s.format() == v1::ShardedData::TOKENS) {
      f.sample = {static_cast<double>(s.sequence_length())};
      f.features = f.sample[0];
      f.outputs =
          spec.model().has_transformer_lm() ? spec.model().transformer_lm().vocab_size() : 1;
    } else if (spec.model().has_transformer_lm()) {
      f.outputs = spec.model().transformer_lm().vocab_size();
    } else {
      f.outputs = s.num_classes() > 0 ? s.num_classes() : 1;
    }
    // Held-out shards have a read-ahead buffer of their own.
    f.bytes = static_cast<double>(s.read_ahead_bytes()) * (s.eval_paths_size() > 0 ? 2 : 1);
    if (s.eval_paths_size() > 0) f.eval_samples = kUnknownCount;
    f.field = "data.shards.read_ahead_bytes";
  }
  return f;
}

// Note [What a rank holds at its peak]
// Measured (docs/benchmarks.md, "Memory per rank"): a rank's peak resident
// memory is
//   runtime + parameters + gradients + optimizer state + communication
//   + data + checkpoint copy + max(training step, evaluation)
// - runtime: what a rank holds with a model of a few values: LibTorch's and
//   gRPC's code and their threads' stacks and arenas (kRuntimeBytes).
// - checkpoint copy: a checkpoint first copies the parameters and the
//   optimizer state (worker/train/checkpoint.h), and the final one is still
//   held while the final evaluation runs.
// - training step: the values the forward pass saves for backward and the
//   gradients backward holds at once, about 1.5x the forward values
//   (gradients are freed as backward goes). transformer_lm's head counts
//   apart: its [B, T, vocab] logits, their log-softmax and, in backward,
//   the gradients of both are 4 copies, and they dominate a large
//   vocabulary.
// - evaluation: a batch of max(256, batch_size_per_rank) held-out samples
//   (worker/train/trainer.cc's Evaluate), fewer when the split is smaller,
//   without gradients: the largest pair of consecutive layer outputs (for
//   transformer_lm one block's scores and the logits with their
//   log-softmax). With a large vocabulary this is the peak: 256 sequences of
//   32 tokens over 50,304 words are 1.6 GB of logits.
constexpr double kRuntimeBytes = 180e6;
constexpr double kBackwardFactor = 1.5;  // saved forward values and live gradients
constexpr double kEvalBatch = 256;       // Evaluate's smallest batch

// Parameters and per-sample values of the model on `data`, and the field
// that drives them.
struct ModelFacts {
  double parameters = 0;       // values
  double parameter_bytes = 0;  // when known only as bytes (TorchScript)
  double activations = 0;      // values per sample, forward only, but for `logits`
  double eval_peak = 0;        // values per sample alive at once in evaluation, but for `logits`
  double logits = 0;           // transformer_lm: the head's T x vocab values per sample
  std::string field;
};

ModelFacts DescribeMlp(const v1::JobSpec& spec, const DataFacts& data) {
  ModelFacts m;
  const v1::MlpModel& mlp = spec.model().mlp();
  const double per_hidden = mlp.dropout() > 0 ? 3 : 2;  // linear, ReLU, dropout
  double width = data.features;
  double first_layer = 0;
  m.activations = data.features;
  for (int h : mlp.hidden_sizes()) {
    const double layer = width * h + h;
    if (first_layer == 0) first_layer = layer;
    m.parameters += layer;
    m.activations += per_hidden * h;
    m.eval_peak = std::max({m.eval_peak, width + h, 2.0 * h});
    width = h;
  }
  m.parameters += width * data.outputs + data.outputs;
  m.activations += data.outputs;
  m.eval_peak = std::max(m.eval_peak, width + data.outputs);
  // A huge input makes the first layer the big one: the data's shape is
  // what to change.
  m.field = first_layer * 2 > m.parameters && mlp.hidden_sizes_size() > 0 &&
                    data.features > mlp.hidden_sizes(0) && spec.data().has_synthetic()
                ? "data.synthetic.input_shape"
                : "model.mlp.hidden_sizes";
  return m;
}

ModelFacts DescribeCnn(const v1::JobSpec& spec, const DataFacts& data) {
  ModelFacts m;
  const v1::CnnModel& cnn = spec.model().cnn();
  const double c0 = cnn.channels_size() > 0 ? cnn.channels(0) : 0;
  const double c1 = cnn.channels_size() > 1 ? cnn.channels(1) : 0;
  const double k = cnn.kernel_size();
  const double fc = cnn.fc_hidden();
  double c = 0, h = 0, w = 0;
  if (data.sample.size() == 3) {
    c = data.sample[0];
    h = data.sample[1];
    w = data.sample[2];
  }
  const double h2 = std::floor(h / 2), w2 = std::floor(w / 2);
  const double h4 = std::floor(h / 4), w4 = std::floor(w / 4);
  const double fc1 = c1 * h4 * w4 * fc + fc;
  m.parameters =
      (c * c0 * k * k + c0) + (c0 * c1 * k * k + c1) + fc1 + (fc * data.outputs + data.outputs);
  m.activations = c * h * w + 2 * c0 * h * w + c0 * h2 * w2 + 2 * c1 * h2 * w2 + c1 * h4 * w4 +
                  (cnn.dropout() > 0 ? 3 : 2) * fc + data.outputs;
  // Each layer's input and output: a convolution's, its ReLU's, its pooling's.
  m.eval_peak = std::max({c * h * w + c0 * h * w, 2 * c0 * h * w, c0 * h2 * w2 + c1 * h2 * w2,
                          2 * c1 * h2 * w2, c1 * h4 * w4 + fc});
  m.field = fc1 * 2 > m.parameters
                ? (c1 * h4 * w4 > fc && spec.data().has_synthetic() ? "data.synthetic.input_shape"
                                                                    : "model.cnn.fc_hidden")
                : "model.cnn.channels";
  return m;
}

ModelFacts DescribeTransformerLm(const v1::JobSpec& spec, const DataFacts& data) {
  ModelFacts m;
  const v1::TransformerLmModel& t = spec.model().transformer_lm();
  const double v = t.vocab_size(), ctx = t.context_length(), d = t.d_model();
  const double heads = t.num_heads(), layers = t.num_layers(), ff = t.d_ff();
  const double block =
      2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (d * ff + ff) + (ff * d + d);
  m.parameters = v * d + ctx * d + layers * block + 2 * d + (d * v + v);
  // Per token: embeddings, each block's norms, q/k/v, attention output,
  // projection, residuals and feed-forward, the final norm; per sequence
  // each block's scores, softmax and dropout (heads x T x T).
  const double tokens = data.features > 0 ? data.features : ctx;
  m.activations = tokens * (2 * d + layers * (8 * d + 2 * ff) + d) +
                  layers * 3 * heads * tokens * tokens;
  // One block at a time: its q/k/v and residual stream, and its scores
  // scaled, masked and softmaxed.
  m.eval_peak = tokens * (4 * d + ff) + 4 * heads * tokens * tokens;
  m.logits = tokens * v;
  m.field = "model.transformer_lm";
  return m;
}

ModelFacts DescribeModel(const v1::JobSpec& spec, const DataFacts& data,
                         const FileSizeFn& file_size) {
  const v1::ModelSpec& model = spec.model();
  if (model.has_mlp()) return DescribeMlp(spec, data);
  if (model.has_cnn()) return DescribeCnn(spec, data);
  if (model.has_transformer_lm()) return DescribeTransformerLm(spec, data);
  ModelFacts m;
  if (model.has_torchscript()) {
    // A saved module is mostly its parameters: its size is a lower bound.
    if (file_size) {
      m.parameter_bytes =
          std::max<double>(0, static_cast<double>(file_size(model.torchscript().path())));
    }
    m.activations = data.features;
    m.eval_peak = data.features;
    m.field = "model.torchscript.path";
  }
  return m;
}

// Optimizer state and the strategy's buffers, from the parameters' bytes.
void AddParameterState(const v1::JobSpec& spec, RankMemoryEstimate& e) {
  switch (spec.optimizer().kind()) {
    case v1::OptimizerSpec::ADAM:
    case v1::OptimizerSpec::ADAMW:
      e.optimizer = 2 * e.parameters;  // first and second moments
      break;
    case v1::OptimizerSpec::ACCUM_ADAM:
    case v1::OptimizerSpec::ACCUM_ADAMW:
      e.optimizer = 3 * e.parameters;  // moments and the accumulated gradient
      break;
    default:
      e.optimizer = spec.optimizer().momentum() > 0 ? e.parameters : 0;
      break;
  }
  if (spec.strategy().has_ddp()) {
    const v1::DdpStrategy& ddp = spec.strategy().ddp();
    // Flat buckets hold a copy of the gradients unless gradients are views
    // into them; compression adds a half-size copy on the wire.
    e.communication = ddp.gradient_as_bucket_view() ? 0 : e.parameters;
    if (ddp.compression() == v1::DdpStrategy::FP16 || ddp.compression() == v1::DdpStrategy::BF16)
      e.communication += e.parameters / 2;
  } else if (spec.strategy().has_decentralized()) {
    e.communication = 2 * e.parameters;  // the peers' copy received, the bucket's backup
  }
  // Note [What a rank holds at its peak]: the checkpoint's copy.
  const v1::CheckpointSpec& c = spec.checkpoint();
  if (c.every_steps() > 0 || !c.has_at_end() || c.at_end()) {
    e.checkpoint = e.parameters + e.optimizer;
  }
}

// Held-out samples one evaluation pass of a rank reads in one batch.
double EvalBatch(const v1::JobSpec& spec, const DataFacts& data) {
  if (spec.eval().disabled() || data.eval_samples <= 0) return 0;
  const double ranks = std::max(1, spec.resources().min_ranks());
  const double batch = static_cast<double>(spec.training().batch_size_per_rank());
  return std::min(std::max(kEvalBatch, batch), std::ceil(data.eval_samples / ranks));
}

}  // namespace

RankMemoryEstimate EstimateRankMemory(const v1::JobSpec& spec, const FileSizeFn& file_size) {
  // A program's memory is its own: nothing in the spec says how much.
  if (spec.has_program()) {
    RankMemoryEstimate unknown;
    unknown.field = "program";
    return unknown;
  }
  const DataFacts data = DescribeData(spec, file_size);
  const ModelFacts model = DescribeModel(spec, data, file_size);
  RankMemoryEstimate e;
  e.runtime = kRuntimeBytes;
  e.parameters = model.parameters * kFloat + model.parameter_bytes;
  e.gradients = e.parameters;
  AddParameterState(spec, e);
  e.data = data.bytes;
  // Note [What a rank holds at its peak].
  const double batch = spec.training().batch_size_per_rank();
  e.activations = batch * (model.activations * kBackwardFactor + model.logits * 4) * kFloat;
  e.evaluation = EvalBatch(spec, data) * (model.eval_peak + model.logits * 2) * kFloat;

  const double params_part =
      e.parameters + e.gradients + e.optimizer + e.communication + e.checkpoint;
  const double batch_part = std::max(e.activations, e.evaluation);
  if (params_part >= e.data && params_part >= batch_part) {
    e.field = model.field;
  } else if (e.data >= batch_part) {
    e.field = data.field;
  } else {
    e.field = batch > model.activations ? "training.batch_size_per_rank" : model.field;
  }
  if (e.field.empty()) e.field = "model";
  return e;
}

int64_t RankMemoryEstimate::total_bytes() const {
  const double t = total();
  if (!(t < static_cast<double>(std::numeric_limits<int64_t>::max())))
    return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(t);
}

std::string RankMemoryEstimate::ToString() const {
  std::vector<std::string> parts;
  auto add = [&](const char* name, double bytes) {
    if (bytes > 0) parts.push_back(absl::StrCat(name, " ", FormatBytes(bytes)));
  };
  add("runtime", runtime);
  add("parameters", parameters);
  add("gradients", gradients);
  add("optimizer state", optimizer);
  add("communication buffers", communication);
  add("checkpoint copy", checkpoint);
  add("data", data);
  if (activations > 0 && evaluation > 0) {
    parts.push_back(absl::StrCat("the larger of activations ", FormatBytes(activations),
                                 " and evaluation ", FormatBytes(evaluation)));
  } else {
    add("activations", activations);
    add("evaluation", evaluation);
  }
  std::string out = absl::StrCat("about ", FormatBytes(total()));
  if (!parts.empty()) absl::StrAppend(&out, " (", absl::StrJoin(parts, ", "), ")");
  return out;
}

std::string FormatBytes(double bytes) {
  static const char* const kUnits[] = {"kB", "MB", "GB", "TB", "PB", "EB"};
  if (!(bytes >= 1000)) return absl::StrCat(static_cast<int64_t>(std::max(0.0, bytes)), " B");
  double v = bytes / 1000;
  int unit = 0;
  while (v >= 999.95 && unit + 1 < 6) {
    v /= 1000;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

std::string FormatBinaryBytes(int64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(std::max<int64_t>(0, bytes), " B");
  int unit = 0;
  int64_t scale = 1024;
  while (unit + 1 < 6 && bytes / scale >= 1024) {
    scale *= 1024;
    ++unit;
  }
  if (bytes % scale == 0) return absl::StrCat(bytes / scale, " ", kUnits[unit]);
  return absl::StrFormat("%.1f %s", static_cast<double>(bytes) / static_cast<double>(scale),
                         kUnits[unit]);
}

int64_t LocalFileSize(const std::string& path) {
  struct stat st;
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_size);
}

namespace {

// The "NAME: N kB" line of a /proc file's text, in bytes; 0 when absent.
int64_t ParseKibLine(const std::string& text, absl::string_view name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, name) || !absl::ConsumePrefix(&line, ":")) continue;
    line = absl::StripAsciiWhitespace(line);
    int64_t kib = 0;
    if (!absl::ConsumeSuffix(&line, "kB")) return 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) || kib <= 0) return 0;
    return kib * 1024;
  }
  return 0;
}

std::string ReadProcFile(const char* path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

int64_t ParseMemTotal(const std::string& meminfo) { return ParseKibLine(meminfo, "MemTotal"); }

int64_t MachineMemoryBytes() { return ParseMemTotal(ReadProcFile("/proc/meminfo")); }

int64_t ParseVmHwm(const std::string& status) { return ParseKibLine(status, "VmHWM"); }

int64_t PeakResidentBytes() { return ParseVmHwm(ReadProcFile("/proc/self/status")); }

}  // namespace chorus
