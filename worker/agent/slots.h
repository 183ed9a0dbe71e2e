// How many rank slots a node agent offers: the `--slots` flag of
// chorus-worker, either a number or `auto`. `auto` lets one systemd unit,
// Slurm script or Kubernetes DaemonSet serve nodes of every size:
//   cpu:  the CPUs this process may run on (sched_getaffinity, so a cgroup
//         cpuset, `taskset` or Slurm's --cpus-per-task binding is honoured)
//         divided by --threads_per_slot, at least 1. The job's
//         resources.threads_per_rank is not known when the agent starts, so
//         the operator says how many threads a slot stands for.
//   cuda: the number of GPUs CUDA sees; an error in a build without CUDA.
//
// Thread-safety: every function is safe to call from any thread.
//
// Example:
//   absl::StatusOr<int> slots = ResolveSlots("auto", v1::ResourceSpec::CPU,
//                                            /*threads_per_slot=*/2, SlotFacts::OfThisMachine());
//   if (!slots.ok()) { std::cerr << slots.status().message(); return 2; }
#ifndef CHORUS_WORKER_AGENT_SLOTS_H_
#define CHORUS_WORKER_AGENT_SLOTS_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "chorus/v1/job.pb.h"

namespace chorus {

// The largest --slots a node may offer.
inline constexpr int kMaxSlots = 1024;

// What `auto` is computed from; injectable so tests need neither a given core
// count nor a GPU.
struct SlotFacts {
  // CPUs this process may be scheduled on.
  int online_cpus = 1;
  // GPUs CUDA sees, or why there are none usable (no CUDA build, no driver).
  std::function<absl::StatusOr<int>()> gpu_count;

  // The running process's CPU affinity and the CUDA runtime (common/device.h).
  static SlotFacts OfThisMachine();
};

// CPUs in this process's affinity mask (sched_getaffinity); the configured
// CPU count if the mask cannot be read; at least 1.
int OnlineCpus();

// The slots `flag` stands for on `device`. `flag` is a decimal integer in
// [1, kMaxSlots] or "auto". INVALID_ARGUMENT naming --slots or
// --threads_per_slot for a bad value; FAILED_PRECONDITION when `auto` on cuda
// finds no GPU (the message says why: no CUDA build, no driver, zero GPUs).
absl::StatusOr<int> ResolveSlots(const std::string& flag, v1::ResourceSpec::Device device,
                                 int threads_per_slot, const SlotFacts& facts);

}  // namespace chorus

#endif  // CHORUS_WORKER_AGENT_SLOTS_H_
