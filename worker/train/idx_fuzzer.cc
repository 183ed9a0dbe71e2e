// Fuzz target: the IDX loader (ReadIdx) and the Fashion-MNIST data source
// built on it (LoadDataset), on files a user's data directory may hold.
//
// Input: one byte choosing what to load, then
//   even: one IDX file (raw, or gzip-compressed) read by ReadIdx;
//   odd:  a u32 length n, then n bytes of images file and the rest as
//         labels file, loaded as data.fashion_mnist { dir } (train split,
//         train_limit from the next byte).
//
// Properties checked besides memory safety and no escaping exception:
//   - an accepted uncompressed IDX file becomes a tensor with exactly the
//     header's shape holding exactly the file's data bytes;
//   - an accepted Fashion-MNIST split has x [N, 1, H, W] float, y [N] int64,
//     and every label a class in [0, num_classes).
#include <ATen/ATen.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "fuzz/fuzz_input.h"
#include "fuzz/scratch_dir.h"
#include "worker/train/data.h"

namespace chorus {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "idx_fuzzer: %s\n", what.c_str());
  std::abort();
}

uint32_t BigEndian32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

void CheckIdx(const std::string& bytes) {
  const std::string path = ScratchDir() + "/input.idx";
  WriteScratchFile(path, bytes);
  absl::StatusOr<at::Tensor> t = ReadIdx(path);
  if (!t.ok()) {
    if (t.status().message().find(path) == absl::string_view::npos) {
      Fail("an error does not name the file: " + t.status().ToString());
    }
    return;
  }
  const bool gzip = bytes.size() >= 2 && bytes[0] == '\x1f' && bytes[1] == '\x8b';
  if (gzip) return;  // the header is inside the compressed stream
  const int dims = static_cast<unsigned char>(bytes[3]);
  if (t->dim() != dims) Fail("the tensor's rank differs from the header's");
  if (t->scalar_type() != at::kByte) Fail("an IDX tensor that is not uint8");
  for (int i = 0; i < dims; ++i) {
    if (t->size(i) != static_cast<int64_t>(BigEndian32(bytes, 4 + 4 * i))) {
      Fail("dimension " + std::to_string(i) + " differs from the header's");
    }
  }
  const size_t offset = 4 + 4 * static_cast<size_t>(dims);
  if (static_cast<size_t>(t->numel()) != bytes.size() - offset) {
    Fail("the tensor holds " + std::to_string(t->numel()) + " values, the file " +
         std::to_string(bytes.size() - offset));
  }
  if (t->numel() > 0 &&
      std::memcmp(t->contiguous().data_ptr(), bytes.data() + offset, bytes.size() - offset) != 0) {
    Fail("the tensor's values differ from the file's");
  }
}

void CheckFashionMnist(FuzzInput& in) {
  const size_t images_bytes = in.U32();
  const std::string images = in.Bytes(images_bytes);
  const uint8_t limit = in.Byte();
  const std::string labels = in.Rest();
  const std::string dir = ScratchDir() + "/fashion";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  WriteScratchFile(dir + "/train-images-idx3-ubyte.gz", images);
  WriteScratchFile(dir + "/train-labels-idx1-ubyte.gz", labels);
  v1::JobSpec spec;
  spec.mutable_data()->mutable_fashion_mnist()->set_dir(dir);
  spec.mutable_data()->mutable_fashion_mnist()->set_train_limit(limit);
  absl::StatusOr<Dataset> d = LoadDataset(spec, Split::kTrain);
  if (!d.ok()) return;
  if (d->x.dim() != 4 || d->x.size(1) != 1 || d->x.scalar_type() != at::kFloat) {
    Fail("images are not [N, 1, H, W] float");
  }
  if (d->y.dim() != 1 || d->y.size(0) != d->x.size(0) || d->y.scalar_type() != at::kLong) {
    Fail("labels are not [N] int64 matching the images");
  }
  if (limit > 0 && d->size() > limit) Fail("train_limit was not applied");
  if (d->size() > 0 &&
      (d->y.min().item<int64_t>() < 0 || d->y.max().item<int64_t>() >= d->num_classes)) {
    Fail("a label outside [0, num_classes)");
  }
}

}  // namespace
}  // namespace chorus

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::FuzzInput in(data, size);
  if (in.Byte() % 2 == 0) {
    chorus::CheckIdx(in.Rest());
  } else {
    chorus::CheckFashionMnist(in);
  }
  return 0;
}
