// Fashion-MNIST for the example programs: a split's two IDX files
// (gzip-compressed, as the Debian package dataset-fashion-mnist installs
// them under /usr/share/datasets/fashion-mnist) read into tensors, each
// pixel normalized with the dataset's published mean and standard deviation
// exactly as Chorus's built-in trainer does it, bit for bit, so a program
// and the built-in MLP recipe train on the same numbers.
//
// Not part of the SDK, which does not load data: a program of one's own
// brings its own reader. The examples share this small one.
//
// Thread-compatible; loading touches only the two files of the split.
//
// Example:
//   absl::StatusOr<examples::FashionMnist> train =
//       examples::LoadFashionMnist("/usr/share/datasets/fashion-mnist", examples::Split::kTrain);
//   if (!train.ok()) return Fail(train.status());
//   at::Tensor x = train->x.index_select(0, indices);  // [B, 1, 28, 28] float
#ifndef CHORUS_EXAMPLES_COMMON_FASHION_MNIST_H_
#define CHORUS_EXAMPLES_COMMON_FASHION_MNIST_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace examples {

enum class Split { kTrain, kTest };

struct FashionMnist {
  at::Tensor x;  // [N, 1, 28, 28] float32, normalized pixels
  at::Tensor y;  // [N] int64 classes 0..9
  int64_t size() const { return x.size(0); }
};

// Reads `split` from `dir` (train-* or t10k-{images-idx3,labels-idx1}-ubyte.gz).
// NOT_FOUND naming the file that cannot be opened and the package that has
// it; INVALID_ARGUMENT naming a file that is not a uint8 IDX file of the
// expected shape, or images and labels that do not match.
absl::StatusOr<FashionMnist> LoadFashionMnist(const std::string& dir, Split split);

}  // namespace examples

#endif  // CHORUS_EXAMPLES_COMMON_FASHION_MNIST_H_
