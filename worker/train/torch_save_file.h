// Where the tensors of a torch.save file lie, read without LibTorch and
// without reading their values: the file's zip directory and its data.pkl
// (a few hundred bytes), so that a rank indexing a directory of tensor_file
// shards (data.shards format TENSOR_FILES) reads almost nothing of them.
//
// torch.save (zip serialization, the default since PyTorch 1.6, and
// torch::pickle_save) writes a zip archive whose members are stored, not
// compressed: ARCHIVE/data.pkl, a pickle of the saved object in which each
// tensor is a call of torch._utils._rebuild_tensor_v2(storage,
// storage_offset, size, stride, ...), and one member ARCHIVE/data/KEY per
// storage holding its values as they are in memory (little-endian). So the
// values of a C-contiguous tensor are one byte range of the file (Note
// [Tensor file shards] in shard_index.cc).
//
// Thread-safety: a pure function of the file.
//
// Example:
//   ASSIGN_OR_RETURN(std::vector<SavedTensor> tensors, ReadTorchSaveDict(fd, path, size));
//   for (const SavedTensor& t : tensors) { ... t.key, t.type, t.sizes, t.values ... }
#ifndef CHORUS_WORKER_TRAIN_TORCH_SAVE_FILE_H_
#define CHORUS_WORKER_TRAIN_TORCH_SAVE_FILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/train/shard_index.h"

namespace chorus {

// One value of the saved dict under a string key.
struct SavedTensor {
  std::string key;
  // Whether it is a tensor; `what` says what it is ("a tensor", "a dict",
  // "a torch.nn.modules.linear Linear", ...).
  bool is_tensor = false;
  std::string what;
  // The storage's class as pickled ("FloatStorage", ...), its key (its
  // values are the member ARCHIVE/data/KEY), and its element type, if it is
  // one that is read (float32/64, int8/16/32/64, uint8).
  std::string storage_class;
  std::string storage_key;
  std::optional<ElementType> type;
  std::vector<int64_t> sizes, strides;
  int64_t storage_offset = 0;  // in elements
  // The storage's values in the file; compressed: stored compressed in the
  // zip (never by torch.save).
  ByteRange storage;
  bool compressed = false;

  // Whether the strides are those of a C-contiguous tensor of `sizes`
  // (dimensions of size 1 may have any stride).
  bool Contiguous() const;
};

// The string-keyed entries of the dict saved in the torch.save file `path`
// (`size` bytes, open as `fd`), in the order they were pickled.
// INVALID_ARGUMENT naming the file for one that is not a zip archive with a
// data.pkl (a legacy torch.save file, _use_new_zipfile_serialization=False,
// included), a pickle that is not a dict or uses what is not read here, a
// tensor with a negative size, a storage that the zip does not hold or whose
// size is not its element count's, values saved big-endian, or a pickle
// whose values (or the entries read from them) take more than 64 MiB;
// DATA_LOSS if it cannot be read. Entries are not deduplicated: a damaged
// pickle may give a key twice (torch.load keeps the last).
absl::StatusOr<std::vector<SavedTensor>> ReadTorchSaveDict(int fd, const std::string& path,
                                                           int64_t size);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_TORCH_SAVE_FILE_H_
