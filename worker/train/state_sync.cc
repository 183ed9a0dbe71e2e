#include "worker/train/state_sync.h"

#include <torch/optim/optimizer.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace chorus {

absl::StatusOr<std::optional<SharedState>> ShareNewestState(
    Communicator& comm, Model& model, const std::vector<torch::optim::Optimizer*>& optimizers,
    const Snapshot* held, absl::Time deadline) {
  const int64_t mine = held != nullptr ? held->position.step : -1;
  // What the members exchange lives where the communicator works (a GPU for
  // NCCL); the bytes are packed and unpacked on the host.
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong).device(comm.device());
  at::Tensor newest = torch::full({1}, mine, longs);
  RETURN_IF_ERROR(comm.AllReduce(newest, ReduceOp::kMax, "elastic/newest_step")->Wait(deadline));
  const int64_t step = newest.item<int64_t>();
  if (step < 0) return std::nullopt;  // every member knows: the same all-reduce
  at::Tensor source = torch::full({1}, mine == step ? comm.rank() : comm.size(), longs);
  RETURN_IF_ERROR(comm.AllReduce(source, ReduceOp::kMin, "elastic/source")->Wait(deadline));
  SharedState shared;
  shared.source = static_cast<int>(source.item<int64_t>());

  // The source's two files, model then training state, back to back.
  std::vector<CheckpointFileData> files;
  at::Tensor sizes = torch::zeros({2}, torch::kLong);
  if (comm.rank() == shared.source) {
    for (const CheckpointFileSource& f : StreamFiles(*held)) {
      ASSIGN_OR_RETURN(CheckpointFileData data, ReadAll(f));
      files.push_back(std::move(data));
    }
    if (files.size() != 2) return absl::InternalError("a snapshot must stream two files");
    sizes[0] = static_cast<int64_t>(files[0].bytes.size());
    sizes[1] = static_cast<int64_t>(files[1].bytes.size());
  }
  sizes = sizes.to(comm.device());
  RETURN_IF_ERROR(comm.Broadcast(sizes, shared.source, "elastic/state_sizes")->Wait(deadline));
  sizes = sizes.cpu();
  const int64_t model_bytes = sizes[0].item<int64_t>();
  const int64_t state_bytes = sizes[1].item<int64_t>();
  shared.bytes = model_bytes + state_bytes;
  at::Tensor bytes = torch::empty({shared.bytes}, torch::kUInt8);
  char* data = static_cast<char*>(bytes.data_ptr());
  if (comm.rank() == shared.source) {
    std::memcpy(data, files[0].bytes.data(), model_bytes);
    std::memcpy(data + model_bytes, files[1].bytes.data(), state_bytes);
  }
  if (comm.device().is_cpu()) {
    RETURN_IF_ERROR(comm.Broadcast(bytes, shared.source, "elastic/state")->Wait(deadline));
  } else {
    at::Tensor on_device = bytes.to(comm.device());
    RETURN_IF_ERROR(comm.Broadcast(on_device, shared.source, "elastic/state")->Wait(deadline));
    bytes.copy_(on_device);
  }
  if (comm.rank() != shared.source) {
    files.resize(2);
    files[0].bytes.assign(data, model_bytes);
    files[1].bytes.assign(data + model_bytes, state_bytes);
  }
  files[0].name = kModelFile;
  files[1].name = kTrainStateFile;
  // Every member loads the state, the source too: its optimizers were built
  // afresh with the new communicator's strategy.
  ASSIGN_OR_RETURN(shared.position, Restore(files, model, optimizers));
  shared.position.world_size = comm.size();
  return std::optional<SharedState>(std::move(shared));
}

absl::StatusOr<int> AverageHeldModels(Communicator& comm, Model& model, const Snapshot* held,
                                      absl::Time deadline) {
  torch::NoGradGuard no_grad;
  // The model's tensors in the order a snapshot files them: parameters,
  // then buffers (CollectSnapshot).
  std::vector<NamedTensor> live = model.NamedParameters();
  for (NamedTensor& b : model.NamedBuffers()) live.push_back(std::move(b));
  if (held != nullptr && held->model.size() != live.size()) {
    return absl::InternalError(absl::StrCat("the held model has ", held->model.size(),
                                            " tensors, the model ", live.size()));
  }
  int64_t total = 0;
  std::vector<size_t> averaged;  // indices into `live`
  for (size_t i = 0; i < live.size(); ++i) {
    if (!at::isFloatingType(live[i].tensor.scalar_type())) continue;
    if (held != nullptr && (held->model[i].first != live[i].name ||
                            held->model[i].second.numel() != live[i].tensor.numel())) {
      return absl::InternalError(absl::StrCat("held tensor ", held->model[i].first,
                                              " does not match the model's ", live[i].name));
    }
    averaged.push_back(i);
    total += live[i].tensor.numel();
  }
  // Every averaged tensor back to back, then the count of holders.
  at::Tensor sums =
      at::zeros({total + 1}, at::TensorOptions().dtype(at::kDouble).device(comm.device()));
  if (held != nullptr) {
    int64_t offset = 0;
    for (size_t i : averaged) {
      const at::Tensor& t = held->model[i].second;
      sums.narrow(0, offset, t.numel()).copy_(t.reshape({-1}));
      offset += t.numel();
    }
    sums[total] = 1.0;
  }
  RETURN_IF_ERROR(comm.AllReduce(sums, ReduceOp::kSum, "elastic/average_models")->Wait(deadline));
  const int holders = static_cast<int>(sums[total].item<double>());
  if (holders == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("none of the ", comm.size(), " ranks of the new generation holds a model"));
  }
  sums = sums.narrow(0, 0, total) / holders;
  int64_t offset = 0;
  for (size_t i : averaged) {
    at::Tensor& t = live[i].tensor;
    t.copy_(sums.narrow(0, offset, t.numel()).reshape(t.sizes()));
    offset += t.numel();
  }
  return holders;
}

}  // namespace chorus
