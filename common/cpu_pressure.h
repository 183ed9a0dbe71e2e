// How starved of CPU this node is: the share of the recent past in which its
// runnable tasks waited for a CPU, in [0, 1]. Node agents send it with every
// message, and hang detection reads ranks that are slow on a starved node as
// NODE_SLOW rather than hung (Note [A starved node] in
// coordinator/hang/hang_detector.h).
//
// The kernel's pressure stall information (/proc/pressure/cpu, Linux 4.20 and
// later with PSI on) gives it directly: "some avg10" is the share of the last
// 10 s in which at least one runnable task waited. Without PSI it is estimated
// from the 1-minute load average: with `load` runnable tasks on `cpus` CPUs,
// 1 - cpus / load of the demand cannot be served.
//
// Thread-safety: every function is safe to call from any thread.
//
// Example:
//   message.set_cpu_pressure(NodeCpuPressure());  // 0.77 beside two busy loops on 2 cores
//   ParsePsiCpuSome("some avg10=76.66 avg60=72.73 avg300=35.29 total=142060932\n...");  // 0.7666
//   PressureFromLoad(6.0, 2);  // 0.667
#ifndef CHORUS_COMMON_CPU_PRESSURE_H_
#define CHORUS_COMMON_CPU_PRESSURE_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace chorus {

// The "some avg10" of /proc/pressure/cpu's text as a share in [0, 1];
// nullopt if the text has no such field.
std::optional<double> ParsePsiCpuSome(absl::string_view text);

// The share of the demand of `load` runnable tasks that `cpus` CPUs cannot
// serve: 0 while load <= cpus. 0 for cpus < 1.
double PressureFromLoad(double load, int cpus);

// This node's CPU pressure now: PSI when the kernel has it, else from the
// load average and the CPUs this process may run on; 0 when neither can be
// read. `proc` is where procfs is mounted (tests point it elsewhere).
double NodeCpuPressure(const std::string& proc = "/proc");

}  // namespace chorus

#endif  // CHORUS_COMMON_CPU_PRESSURE_H_
