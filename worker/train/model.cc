#include "worker/train/model.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/pooling.h>
#include <torch/script.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <functional>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace chorus {
namespace {

// Guards the process's default generators (Note [Seeded draws] in model.h).
ABSL_CONST_INIT absl::Mutex seeded_draws_mu(absl::kConstInit);

// One pre-norm decoder block: causal multi-head self-attention and a GELU
// feed-forward layer, each wrapped in a residual connection.
class DecoderBlockImpl : public torch::nn::Module {
 public:
  DecoderBlockImpl(const v1::TransformerLmModel& s)
      : heads_(s.num_heads()),
        norm1_(register_module("norm1",
                               torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model()})))),
        qkv_(register_module("qkv", torch::nn::Linear(s.d_model(), 3 * s.d_model()))),
        proj_(register_module("proj", torch::nn::Linear(s.d_model(), s.d_model()))),
        norm2_(register_module("norm2",
                               torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model()})))),
        ff1_(register_module("ff1", torch::nn::Linear(s.d_model(), s.d_ff()))),
        ff2_(register_module("ff2", torch::nn::Linear(s.d_ff(), s.d_model()))),
        dropout_(register_module("dropout", torch::nn::Dropout(s.dropout()))) {}

  // x: [B, T, D]; mask: [T, T] with -inf above the diagonal.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2), dh = d / heads_;
    std::vector<torch::Tensor> qkv = qkv_->forward(norm1_->forward(x)).chunk(3, /*dim=*/2);
    auto split = [&](const torch::Tensor& m) { return m.view({b, t, heads_, dh}).transpose(1, 2); };
    torch::Tensor q = split(qkv[0]), k = split(qkv[1]), v = split(qkv[2]);
    torch::Tensor scores =
        q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(dh)) + mask;
    torch::Tensor attn = dropout_->forward(scores.softmax(-1)).matmul(v);
    torch::Tensor h =
        x + dropout_->forward(proj_->forward(attn.transpose(1, 2).reshape({b, t, d})));
    torch::Tensor ff = ff2_->forward(torch::gelu(ff1_->forward(norm2_->forward(h))));
    return h + dropout_->forward(ff);
  }

 private:
  int64_t heads_;
  torch::nn::LayerNorm norm1_;
  torch::nn::Linear qkv_, proj_;
  torch::nn::LayerNorm norm2_;
  torch::nn::Linear ff1_, ff2_;
  torch::nn::Dropout dropout_;
};
TORCH_MODULE(DecoderBlock);

// Decoder-only language model: token + learned position embeddings, blocks,
// final LayerNorm, linear head. Input [B, T] int64 tokens, output [B, T, V].
class TransformerLmImpl : public torch::nn::Module {
 public:
  explicit TransformerLmImpl(const v1::TransformerLmModel& s)
      : tokens_(register_module("tokens", torch::nn::Embedding(s.vocab_size(), s.d_model()))),
        positions_(
            register_module("positions", torch::nn::Embedding(s.context_length(), s.d_model()))),
        blocks_(register_module("blocks", torch::nn::ModuleList())),
        norm_(register_module("norm",
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model()})))),
        head_(register_module("head", torch::nn::Linear(s.d_model(), s.vocab_size()))),
        dropout_(register_module("dropout", torch::nn::Dropout(s.dropout()))),
        context_(s.context_length()) {
    for (int i = 0; i < s.num_layers(); ++i) blocks_->push_back(DecoderBlock(s));
  }

  torch::Tensor forward(const torch::Tensor& input) {
    const int64_t t = input.size(1);
    TORCH_CHECK(t <= context_, "sequence of ", t, " tokens is longer than context_length ",
                context_);
    torch::Tensor pos =
        torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(input.device()));
    torch::Tensor h = dropout_->forward(tokens_->forward(input) + positions_->forward(pos));
    torch::Tensor mask = torch::full({t, t}, -INFINITY, h.options()).triu(1);
    for (const auto& block : *blocks_) h = block->as<DecoderBlock>()->forward(h, mask);
    return head_->forward(norm_->forward(h));
  }

 private:
  torch::nn::Embedding tokens_, positions_;
  torch::nn::ModuleList blocks_;
  torch::nn::LayerNorm norm_;
  torch::nn::Linear head_;
  torch::nn::Dropout dropout_;
  int64_t context_;
};
TORCH_MODULE(TransformerLm);

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// Each tensor once (tied weights): WithoutRepeatedTensors.
std::vector<NamedTensor> Named(const torch::OrderedDict<std::string, torch::Tensor>& items) {
  std::vector<NamedTensor> out;
  for (const auto& item : items) out.push_back({item.key(), item.value()});
  return WithoutRepeatedTensors(std::move(out));
}

