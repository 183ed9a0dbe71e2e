// CheckpointStorage: where a rank's checkpoints go and come back from — the
// coordinator's checkpoint store (CoordinatorCheckpointStorage), a directory
// shared by all nodes (SharedDirCheckpointStorage), or memory in tests — and
// the file types that cross it.
//
// A file is handed to Store as a CheckpointFileSource: it is produced while
// it is written (the rank serializes tensors straight into the storage's
// buffers), so no serialized copy of a checkpoint is ever held in memory.
// Load returns whole files (CheckpointFileData), checked against the
// manifest's sizes and checksums.
//
// Thread-safety: implementations say; the rank's CheckpointWriter calls
// Store from its own thread, one checkpoint at a time, and Load from the
// training thread before training starts.
//
// Example:
//   std::vector<CheckpointFileSource> files = {
//       {"model.pt", [&](const CheckpointByteSink& out) { return out(bytes); }}};
//   RETURN_IF_ERROR(storage.Store(/*step=*/100, files));
//   ASSIGN_OR_RETURN(std::vector<CheckpointFileData> back, storage.Load(manifest));
#ifndef CHORUS_CHECKPOINT_STORAGE_H_
#define CHORUS_CHECKPOINT_STORAGE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chorus/v1/coordinator.pb.h"

namespace chorus {

// A whole file of a checkpoint, in memory.
struct CheckpointFileData {
  std::string name;
  std::string bytes;
};

// Receives a file's bytes in order, one piece per call; a piece is valid
// only during the call. An error stops the file.
using CheckpointByteSink = std::function<absl::Status(absl::string_view piece)>;

// One file of a checkpoint, produced while it is written: `write` hands
// the file's bytes to `out` in order and returns out's first error (or a
// serialization error). It may be called more than once; each call
// produces the same bytes.
struct CheckpointFileSource {
  std::string name;
  std::function<absl::Status(const CheckpointByteSink& out)> write;
};

// The whole of `source` in memory.
absl::StatusOr<CheckpointFileData> ReadAll(const CheckpointFileSource& source);

class CheckpointStorage {
 public:
  virtual ~CheckpointStorage() = default;
  // Stores `files` as this rank's part of checkpoint `step`; OK once the
  // coordinator has committed them.
  virtual absl::Status Store(int64_t step, const std::vector<CheckpointFileSource>& files) = 0;
  // The files `manifest` lists, checked against its sizes and checksums
  // (DATA_LOSS when they do not match).
  virtual absl::StatusOr<std::vector<CheckpointFileData>> Load(
      const v1::CheckpointManifest& manifest) = 0;
};

}  // namespace chorus

#endif  // CHORUS_CHECKPOINT_STORAGE_H_
