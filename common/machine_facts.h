// Facts about this machine that change benchmark results: core count, the
// kernel's free page reporting (memory given back to the host and faulted in
// again on next use), and what touching a fresh page costs here. Benchmarks
// print them beside their figures so a ratio can be read against the machine
// it came from.
//
// Thread-safety: every function is safe to call from any thread.
//
// Example:
//   std::cerr << ReadMachineFacts().ToString() << "\n";
//   const int64_t before = MinorPageFaults();
//   ... the operation ...
//   const int64_t faults = MinorPageFaults() - before;
#ifndef CHORUS_COMMON_MACHINE_FACTS_H_
#define CHORUS_COMMON_MACHINE_FACTS_H_

#include <cstdint>
#include <string>

namespace chorus {

struct MachineFacts {
  int cores = 0;
  // /sys/module/page_reporting/parameters/page_reporting_order; -1 when the
  // kernel does not report free pages (or the file cannot be read).
  int page_reporting_order = -1;
  // Microseconds per 4 KiB page to write one byte into each page of memory
  // this process has never touched (the best of a few rounds).
  double first_touch_us_per_page = 0;

  // "cores=2 page_reporting_order=9 first_touch_us_per_page=1.71"
  std::string ToString() const;
};

// Measures first_touch_us_per_page by touching `probe_bytes` of fresh memory
// a few times (about 0.1 s for the default on a slow VM).
MachineFacts ReadMachineFacts(size_t probe_bytes = size_t{64} << 20);

// Minor page faults this process (all threads) has taken so far.
int64_t MinorPageFaults();

// False in a ThreadSanitizer build, whose shadow memory takes page faults of
// its own on first access: a count of the process' faults then says nothing
// about Chorus' code, and tests that bound it skip.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kPageFaultCountsAreMeaningful = false;
#else
inline constexpr bool kPageFaultCountsAreMeaningful = true;
#endif

}  // namespace chorus

#endif  // CHORUS_COMMON_MACHINE_FACTS_H_
