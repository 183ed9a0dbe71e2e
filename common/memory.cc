#include "common/memory.h"

#include <malloc.h>

#include <climits>
#include <cstdlib>
#include <initializer_list>

namespace chorus {

bool KeepFreedMemoryForReuse(const MemoryReuseOptions& options) {
  for (const char* knob : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(knob) != nullptr) return false;
  }
  auto as_int = [](size_t v) { return static_cast<int>(v > INT_MAX ? INT_MAX : v); };
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, as_int(options.mmap_threshold)) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, as_int(options.trim_threshold)) == 1;
  return mmap_ok && trim_ok;
}

}  // namespace chorus
