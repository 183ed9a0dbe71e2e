// Packing a dataset into tar shards (data.shards format TAR) for
// `chorus dataset pack`: from a tensor_file (torch.save({'x': ..., 'y': ...}))
// or from a folder of KEY.x.npy / KEY.y.npy pairs.
//
// Thread-compatible; writes only the shard files it names, each to a
// temporary name renamed into place (TarWriter).
//
// Example:
//   ASSIGN_OR_RETURN(PackResult r, PackDataset({"train.pt", "/data/train", 10000}));
//   // r.paths_glob == "/data/train-*.tar"
#ifndef CHORUS_WORKER_TRAIN_DATASET_PACK_H_
#define CHORUS_WORKER_TRAIN_DATASET_PACK_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace chorus {

struct PackOptions {
  // A tensor_file, or a folder of KEY.x.npy and KEY.y.npy files.
  std::string from;
  // Shards are written to OUT-000000.tar, OUT-000001.tar, ..., each with
  // its index file beside it (OUT-000000.tar.idx, WriteIndexFile).
  std::string out;
  int64_t samples_per_shard = 10000;
};

struct PackResult {
  int64_t samples = 0;
  int64_t shards = 0;
  int64_t bytes = 0;
  std::string paths_glob;  // for data.shards.paths
};

// INVALID_ARGUMENT naming the file for input that cannot be packed (a
// KEY.x.npy without its KEY.y.npy, a tensor_file without x and y).
absl::StatusOr<PackResult> PackDataset(const PackOptions& options);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_DATASET_PACK_H_