// mlp, cnn and transformer_lm: a torch::nn module with a tensor -> tensor
// forward.
class BuiltinModel : public Model {
 public:
  BuiltinModel(std::shared_ptr<torch::nn::Module> module,
               std::function<torch::Tensor(const torch::Tensor&)> forward)
      : module_(std::move(module)), forward_(std::move(forward)) {}

  absl::StatusOr<at::Tensor> Forward(const at::Tensor& input) override { return forward_(input); }
  std::vector<NamedTensor> NamedParameters() override { return Named(module_->named_parameters()); }
  std::vector<NamedTensor> NamedBuffers() override { return Named(module_->named_buffers()); }
  std::vector<NamedTensor> StateDictEntries() override {
    std::vector<NamedTensor> out;
    for (const auto& item : module_->named_parameters()) out.push_back({item.key(), item.value()});
    for (const auto& item : module_->named_buffers()) out.push_back({item.key(), item.value()});
    return out;
  }
  void SetTraining(bool training) override { module_->train(training); }
  void To(const c10::Device& device) override { module_->to(device); }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::function<torch::Tensor(const torch::Tensor&)> forward_;
};

class ScriptModel : public Model {
 public:
  ScriptModel(torch::jit::Module module, std::string path)
      : module_(std::move(module)), path_(std::move(path)) {}

  absl::StatusOr<at::Tensor> Forward(const at::Tensor& input) override {
    c10::IValue out;
    try {
      out = module_.forward({input});
    } catch (const std::exception& e) {
      // The interpreter's message ends with the Python-style error line after
      // a TorchScript traceback; that line is what the user needs.
      std::string what = e.what();
      while (!what.empty() && what.back() == '\n') what.pop_back();
      const size_t last = what.rfind('\n');
      return absl::InvalidArgumentError(
          absl::StrCat("TorchScript model ", path_, ": forward failed on input of shape ",
                       c10::str(input.sizes()), " (", c10::toString(input.scalar_type()),
                       "): ", last == std::string::npos ? what : what.substr(last + 1)));
    }
    if (!out.isTensor()) {
      return absl::InvalidArgumentError(absl::StrCat("TorchScript model ", path_,
                                                     ": forward must return a tensor, it returned ",
                                                     out.tagKind()));
    }
    return out.toTensor();
  }
  std::vector<NamedTensor> NamedParameters() override {
    std::vector<NamedTensor> out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true))
      out.push_back({p.name, p.value});
    return WithoutRepeatedTensors(std::move(out));
  }
  std::vector<NamedTensor> NamedBuffers() override {
    std::vector<NamedTensor> out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.push_back({b.name, b.value});
    return WithoutRepeatedTensors(std::move(out));
  }
  std::vector<NamedTensor> StateDictEntries() override {
    std::vector<NamedTensor> out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true))
      out.push_back({p.name, p.value});
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.push_back({b.name, b.value});
    return out;
  }
  void SetTraining(bool training) override { module_.train(training); }
  void To(const c10::Device& device) override { module_.to(device); }

 private:
  torch::jit::Module module_;
  std::string path_;
};

