// Reading what testdata/pytorch_ddp_reference.py writes (raw little-endian
// arrays), for the tests that compare Chorus DDP with PyTorch DDP.
//
// Example:
//   std::vector<float> want = ReadReferenceArray<float>(dir + "/final.bin");
#ifndef CHORUS_WORKER_DDP_REFERENCE_FILES_H_
#define CHORUS_WORKER_DDP_REFERENCE_FILES_H_

#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace chorus {

// The elements of type T in `path`; empty, with a test failure naming the
// file, when it cannot be read.
template <typename T>
std::vector<T> ReadReferenceArray(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(in) << "cannot read " << path;
  if (!in) return {};
  std::vector<T> data(static_cast<size_t>(in.tellg()) / sizeof(T));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(data.data()),
          static_cast<std::streamsize>(data.size() * sizeof(T)));
  return data;
}

}  // namespace chorus

#endif  // CHORUS_WORKER_DDP_REFERENCE_FILES_H_
