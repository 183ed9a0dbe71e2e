// Fuzz target: data.tensor_file, a torch.save file the user names, loaded
// by LoadDataset (train split).
//
// Input: the file's bytes.
//
// Unpickling is LibTorch's (torch::jit::pickle_load, not instrumented
// here); what is ours is that no exception escapes and that an accepted
// file gives a dataset the trainer can use:
//   - x and y have the same first dimension, at least 1;
//   - x is float32 or int64, y float32 (regression) or int64 (classes);
//   - class data: every label is in [0, num_classes), num_classes >= 1.
#include <ATen/ATen.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/scratch_dir.h"
#include "worker/train/data.h"

namespace chorus {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "tensor_file_fuzzer: %s\n", what.c_str());
  std::abort();
}

void CheckTensorFile(const std::string& bytes) {
  const std::string path = ScratchDir() + "/input.pt";
  WriteScratchFile(path, bytes);
  v1::JobSpec spec;
  spec.mutable_data()->mutable_tensor_file()->set_path(path);
  absl::StatusOr<Dataset> d = LoadDataset(spec, Split::kTrain);
  if (!d.ok()) {
    if (d.status().message().find("data.tensor_file.path") == absl::string_view::npos) {
      Fail("an error does not name the field: " + d.status().ToString());
    }
    return;
  }
  if (d->x.dim() < 1 || d->y.dim() < 1 || d->x.size(0) != d->y.size(0) || d->x.size(0) < 1) {
    Fail("x and y do not share a non-empty first dimension");
  }
  if (d->x.scalar_type() != at::kFloat && d->x.scalar_type() != at::kLong) {
    Fail("x is neither float32 nor int64");
  }
  if (d->y.scalar_type() == at::kLong) {
    if (d->num_classes < 1 || d->y.min().item<int64_t>() < 0 ||
        d->y.max().item<int64_t>() >= d->num_classes) {
      Fail("class labels outside [0, num_classes) with num_classes " +
           std::to_string(d->num_classes));
    }
  } else if (d->y.scalar_type() != at::kFloat) {
    Fail("y is neither int64 nor float32");
  }
}

}  // namespace
}  // namespace chorus

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::CheckTensorFile(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
