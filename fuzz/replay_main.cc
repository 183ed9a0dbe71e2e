// The main of a fuzz target built as a regular test (the default gcc
// build): feeds every input file named on the command line to
// LLVMFuzzerTestOneInput, once, so that `bazel test` replays the seed corpus
// and every input that once made the target fail. A failing input aborts the
// test (the targets check their properties with CHECK-style aborts, and the
// sanitizer configurations catch memory errors); the file being replayed is
// printed to stderr first, so the log names it.
//
// Arguments are files (fuzz/corpus/TARGET/FILE, fuzz/regressions/TARGET/FILE)
// or directories holding them. Files are grouped by the directory above
// their target's (corpus, regressions), one test case per group; the corpus
// group must not be empty.
//
// Example (what chorus_fuzz_test in fuzz/fuzz.bzl generates):
//   job_spec_fuzzer fuzz/corpus/job_spec_fuzzer/valid.textproto ...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class ReplayTest : public ::testing::Test {
 public:
  explicit ReplayTest(std::vector<std::string> files) : files_(std::move(files)) {}
  void TestBody() override {
    for (const std::string& file : files_) {
      const std::string bytes = ReadWhole(file);
      std::fprintf(stderr, "replaying %s (%zu bytes)\n", file.c_str(), bytes.size());
      // libFuzzer hands the target its own copy; so do we (a target that
      // reads past `size` is caught by the sanitizers either way).
      std::vector<uint8_t> copy(bytes.begin(), bytes.end());
      EXPECT_EQ(LLVMFuzzerTestOneInput(copy.data(), copy.size()), 0) << file;
    }
  }

 private:
  const std::vector<std::string> files_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::map<std::string, std::vector<std::string>> groups;
  for (int i = 1; i < argc; ++i) {
    const fs::path path(argv[i]);
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
        if (e.is_regular_file()) {
          groups[path.parent_path().filename().string()].push_back(e.path().string());
        }
      }
    } else {
      groups[path.parent_path().parent_path().filename().string()].push_back(path.string());
    }
  }
  if (groups["corpus"].empty()) {
    std::fprintf(stderr, "no corpus files given: nothing would be replayed\n");
    return 1;
  }
  for (auto& [group, files] : groups) {
    std::sort(files.begin(), files.end());
    const std::string name = group + "_" + std::to_string(files.size()) + "_files";
    ::testing::RegisterTest(
        "Replay", name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
        [files = files]() -> ::testing::Test* { return new ReplayTest(files); });
  }
  return RUN_ALL_TESTS();
}
