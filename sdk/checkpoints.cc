#include "chorus/checkpoints.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/storage.h"
#include "common/status_macros.h"
#include "worker/tensor_file/tensor_file.h"

namespace chorus {
namespace {

using TensorsByName = std::map<std::string, at::Tensor>;

std::string ShapeOf(const at::Tensor& t) {
  std::string out = "[";
  for (int64_t i = 0; i < t.dim(); ++i) absl::StrAppend(&out, i > 0 ? "," : "", t.size(i));
  return absl::StrCat(out, "] ", c10::toString(t.scalar_type()));
}

}  // namespace

bool HasCheckpoint(const v1::CheckpointManifest& manifest) {
  return !manifest.job_id().empty() && manifest.files_size() > 0;
}

TensorCheckpoints::TensorCheckpoints(CheckpointStorage& storage, int rank, int world_size)
    : storage_(storage), rank_(rank), world_size_(world_size) {}

absl::Status TensorCheckpoints::Save(int64_t step, const std::vector<NamedTensor>& tensors) {
  std::set<std::string> names;
  for (const NamedTensor& t : tensors) {
    if (t.name.empty()) {
      return absl::InvalidArgumentError("checkpoint tensors need names; one has an empty name");
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint tensor '", t.name, "' is listed twice"));
    }
    if (!t.tensor.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint tensor '", t.name, "' is undefined"));
    }
  }
  if (rank_ != 0) return absl::OkStatus();
  // The files only refer to the tensors: Store serializes them before it
  // returns, and the program is not running meanwhile.
  std::vector<std::pair<std::string, at::Tensor>> model;
  for (const NamedTensor& t : tensors) {
    model.emplace_back(t.name, t.tensor.detach().cpu().contiguous());
  }
  const std::vector<std::pair<std::string, at::Tensor>> train_state = {
      {"meta.step", torch::tensor({step}, torch::kLong)},
      {"meta.world_size", torch::tensor({int64_t{world_size_}}, torch::kLong)}};
  absl::Status s = storage_.Store(
      step, {TensorFileSource(kModelFile, model), TensorFileSource(kTrainStateFile, train_state)});
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("checkpoint ", step, ": ", s.message()));
  return absl::OkStatus();
}

absl::StatusOr<TensorCheckpoints::Loaded> TensorCheckpoints::Load(
    const v1::CheckpointManifest& manifest) {
  if (!HasCheckpoint(manifest)) {
    return absl::NotFoundError(
        "no checkpoint to resume from: the job was not submitted with --resume_from");
  }
  const std::string where = absl::StrCat("checkpoint ", manifest.job_id(), ":", manifest.step());
  ASSIGN_OR_RETURN(std::vector<CheckpointFileData> files, storage_.Load(manifest));
  const CheckpointFileData* model_file = nullptr;
  const CheckpointFileData* state_file = nullptr;
  for (const CheckpointFileData& f : files) {
    if (f.name == kModelFile) model_file = &f;
    if (f.name == kTrainStateFile) state_file = &f;
  }
  if (model_file == nullptr || state_file == nullptr) {
    return absl::DataLossError(
        absl::StrCat(where, " lacks ", model_file == nullptr ? kModelFile : kTrainStateFile));
  }
  ASSIGN_OR_RETURN(TensorsByName by_name, ReadTensorFile(*model_file));
  ASSIGN_OR_RETURN(const TensorsByName state, ReadTensorFile(*state_file));
  Loaded loaded;
  auto saved_step = state.find("meta.step");
  loaded.step = saved_step != state.end() ? saved_step->second.item<int64_t>() : manifest.step();
  for (auto& [name, tensor] : by_name) loaded.tensors.push_back({name, std::move(tensor)});
  return loaded;
}

absl::StatusOr<int64_t> TensorCheckpoints::Restore(const v1::CheckpointManifest& manifest,
                                                   const std::vector<NamedTensor>& into) {
  ASSIGN_OR_RETURN(Loaded loaded, Load(manifest));
  const std::string where = absl::StrCat("checkpoint ", manifest.job_id(), ":", manifest.step());
  TensorsByName by_name;
  for (NamedTensor& t : loaded.tensors) by_name.emplace(t.name, std::move(t.tensor));
  // Check everything before changing anything.
  for (const NamedTensor& t : into) {
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      return absl::NotFoundError(absl::StrCat(where, " has no tensor '", t.name, "'"));
    }
    if (!t.tensor.defined() || it->second.sizes() != t.tensor.sizes() ||
        it->second.scalar_type() != t.tensor.scalar_type()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor '", t.name, "' is ", ShapeOf(it->second), " there but ",
                       t.tensor.defined() ? ShapeOf(t.tensor) : std::string("undefined"), " here"));
    }
  }
  {
    torch::NoGradGuard no_grad;
    for (const NamedTensor& t : into) t.tensor.copy_(by_name[t.name]);
  }
  return loaded.step;
}

}  // namespace chorus
