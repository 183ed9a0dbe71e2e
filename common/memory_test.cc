#include "common/memory.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "common/machine_facts.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

// Each round allocates and fills `blocks` blocks of `bytes`, then frees
// them all, as a training step does with its large temporaries; returns the
// page faults of the rounds after the first.
int64_t FaultsOfRepeatedLargeBlocks(size_t bytes, int blocks, int rounds) {
  int64_t before = 0;
  for (int i = 0; i < rounds; ++i) {
    if (i == 1) before = MinorPageFaults();
    std::vector<std::unique_ptr<char[]>> held;
    for (int b = 0; b < blocks; ++b) {
      held.emplace_back(new char[bytes]);
      std::memset(held.back().get(), i + b, bytes);
    }
    for (const auto& block : held) {
      if (block[bytes / 2] == 0x7f) std::abort();  // keeps the fills
    }
  }
  return MinorPageFaults() - before;
}

TEST(MemoryTest, RepeatedLargeBlocksAreReusedNotFaultedInAgain) {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizers bring their own allocator, which mallopt does not configure";
#endif
  ASSERT_TRUE(KeepFreedMemoryForReuse({}));
  // 6 x 16 MiB per round: by default glibc hands the 96 MiB back after every
  // round (its trim threshold follows the largest freed block, here 32 MiB)
  // and each round faults its 24576 pages in again.
  const int64_t faults = FaultsOfRepeatedLargeBlocks(size_t{16} << 20, 6, 5);
  EXPECT_LT(faults, 200) << "freed blocks were given back and faulted in again";
}

TEST(MemoryTest, AnOperatorsGlibcSettingsWin) {
  setenv("MALLOC_TRIM_THRESHOLD_", "0", 1);
  EXPECT_FALSE(KeepFreedMemoryForReuse({}));
  unsetenv("MALLOC_TRIM_THRESHOLD_");
}

}  // namespace
}  // namespace chorus
