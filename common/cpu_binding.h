// CPU binding of a node's ranks: each slot of an agent gets its own share of
// the CPUs the agent may run on, and a rank started in that slot runs only
// there (Note [Binding ranks to CPUs] in cpu_binding.cc says why).
//
// Thread-safety: every function is safe to call from any thread. The
// affinity calls act on the calling thread only, as sched_setaffinity(0)
// does: threads it creates afterwards (and processes it spawns) inherit it.
//
// Example:
//   std::vector<int> mine = SlotCpus(AllowedCpus(), /*slot=*/1, /*slots=*/2);
//   // on a 4-CPU machine: {2, 3}; empty when there are more slots than CPUs
//   if (!mine.empty()) absl::Status s = BindThisThread(mine);
//   FormatCpuList({0, 1, 2, 5});  // "0-2,5"
#ifndef CHORUS_COMMON_CPU_BINDING_H_
#define CHORUS_COMMON_CPU_BINDING_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace chorus {

// The CPUs the calling thread may run on (sched_getaffinity), ascending;
// empty if they cannot be read.
std::vector<int> AllowedCpus();

// Slot `slot`'s share of `allowed` when they are split among `slots` slots:
// a contiguous run of allowed.size() / slots CPUs or one more (the first
// allowed.size() % slots slots get the extra one), so neighbouring slots
// share no CPU. Empty (do not bind) when there are more slots than CPUs or
// `slot` is not in [0, slots).
std::vector<int> SlotCpus(const std::vector<int>& allowed, int slot, int slots);

// Restricts the calling thread to `cpus` (non-empty). INVALID_ARGUMENT when
// empty or when a CPU is outside what the kernel accepts (a cgroup cpuset or
// a CPU that does not exist).
absl::Status BindThisThread(const std::vector<int>& cpus);

// "0-3,8,10-11" for {0, 1, 2, 3, 8, 10, 11} (sorted, duplicates dropped);
// "" for none. The format of taskset -c and /sys/.../cpulist.
std::string FormatCpuList(std::vector<int> cpus);

// The inverse of FormatCpuList: INVALID_ARGUMENT naming the bad item for
// anything but comma-separated CPUs and ranges "A-B" with A <= B < 4096.
absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text);

}  // namespace chorus

#endif  // CHORUS_COMMON_CPU_BINDING_H_
