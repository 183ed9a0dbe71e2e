// Keeps memory a process frees for its own reuse instead of handing it back
// to the system at once. glibc returns large freed blocks (mmap'd ones at
// once, the top of the heap past a trim threshold), so a loop that allocates
// and frees the same large tensors every step faults every page in anew each
// time; on a VM that reports free pages to its host, a page taken anew costs
// microseconds. Training ranks and the coordinator call this at startup.
//
// Thread-safety: call once at startup, before other threads allocate.
//
// Example:
//   int main(int argc, char** argv) {
//     KeepFreedMemoryForReuse({});
//     ...
#ifndef CHORUS_COMMON_MEMORY_H_
#define CHORUS_COMMON_MEMORY_H_

#include <cstddef>

namespace chorus {

struct MemoryReuseOptions {
  // Blocks up to this size come from the heap, where freed ones are reused;
  // larger ones are mapped and unmapped on their own. glibc allows at most
  // 32 MiB on 64-bit machines.
  size_t mmap_threshold = size_t{32} << 20;
  // Up to this much free memory at the top of a heap is kept, not returned.
  size_t trim_threshold = size_t{1} << 30;
};

// Applies `options` with mallopt, unless the environment sets glibc's own
// knobs (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES):
// an operator's explicit choice wins. Returns whether it applied them.
bool KeepFreedMemoryForReuse(const MemoryReuseOptions& options);

}  // namespace chorus

#endif  // CHORUS_COMMON_MEMORY_H_
