#include "worker/tensor_file/tensor_file.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace chorus {
namespace {

// Writes `tensors` as a dict in torch::pickle_save's format to `out`,
// straight from the tensors' memory.
absl::Status WritePickled(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                          const std::string& name, const CheckpointByteSink& out) {
  absl::Status status;
  try {
    c10::Dict<std::string, at::Tensor> dict;
    // A GPU tensor (an elastic rank's held state) is written as a CPU one:
    // the file must load anywhere.
    for (const auto& [key, t] : tensors) dict.insert(key, t.is_cpu() ? t : t.to(at::kCPU));
    std::vector<char> pickle;  // small: tensors are only referenced in it
    torch::jit::Pickler pickler(
        [&pickle](const char* p, size_t n) { pickle.insert(pickle.end(), p, p + n); },
        /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr);
    pickler.protocol();
    pickler.pushIValue(c10::IValue(dict));
    pickler.stop();
    // After an error the rest is swallowed: the archive writer must not
    // fail (it throws, also from its destructor).
    caffe2::serialize::PyTorchStreamWriter archive(
        [&status, &out](const void* data, size_t n) -> size_t {
          if (status.ok()) status = out(absl::string_view(static_cast<const char*>(data), n));
          return n;
        });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                       archive);
    archive.writeEndOfFile();
  } catch (const std::exception& e) {
    if (status.ok())
      status =
          absl::InternalError(absl::StrCat("serializing checkpoint file ", name, ": ", e.what()));
  }
  return status;
}

}  // namespace

CheckpointFileSource TensorFileSource(
    std::string name, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  CheckpointFileSource source;
  source.name = name;
  source.write = [&tensors, name = std::move(name)](const CheckpointByteSink& out) {
    return WritePickled(tensors, name, out);
  };
  return source;
}

absl::StatusOr<std::map<std::string, at::Tensor>> ReadTensorFile(const CheckpointFileData& file) {
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(std::vector<char>(file.bytes.begin(), file.bytes.end()));
  } catch (const std::exception& e) {
    return absl::DataLossError(
        absl::StrCat("checkpoint file ", file.name, " cannot be read: ", e.what()));
  }
  if (!value.isGenericDict()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint file ", file.name, " is not a dict of tensors"));
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file ", file.name, " holds a non-tensor entry"));
    }
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

}  // namespace chorus
