#include "common/machine_facts.h"

#include <sys/mman.h>

#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(MachineFactsTest, ReadsCoresAndMeasuresFirstTouch) {
  MachineFacts facts = ReadMachineFacts(size_t{4} << 20);
  EXPECT_GE(facts.cores, 1);
  EXPECT_GT(facts.first_touch_us_per_page, 0.0);
  EXPECT_GE(facts.page_reporting_order, -1);
  const std::string text = facts.ToString();
  EXPECT_NE(text.find("cores="), std::string::npos) << text;
  EXPECT_NE(text.find("first_touch_us_per_page="), std::string::npos) << text;
}

TEST(MachineFactsTest, CountsTheFaultsOfFreshMemory) {
  if (!kPageFaultCountsAreMeaningful) GTEST_SKIP() << "ThreadSanitizer's shadow memory faults too";

  constexpr size_t kPages = 256;
  void* p =
      mmap(nullptr, kPages * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  volatile char* bytes = static_cast<volatile char*>(p);
  const int64_t before = MinorPageFaults();
  for (size_t i = 0; i < kPages; ++i) bytes[i * 4096] = 1;
  const int64_t first = MinorPageFaults() - before;
  const int64_t again_before = MinorPageFaults();
  for (size_t i = 0; i < kPages; ++i) bytes[i * 4096] = 2;
  const int64_t again = MinorPageFaults() - again_before;
  munmap(p, kPages * 4096);
  // Transparent huge pages may back the range with fewer faults; under
  // AddressSanitizer its shadow memory (a page per 8) faults too.
  EXPECT_GE(first, 1);
  EXPECT_LE(first, static_cast<int64_t>(kPages + kPages / 8) + 8);
  EXPECT_LE(again, 2);
}

}  // namespace
}  // namespace chorus
