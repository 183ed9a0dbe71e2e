#include "worker/train/data.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

constexpr char kFashionMnistPackage[] = "dataset-fashion-mnist (deploy/setup.sh installs it)";
// Fashion-MNIST's published normalization.
constexpr double kFashionMean = 0.2860;
constexpr double kFashionStd = 0.3530;

absl::StatusOr<std::vector<uint8_t>> ReadGz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> chunk(1 << 20);
  while (true) {
    int n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int err = 0;
      std::string message = gzerror(f, &err);
      gzclose(f);
      return absl::InvalidArgumentError(absl::StrCat(path, " is corrupt: ", message));
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + n);
  }
  gzclose(f);
  return bytes;
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Gaussian inputs with labels from a fixed random linear teacher, so the
// task is learnable and identical on every rank for a given seed.
Dataset Synthetic(const v1::JobSpec& spec, Split split) {
  const v1::SyntheticData& s = spec.data().synthetic();
  const int64_t n = split == Split::kTrain ? s.num_samples() : std::max<int64_t>(1, s.num_samples() / 5);
  std::vector<int64_t> shape = {n};
  int64_t features = 1;
  for (int64_t d : s.input_shape()) {
    shape.push_back(d);
    features *= d;
  }
  at::Generator teacher_gen = at::detail::createCPUGenerator(s.seed());
  at::Generator data_gen =
      at::detail::createCPUGenerator(s.seed() * 1000003 + (split == Split::kTrain ? 1 : 2));
  Dataset d;
  d.x = at::randn(shape, data_gen, at::kFloat);
  if (s.kind() == v1::SyntheticData::REGRESSION) {
    at::Tensor w = at::randn({features, 1}, teacher_gen, at::kFloat);
    d.y = d.x.reshape({n, features}).matmul(w).reshape({n});
  } else {
    at::Tensor w = at::randn({features, s.num_classes()}, teacher_gen, at::kFloat);
    d.y = d.x.reshape({n, features}).matmul(w).argmax(1);
    d.num_classes = s.num_classes();
  }
  return d;
}

}  // namespace

absl::StatusOr<at::Tensor> ReadIdx(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadGz(path));
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a uint8 IDX file (bad magic number)"));
  }
  const int dims = bytes[3];
  if (dims < 1 || dims > 4 || bytes.size() < 4 + 4 * static_cast<size_t>(dims)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " has a malformed IDX header"));
  }
  std::vector<int64_t> shape;
  size_t count = 1;
  for (int i = 0; i < dims; ++i) {
    shape.push_back(BigEndian32(bytes.data() + 4 + 4 * i));
    count *= shape.back();
  }
  const size_t offset = 4 + 4 * dims;
  if (bytes.size() != offset + count) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is truncated or too long: the header says ",
                                                   count, " values, the file has ",
                                                   bytes.size() - offset));
  }
  at::Tensor t = at::empty(shape, at::kByte);
  std::memcpy(t.data_ptr(), bytes.data() + offset, count);
  return t;
}

absl::StatusOr<Dataset> LoadDataset(const v1::JobSpec& spec, Split split) {
  const v1::DataSpec& data = spec.data();
  if (data.has_synthetic()) {
    if (data.synthetic().kind() == v1::SyntheticData::TOKENS) {
      return absl::UnimplementedError("synthetic TOKENS data (for transformer_lm) is not supported yet");
    }
    return Synthetic(spec, split);
  }
  if (data.has_fashion_mnist()) {
    const std::string dir = data.fashion_mnist().dir();
    const std::string prefix = split == Split::kTrain ? "train" : "t10k";
    const std::string images_path = absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte.gz");
    const std::string labels_path = absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte.gz");
    absl::StatusOr<at::Tensor> images = ReadIdx(images_path);
    if (!images.ok()) {
      return absl::Status(images.status().code(),
                          absl::StrCat("Fashion-MNIST: ", images.status().message(),
                                       "; the files come from the Debian package ",
                                       kFashionMnistPackage));
    }
    absl::StatusOr<at::Tensor> labels = ReadIdx(labels_path);
    if (!labels.ok()) {
      return absl::Status(labels.status().code(),
                          absl::StrCat("Fashion-MNIST: ", labels.status().message(),
                                       "; the files come from the Debian package ",
                                       kFashionMnistPackage));
    }
    if (images->dim() != 3 || labels->dim() != 1 || images->size(0) != labels->size(0)) {
      return absl::InvalidArgumentError(absl::StrCat("Fashion-MNIST: ", images_path, " and ",
                                                     labels_path, " do not match"));
    }
    Dataset d;
    d.x = ((images->to(at::kFloat) / 255.0 - kFashionMean) / kFashionStd).unsqueeze(1);
    d.y = labels->to(at::kLong);
    d.num_classes = 10;
    const int64_t limit = data.fashion_mnist().train_limit();
    if (split == Split::kTrain && limit > 0 && limit < d.size()) {
      d.x = d.x.narrow(0, 0, limit).contiguous();
      d.y = d.y.narrow(0, 0, limit).contiguous();
    }
    return d;
  }
  if (data.has_tensor_file()) {
    return absl::UnimplementedError("data.tensor_file is not supported yet");
  }
  return absl::InvalidArgumentError("job spec has no data source");
}

}  // namespace chorus
