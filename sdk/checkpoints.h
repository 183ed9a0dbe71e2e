// TensorCheckpoints: checkpoints of a set of named tensors the program
// chooses (model parameters, optimizer state, step counters as tensors),
// stored through the same upload and commit path as the built-in trainer's
// (a CheckpointStorage: the coordinator's store or a shared directory) and
// in its format: model.pt holds the tensors by name as a torch::pickle_save
// dict (Python's torch.load reads it; `chorus export` downloads it),
// train_state.pt holds "meta.step" and "meta.world_size"
// (docs/checkpoints.md). Restoring copies the saved values into the
// program's own tensors in place, bit for bit.
//
// The tensors are the job's replicated state: rank 0 stores them and the
// other ranks' Save() returns at once (the coordinator takes one part per
// checkpoint). Every rank restores.
//
// Thread-safety: one thread at a time; Save blocks until the coordinator
// has committed the checkpoint (or the storage's timeout).
//
// Example:
//   TensorCheckpoints checkpoints(storage, session.rank());
//   std::vector<NamedTensor> state = {{"w", w}, {"b", b}};
//   ASSIGN_OR_RETURN(int64_t step, checkpoints.Restore(resume_manifest, state));
//   RETURN_IF_ERROR(checkpoints.Save(step + 100, state));
#ifndef CHORUS_SDK_CHECKPOINTS_H_
#define CHORUS_SDK_CHECKPOINTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chorus/named_tensor.h"
#include "chorus/v1/coordinator.pb.h"

namespace chorus {

// Where checkpoints go (checkpoint/storage.h); Session makes the job's.
class CheckpointStorage;

class TensorCheckpoints {
 public:
  // `storage` must outlive this; `rank`, `world_size`: this rank's.
  TensorCheckpoints(CheckpointStorage& storage, int rank, int world_size);

  // Stores `tensors` as checkpoint `step` (rank 0; a no-op elsewhere).
  // INVALID_ARGUMENT naming the tensor when a name is empty or repeated or
  // a tensor is undefined.
  absl::Status Save(int64_t step, const std::vector<NamedTensor>& tensors);

  // Copies checkpoint `manifest`'s tensors into `into` (every name must be
  // in it, with the same shape and dtype) and returns its step. NOT_FOUND
  // when `manifest` names no checkpoint (the job was not resumed) or lacks
  // a tensor (named); INVALID_ARGUMENT naming a tensor whose shape or dtype
  // differs; DATA_LOSS when a file is damaged.
  absl::StatusOr<int64_t> Restore(const v1::CheckpointManifest& manifest,
                                  const std::vector<NamedTensor>& into);

  // Every tensor of checkpoint `manifest` (in name order, on the CPU) and
  // its step, for a program that rebuilds its state from what was saved
  // (the Python package's load_checkpoint). Errors as Restore's.
  struct Loaded {
    int64_t step = 0;
    std::vector<NamedTensor> tensors;
  };
  absl::StatusOr<Loaded> Load(const v1::CheckpointManifest& manifest);

 private:
  CheckpointStorage& storage_;
  const int rank_;
  const int world_size_;
};

// Whether `manifest` names a checkpoint to resume from.
bool HasCheckpoint(const v1::CheckpointManifest& manifest);

}  // namespace chorus

#endif  // CHORUS_SDK_CHECKPOINTS_H_
