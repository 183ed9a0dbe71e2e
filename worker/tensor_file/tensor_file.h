// The format of a checkpoint's files: a dict of named tensors in the format
// of torch::pickle_save (a zip archive: the pickle, then each tensor's
// storage as its own record), which Python's torch.load reads. The built-in
// trainer (worker/train/checkpoint.h: model.pt and train_state.pt, and what
// they hold) and the SDK's TensorCheckpoints (sdk/checkpoints.h) both write
// and read their checkpoints through it.
//
// It is a package of its own because both depend on it and the SDK must
// not depend on the trainer; it is not in checkpoint/, which stays free of
// LibTorch for the coordinator and the CLI. Where the files go is a
// CheckpointStorage (checkpoint/storage.h).
//
// Thread-safety: plain functions; a source reads its tensors while it is
// written, so they must not change meanwhile.
//
// Example:
//   std::vector<std::pair<std::string, at::Tensor>> model = {{"fc.weight", w}};
//   RETURN_IF_ERROR(storage.Store(step, {TensorFileSource(kModelFile, model)}));
//   ASSIGN_OR_RETURN(auto tensors, ReadTensorFile(file));  // tensors["fc.weight"]
#ifndef CHORUS_WORKER_TENSOR_FILE_TENSOR_FILE_H_
#define CHORUS_WORKER_TENSOR_FILE_TENSOR_FILE_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/storage.h"

namespace chorus {

// The file `name` holding `tensors` by name, in order, serialized while it
// is written: the bytes are pulled piece by piece straight out of the
// tensors' memory, so no serialized copy is ever held (a GPU tensor is
// copied to the host first: the file must load anywhere). `tensors` must
// outlive the source. The bytes are exactly what torch::pickle_save of the
// same dict writes.
CheckpointFileSource TensorFileSource(
    std::string name, const std::vector<std::pair<std::string, at::Tensor>>& tensors);

// The named tensors of one such file. DATA_LOSS naming the file if it
// cannot be read or holds anything else.
absl::StatusOr<std::map<std::string, at::Tensor>> ReadTensorFile(const CheckpointFileData& file);

}  // namespace chorus

#endif  // CHORUS_WORKER_TENSOR_FILE_TENSOR_FILE_H_
