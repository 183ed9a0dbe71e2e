#include "common/machine_facts.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "absl/strings/str_format.h"

namespace chorus {

std::string MachineFacts::ToString() const {
  return absl::StrFormat("cores=%d page_reporting_order=%d first_touch_us_per_page=%.2f", cores,
                         page_reporting_order, first_touch_us_per_page);
}

MachineFacts ReadMachineFacts(size_t probe_bytes) {
  MachineFacts facts;
  facts.cores = static_cast<int>(std::thread::hardware_concurrency());
  std::ifstream order("/sys/module/page_reporting/parameters/page_reporting_order");
  if (!(order >> facts.page_reporting_order)) facts.page_reporting_order = -1;

  constexpr size_t kPage = 4096;
  const size_t pages = std::max<size_t>(1, probe_bytes / kPage);
  double best = -1;
  for (int round = 0; round < 3; ++round) {
    void* p =
        mmap(nullptr, pages * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) break;
    volatile char* bytes = static_cast<volatile char*>(p);
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < pages; ++i) bytes[i * kPage] = 1;
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() /
        static_cast<double>(pages);
    munmap(p, pages * kPage);
    if (best < 0 || us < best) best = us;
  }
  facts.first_touch_us_per_page = std::max(0.0, best);
  return facts;
}

int64_t MinorPageFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

}  // namespace chorus
