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

// What the data source says about samples: their shape (empty when the spec
// does not say), the model's output width, and the bytes held in memory.
struct DataFacts {
  std::vector<double> sample;  // per-sample input dims
  double features = 0;         // product of `sample`
  double outputs = 1;          // classes, vocabulary, or 1 for regression
  double bytes = 0;            // training + test split
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
    f.field = "data.fashion_mnist.train_limit";
  } else if (d.has_tensor_file()) {
    // Shapes are inside the file: its size is a lower bound of what it holds.
    for (const std::string& path : {d.tensor_file().path(), d.tensor_file().eval_path()}) {
      if (path.empty() || !file_size) continue;
      f.bytes += std::max<double>(0, static_cast<double>(file_size(path)));
    }
    f.field = "data.tensor_file.path";
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
    f.field = "data.shards.read_ahead_bytes";
  }
  return f;
}

// Parameters and per-sample activation values of the model on `data`, and
// the field that drives them.
struct ModelFacts {
  double parameters = 0;       // values
  double parameter_bytes = 0;  // when known only as bytes (TorchScript)
  double activations = 0;      // values per sample, forward only
  std::string field;
};

ModelFacts DescribeModel(const v1::JobSpec& spec, const DataFacts& data,
                         const FileSizeFn& file_size) {
  ModelFacts m;
  const v1::ModelSpec& model = spec.model();
  if (model.has_mlp()) {
    const v1::MlpModel& mlp = model.mlp();
    const double per_hidden = mlp.dropout() > 0 ? 3 : 2;  // linear, ReLU, dropout
    double width = data.features;
    double first_layer = 0;
    m.activations = data.features;
    for (int h : mlp.hidden_sizes()) {
      const double layer = width * h + h;
      if (first_layer == 0) first_layer = layer;
      m.parameters += layer;
      m.activations += per_hidden * h;
      width = h;
    }
    m.parameters += width * data.outputs + data.outputs;
    m.activations += data.outputs;
    // A huge input makes the first layer the big one: the data's shape is
    // what to change.
    m.field = first_layer * 2 > m.parameters && mlp.hidden_sizes_size() > 0 &&
                      data.features > mlp.hidden_sizes(0) && spec.data().has_synthetic()
                  ? "data.synthetic.input_shape"
                  : "model.mlp.hidden_sizes";
  } else if (model.has_cnn()) {
    const v1::CnnModel& cnn = model.cnn();
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
    m.field = fc1 * 2 > m.parameters
                  ? (c1 * h4 * w4 > fc && spec.data().has_synthetic() ? "data.synthetic.input_shape"
                                                                      : "model.cnn.fc_hidden")
                  : "model.cnn.channels";
  } else if (model.has_transformer_lm()) {
    const v1::TransformerLmModel& t = model.transformer_lm();
    const double v = t.vocab_size(), ctx = t.context_length(), d = t.d_model();
    const double heads = t.num_heads(), layers = t.num_layers(), ff = t.d_ff();
    const double block =
        2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (d * ff + ff) + (ff * d + d);
    m.parameters = v * d + ctx * d + layers * block + 2 * d + (d * v + v);
    // Per token: embeddings, each block's norms, q/k/v, attention output,
    // projection, residuals and feed-forward; per sequence each block's
    // scores, softmax and dropout (heads x T x T); the head's logits.
    const double tokens = data.features > 0 ? data.features : ctx;
    m.activations =
        tokens * (2 * d + layers * (8 * d + 2 * ff) + d + v) + layers * 3 * heads * tokens * tokens;
    m.field = "model.transformer_lm";
  } else if (model.has_torchscript()) {
    // A saved module is mostly its parameters: its size is a lower bound.
    if (file_size) {
      m.parameter_bytes =
          std::max<double>(0, static_cast<double>(file_size(model.torchscript().path())));
    }
    m.activations = data.features;
    m.field = "model.torchscript.path";
  }
  return m;
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
  e.parameters = model.parameters * kFloat + model.parameter_bytes;
  e.gradients = e.parameters;
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
  e.data = data.bytes;
  const double batch = spec.training().batch_size_per_rank();
  // Forward values and their gradients in backward.
  e.activations = batch * model.activations * kFloat * 2;

  const double params_part = e.parameters + e.gradients + e.optimizer + e.communication;
  if (params_part >= e.data && params_part >= e.activations) {
    e.field = model.field;
  } else if (e.data >= e.activations) {
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
  add("parameters", parameters);
  add("gradients", gradients);
  add("optimizer state", optimizer);
  add("communication buffers", communication);
  add("data", data);
  add("activations", activations);
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

int64_t LocalFileSize(const std::string& path) {
  struct stat st;
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_size);
}

int64_t ParseMemTotal(const std::string& meminfo) {
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemTotal:")) continue;
    line = absl::StripAsciiWhitespace(line);
    int64_t kib = 0;
    if (!absl::ConsumeSuffix(&line, "kB")) return 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) || kib <= 0) return 0;
    return kib * 1024;
  }
  return 0;
}

int64_t MachineMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  if (!in) return 0;
  std::stringstream text;
  text << in.rdbuf();
  return ParseMemTotal(text.str());
}

}  // namespace chorus
