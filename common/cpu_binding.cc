#include "common/cpu_binding.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace chorus {

// Note [Binding ranks to CPUs]
// Two ranks of a DDP job on a 2-CPU machine, each training with one thread
// and each with a communication thread beside it: four threads wanting two
// CPUs at the moments the gradients are all-reduced. Left to the scheduler,
// a training thread is moved to the other CPU whenever a communication
// thread wakes, and arrives there without its caches: the 2 MB L2 that held
// its packed matrix panels belongs to the CPU it left. bench/ddp_bench measured
// the small MLP (784-1024x3-10, 2.9 M parameters) at 24.9-33.9 ms a step
// unbound against 23.8-24.9 ms with each rank bound to one CPU (compute
// alone: 21 ms), and perf put the difference in OpenBLAS's sgemm kernel
// itself, which took 43 % more CPU time per step unbound; the big MLP
// (14.2 M) ran the same either way (124 ms). Bound, a rank's communication
// thread takes turns with its own training thread instead of evicting the
// other rank's.
//
// So an agent gives each slot a contiguous share of the CPUs it may use
// (sched_getaffinity, so a cgroup cpuset, taskset or Slurm's binding is
// honoured) and starts each rank bound to its slot's share; threads and
// processes the rank starts inherit it. With more slots than CPUs no share
// is whole, and nothing is bound. MPI launchers bind the same way by default
// (one rank per core); torchrun does not bind.

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

std::vector<int> SlotCpus(const std::vector<int>& allowed, int slot, int slots) {
  const int n = static_cast<int>(allowed.size());
  if (slots < 1 || slot < 0 || slot >= slots || slots > n) return {};
  const int base = n / slots;
  const int extra = n % slots;
  const int begin = slot * base + std::min(slot, extra);
  const int size = base + (slot < extra ? 1 : 0);
  return std::vector<int>(allowed.begin() + begin, allowed.begin() + begin + size);
}

absl::Status BindThisThread(const std::vector<int>& cpus) {
  if (cpus.empty()) return absl::InvalidArgumentError("no CPU to bind to");
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) {
      return absl::InvalidArgumentError(absl::StrCat("CPU ", cpu, " is out of range"));
    }
    CPU_SET(cpu, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    const int error = errno;
    return absl::InvalidArgumentError(
        absl::StrCat("binding to CPUs ", FormatCpuList(cpus), ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

std::string FormatCpuList(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::vector<std::string> items;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    items.push_back(j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(items, ",");
}

absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text) {
  constexpr int kMaxCpu = 4095;
  std::vector<int> cpus;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    std::vector<absl::string_view> ends = absl::StrSplit(item, absl::MaxSplits('-', 1));
    int first = 0, last = 0;
    const bool ok = absl::SimpleAtoi(ends[0], &first) &&
                    absl::SimpleAtoi(ends.size() == 2 ? ends[1] : ends[0], &last) &&
                    !ends[0].empty() && ends[0][0] != '-' && ends[0][0] != '+' && first >= 0 &&
                    first <= last && last <= kMaxCpu;
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("CPU list \"", text, "\": bad item \"", item,
                       "\"; expected CPUs and ranges such as 0-3,8 (each at most ", kMaxCpu, ")"));
    }
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

}  // namespace chorus
