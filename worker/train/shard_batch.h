// ShardBatch: a batch of samples read from a sharded dataset (data.shards),
// and BatchShape, the shapes and types of its tensors. A shard format
// (shard_format.h) decodes samples into a batch's rows; the pipeline
// (shard_pipeline.h) keeps batches in its read-ahead queue and reuses their
// buffers; the trainer gets them from ShardReader::Next (shard_reader.h).
//
// Thread-safety: plain data.
//
// Example:
//   const BatchShape shape{{28, 28}, {}, at::kFloat, at::kLong};
//   shape.BatchBytes(64);  // 64 * (784 * 4 + 8 + 8): what 64 samples count against read-ahead
#ifndef CHORUS_WORKER_TRAIN_SHARD_BATCH_H_
#define CHORUS_WORKER_TRAIN_SHARD_BATCH_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

namespace chorus {

struct ShardBatch {
  at::Tensor indices;  // [B] int64: the sample numbers (for the sample trace)
  at::Tensor x;        // [B, ...] float32 or int64
  at::Tensor y;        // [B] int64 classes, [B, ...] float32 targets, or [B, L] int64 tokens
};

// The values in a tensor of `shape`.
inline int64_t ElementCount(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

// Where row `row` (a sample) of a batch tensor `t` starts.
inline char* RowData(const at::Tensor& t, int64_t row) {
  return static_cast<char*>(t.data_ptr()) + row * t.stride(0) * t.element_size();
}

// A decoded batch's tensors, but for their first dimension (the samples).
struct BatchShape {
  std::vector<int64_t> x, y;           // one sample's input and target
  at::ScalarType x_type = at::kFloat;  // at::kFloat or at::kLong
  at::ScalarType y_type = at::kLong;   // at::kFloat or at::kLong

  // The bytes of a batch of `n` samples: its inputs, targets and sample
  // numbers.
  int64_t BatchBytes(int64_t n) const {
    const int64_t x_bytes = static_cast<int64_t>(c10::elementSize(x_type));
    const int64_t y_bytes = static_cast<int64_t>(c10::elementSize(y_type));
    return n * (ElementCount(x) * x_bytes + ElementCount(y) * y_bytes + 8);
  }
};

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_SHARD_BATCH_H_