absl::StatusOr<std::unique_ptr<Model>> BuildSequential(const v1::ModelSpec& m,
                                                       const Dataset& data) {
  const std::vector<int64_t> sample(data.x.sizes().begin() + 1, data.x.sizes().end());
  int64_t features = 1;
  for (int64_t d : sample) features *= d;
  const int64_t outputs = data.num_classes > 0 ? data.num_classes : 1;
  torch::nn::Sequential model;
  if (m.has_mlp()) {
    model->push_back(torch::nn::Flatten());
    int64_t width = features;
    for (int h : m.mlp().hidden_sizes()) {
      model->push_back(torch::nn::Linear(width, h));
      model->push_back(torch::nn::ReLU());
      if (m.mlp().dropout() > 0) model->push_back(torch::nn::Dropout(m.mlp().dropout()));
      width = h;
    }
    model->push_back(torch::nn::Linear(width, outputs));
  } else {
    if (sample.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.cnn needs image inputs [channels, height, width]; the data has ",
                       sample.size(), " dimensions per sample"));
    }
    const v1::CnnModel& c = m.cnn();
    const int64_t k = c.kernel_size();
    model->push_back(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(sample[0], c.channels(0), k).padding(k / 2)));
    model->push_back(torch::nn::ReLU());
    model->push_back(torch::nn::MaxPool2d(2));
    model->push_back(torch::nn::Conv2d(
        torch::nn::Conv2dOptions(c.channels(0), c.channels(1), k).padding(k / 2)));
    model->push_back(torch::nn::ReLU());
    model->push_back(torch::nn::MaxPool2d(2));
    model->push_back(torch::nn::Flatten());
    model->push_back(
        torch::nn::Linear(c.channels(1) * (sample[1] / 4) * (sample[2] / 4), c.fc_hidden()));
    model->push_back(torch::nn::ReLU());
    if (c.dropout() > 0) model->push_back(torch::nn::Dropout(c.dropout()));
    model->push_back(torch::nn::Linear(c.fc_hidden(), outputs));
  }
  return std::make_unique<BuiltinModel>(
      model.ptr(), [model](const torch::Tensor& x) mutable { return model->forward(x); });
}

}  // namespace

void Model::To(const c10::Device& device) {
  torch::NoGradGuard no_grad;
  std::vector<NamedTensor> tensors = NamedParameters();
  for (NamedTensor& b : NamedBuffers()) tensors.push_back(std::move(b));
  for (NamedTensor& t : tensors) {
    if (t.tensor.device() != device) t.tensor.set_data(t.tensor.to(device));
  }
}

std::vector<NamedTensor> Model::StateDictEntries() {
  std::vector<NamedTensor> out = NamedParameters();
  for (NamedTensor& b : NamedBuffers()) out.push_back(std::move(b));
  return out;
}

std::vector<at::Tensor> Model::Parameters() {
  std::vector<at::Tensor> out;
  for (NamedTensor& p : NamedParameters()) out.push_back(std::move(p.tensor));
  return out;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Build(const v1::ModelSpec& spec,
                                                    const Dataset& train) {
  if (spec.has_mlp() || spec.has_cnn()) return BuildSequential(spec, train);
  if (spec.has_transformer_lm()) {
    const v1::TransformerLmModel& s = spec.transformer_lm();
    if (train.x.dim() != 2 || train.x.scalar_type() != at::kLong) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.transformer_lm needs int64 token sequences [N, T]; the data is ",
          c10::toString(train.x.scalar_type()), " of shape ", c10::str(train.x.sizes())));
    }
    if (train.x.size(1) > s.context_length()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.transformer_lm.context_length is ", s.context_length(),
                       " but the data's sequences have ", train.x.size(1), " tokens"));
    }
    if (train.num_classes > s.vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.transformer_lm.vocab_size is ", s.vocab_size(),
                       " but the data has token ids up to ", train.num_classes - 1));
    }
    TransformerLm lm(s);
    return std::make_unique<BuiltinModel>(
        lm.ptr(), [lm](const torch::Tensor& x) mutable { return lm->forward(x); });
  }
  if (spec.has_torchscript()) {
    const std::string& path = spec.torchscript().path();
    try {
      return std::make_unique<ScriptModel>(torch::jit::load(path), path);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.torchscript.path: cannot load ", path,
          " as a TorchScript module (write it with torch.jit.script(model).save(path) or "
          "torch.jit.trace): ",
          FirstLine(e.what())));
    }
  }
  return absl::InvalidArgumentError("job spec has no model");
}

void WithSeed(uint64_t seed, absl::FunctionRef<void()> draws) {
  absl::MutexLock lock(&seeded_draws_mu);
  torch::manual_seed(seed);
  draws();
}

}  // namespace chorus
