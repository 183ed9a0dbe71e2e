// Datasets a job trains on: whole splits held in memory as tensors.
//
// Thread-compatible; loading touches only the files named.
//
// Example:
//   ASSIGN_OR_RETURN(Dataset train, LoadDataset(spec.data(), spec, Split::kTrain));
//   at::Tensor batch = train.x.index_select(0, indices);
#ifndef CHORUS_WORKER_TRAIN_DATA_H_
#define CHORUS_WORKER_TRAIN_DATA_H_

#include <ATen/core/Tensor.h>

#include <string>

#include "absl/status/statusor.h"
#include "chorus/v1/job.pb.h"

namespace chorus {

enum class Split { kTrain, kTest };

// An empty Dataset (size 0) stands for "no such split": a tensor_file job
// without eval_path has no test split, and evaluation is skipped.
struct Dataset {
  at::Tensor x;         // [N, ...features] float32, or [N, T] int64 token ids
  at::Tensor y;         // [N] int64 classes, or [N, ...] float32 regression targets
  int num_classes = 0;  // 0 for regression; the vocabulary size for tokens
  // The decoded-data cache file x and y are mapped from (Note [Decoded
  // dataset cache] in data.cc); empty when they were decoded here.
  std::string cache_file;
  int64_t size() const { return x.defined() ? x.size(0) : 0; }
};

// Where decoded Fashion-MNIST splits are cached: CHORUS_DATA_CACHE (empty or
// "off": no cache), else $XDG_CACHE_HOME/chorus/datasets, else
// $HOME/.cache/chorus/datasets; empty when none is set.
std::string DecodedCacheDir();

// Loads `split` of the job's data source (the spec must be normalized).
// Errors name the file and what to do (for Fashion-MNIST, the Debian
// package dataset-fashion-mnist). Fashion-MNIST goes through the decoded
// cache (DecodedCacheDir) when there is one.
absl::StatusOr<Dataset> LoadDataset(const v1::JobSpec& spec, Split split);

// Reads an IDX file (optionally gzip-compressed) into a uint8 tensor shaped
// by its header. INVALID_ARGUMENT naming `path` if it is not a uint8 IDX file.
absl::StatusOr<at::Tensor> ReadIdx(const std::string& path);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_DATA_H_
