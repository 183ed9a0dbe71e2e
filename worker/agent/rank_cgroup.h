// Rank cgroups: each rank the node agent starts lives in a cgroup of its
// own, with the job's memory and process limits and its slot's CPUs, so
// that one job's runaway allocation or fork storm is stopped inside that
// job instead of taking the node (Note [Rank cgroups] in rank_cgroup.cc).
//
// RankCgroups finds the host's layout once (cgroup v2, or the v1 memory,
// pids and cpuset hierarchies), makes the agent's own directory under it,
// and makes one RankCgroup per rank; a RankCgroup tells whether the kernel's
// OOM killer fired in it and removes itself. Where cgroups cannot be made
// (not root, a read-only mount, no memory controller) RankCgroups is
// disabled and says why once: ranks then run without limits.
//
// Thread-safety: RankCgroups::Create from any thread; a RankCgroup from one
// thread at a time.
//
// Example:
//   RankCgroups cgroups = RankCgroups::ForThisHost(absl::StrCat("agent-", getpid()));
//   if (!cgroups.enabled()) LOG(WARNING) << cgroups.why_disabled();
//   absl::StatusOr<std::unique_ptr<RankCgroup>> group =
//       cgroups.Create("job-000001", "slot-0-gen-1", {256 << 20, 4096, {0, 1}});
//   command.cgroup_procs = (*group)->procs_files();
//   ... the rank runs and exits ...
//   if ((*group)->OomKills() > 0) ...;
//   (*group)->Remove();
#ifndef CHORUS_WORKER_AGENT_RANK_CGROUP_H_
#define CHORUS_WORKER_AGENT_RANK_CGROUP_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace chorus {

// Where a host's cgroups are and which of them this process is in.
struct CgroupLayout {
  // 2: one unified hierarchy; 1: per-controller hierarchies; 0: none usable.
  int version = 0;
  // The directories (this process's own cgroups) under which chorus/ goes:
  // on v2 one, keyed ""; on v1 one per controller found among "memory",
  // "pids" and "cpuset" ("memory" always).
  std::map<std::string, std::string> parents;
  // Why version is 0.
  std::string problem;
};

// The layout from the text of /proc/self/mounts and /proc/self/cgroup. A
// cgroup2 mount counts when its cgroup.controllers (read from the mount
// point) offers "memory"; otherwise the v1 hierarchies that mount memory,
// pids and cpuset do (a hybrid host's controller-less cgroup2 mount beside
// them is ignored).
CgroupLayout DetectCgroupLayout(absl::string_view mounts, absl::string_view self_cgroup);

// What a rank's cgroup enforces; 0 / empty: no limit of that kind.
struct CgroupLimits {
  int64_t memory_bytes = 0;
  int64_t max_processes = 0;
  std::vector<int> cpus;
};

// One rank's cgroup (a directory per hierarchy). Removed by Remove() or
// on destruction.
class RankCgroup {
 public:
  RankCgroup(int version, std::vector<std::string> dirs, std::string memory_dir,
             CgroupLimits limits);
  RankCgroup(const RankCgroup&) = delete;
  RankCgroup& operator=(const RankCgroup&) = delete;
  ~RankCgroup();

  // The cgroup.procs files a process writes its pid to, to join it.
  const std::vector<std::string>& procs_files() const { return procs_; }
  const CgroupLimits& limits() const { return limits_; }
  // How many processes the OOM killer killed in it (v2 memory.events, v1
  // memory.oom_control: oom_kill); -1 when that cannot be read.
  int64_t OomKills() const;
  // Kills whatever still runs in it, removes its directories, and its job's
  // directory when that is left empty; retries a bounded while (a killed
  // process leaves its cgroup a moment after). Idempotent.
  absl::Status Remove();

 private:
  const int version_;
  std::vector<std::string> dirs_;
  const std::string memory_dir_;
  const CgroupLimits limits_;
  std::vector<std::string> procs_;
  bool removed_ = false;
};

class RankCgroups {
 public:
  // Detects this host's layout and makes `<parent>/chorus/<agent_name>`
  // under each of its hierarchies; disabled (why_disabled) if it cannot.
  static RankCgroups ForThisHost(const std::string& agent_name);
  // The same under `layout` (tests build one over a temporary directory).
  RankCgroups(CgroupLayout layout, const std::string& agent_name);
  // A disabled one: ranks run without cgroups.
  static RankCgroups Disabled(const std::string& why);
  RankCgroups(RankCgroups&&) = default;
  RankCgroups& operator=(RankCgroups&&) = default;
  // Removes the agent's directories (best effort: once its ranks' are gone).
  ~RankCgroups();

  bool enabled() const { return !agent_dirs_.empty(); }
  std::string why_disabled() const { return why_disabled_; }
  int version() const { return layout_.version; }
  // The agent's directories, one per hierarchy.
  const std::vector<std::string>& agent_dirs() const { return agent_dirs_; }

  // A cgroup `<agent dir>/<job_id>/<name>` with `limits`, per hierarchy.
  // FAILED_PRECONDITION when disabled; the error names the file otherwise.
  absl::StatusOr<std::unique_ptr<RankCgroup>> Create(const std::string& job_id,
                                                     const std::string& name,
                                                     const CgroupLimits& limits) const;

 private:
  RankCgroups() = default;

  CgroupLayout layout_;
  // Controller ("" on v2) -> `<parent>/chorus/<agent_name>`.
  std::map<std::string, std::string> agent_dir_of_;
  std::vector<std::string> agent_dirs_;
  std::string why_disabled_;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_AGENT_RANK_CGROUP_H_
