#include "worker/agent/rank_cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cpu_binding.h"
#include "common/status_macros.h"

namespace chorus {

// Note [Rank cgroups]
// Every rank runs in a cgroup of its own: `<parent>/chorus/<agent>/<job>/
// slot-<slot>-gen-<generation>`, where <parent> is the agent's own cgroup
// (so a containerized agent's ranks stay inside the container's limits)
// and <agent> is "agent-<pid>" (two agents on one host, as tests run them,
// may both run a job-000001). On cgroup v2 that is one directory, the
// controllers enabled level by level through cgroup.subtree_control; v2
// lets no cgroup but the root both hold processes and enable controllers
// for its children, so an agent whose own cgroup may not (EBUSY) first
// moves itself into `<parent>/chorus-agent`. On v1 it is one directory per
// hierarchy (memory, pids, cpuset), and a new cpuset starts with no CPUs
// and no memory nodes, so each level copies its parent's cpuset.cpus and
// cpuset.mems before anything joins it.
// The limits: memory.max (v1 memory.limit_in_bytes) from the job's
// resources.memory_bytes, with swap kept from growing past it (v2
// memory.swap.max 0, v1 memory.memsw.limit_in_bytes, where the kernel has
// them) and, on v2, memory.oom.group so that an OOM kill takes the whole
// rank rather than leaving it half alive; pids.max from
// resources.max_processes (threads count); cpuset.cpus, the slot's CPUs
// (Note [Binding ranks to CPUs] in common/cpu_binding.cc). The rank joins
// before it runs any code of its own (RankCommand::cgroup_procs), so
// everything it starts is inside. When it has been reaped the agent reads
// the OOM count (memory.events / memory.oom_control: oom_kill) to explain
// its death, kills what is left inside (a daemon that left the process
// group), and removes the directories, retrying while the dying leave.
// Where none of this can be done the agent runs ranks as before, without
// limits, and says so once at start.

namespace {

constexpr char kChorusDir[] = "chorus";
constexpr int kRemoveAttempts = 100;
constexpr absl::Duration kRemovePause = absl::Milliseconds(20);

std::string Errno(int error) { return std::strerror(error); }

absl::Status WriteFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_TRUNC);
  if (fd < 0) {
    const int error = errno;
    return absl::UnavailableError(absl::StrCat("opening ", path, ": ", Errno(error)));
  }
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int error = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    return absl::UnavailableError(
        absl::StrCat("writing \"", text, "\" to ", path, ": ", n < 0 ? Errno(error) : "short"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// mkdir that is fine with a directory already there.
absl::Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return absl::OkStatus();
  const int error = errno;
  return absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", Errno(error)));
}

// /proc/self/mounts escapes a space in a path as \040 (octal).
std::string UnescapeMountPath(absl::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    const bool octal = field[i] == '\\' && i + 3 < field.size() && field[i + 1] >= '0' &&
                       field[i + 1] <= '3' && field[i + 2] >= '0' && field[i + 2] <= '7' &&
                       field[i + 3] >= '0' && field[i + 3] <= '7';
    if (!octal) {
      out.push_back(field[i]);
      continue;
    }
    out.push_back(static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                                    (field[i + 3] - '0')));
    i += 3;
  }
  return out;
}

// The value after `key ` on a line of a flat-keyed file (memory.events,
// memory.oom_control); -1 if absent.
int64_t KeyedValue(absl::string_view text, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t value = 0;
    if (words.size() == 2 && words[0] == key && absl::SimpleAtoi(words[1], &value)) return value;
  }
  return -1;
}

// `<mount><path>`, path being "/" for the hierarchy's root.
std::string JoinCgroupPath(const std::string& mount, absl::string_view path) {
  if (path.empty() || path == "/") return mount;
  return absl::StrCat(mount, path);
}

// The process's path in each hierarchy of /proc/self/cgroup: "" for v2's
// ("0::/path"), each controller's name for v1 ("4:memory:/path").
std::map<std::string, std::string> OwnCgroupPaths(absl::string_view self_cgroup) {
  std::map<std::string, std::string> paths;
  for (absl::string_view line : absl::StrSplit(self_cgroup, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (parts[1].empty()) {
      paths[""] = std::string(parts[2]);
      continue;
    }
    for (absl::string_view c : absl::StrSplit(parts[1], ',')) paths[std::string(c)] = std::string(parts[2]);
  }
  return paths;
}

// Writes the pid of this process to `procs` (v2: the whole process moves).
absl::Status JoinSelf(const std::string& procs) {
  return WriteFile(procs, std::to_string(::getpid()));
}

// Kills every process listed in `dir`/cgroup.procs (v2: cgroup.kill where
// the kernel has it); whether any was listed.
bool KillMembers(const std::string& dir) {
  if (Exists(dir + "/cgroup.kill") && WriteFile(dir + "/cgroup.kill", "1").ok()) {
    absl::StatusOr<std::string> procs = ReadFile(dir + "/cgroup.procs");
    return procs.ok() && !absl::StripAsciiWhitespace(*procs).empty();
  }
  absl::StatusOr<std::string> procs = ReadFile(dir + "/cgroup.procs");
  if (!procs.ok()) return false;
  bool any = false;
  for (absl::string_view word : absl::StrSplit(*procs, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    int pid = 0;
    if (absl::SimpleAtoi(word, &pid) && pid > 0) {
      ::kill(pid, SIGKILL);
      any = true;
    }
  }
  return any;
}

// Kills what is in `dir` and removes it, retrying a bounded while.
absl::Status RemoveCgroupDir(const std::string& dir) {
  int error = 0;
  for (int attempt = 0; attempt < kRemoveAttempts; ++attempt) {
    if (!Exists(dir)) return absl::OkStatus();
    KillMembers(dir);
    if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
    error = errno;
    if (error != EBUSY && error != ENOTEMPTY) break;
    absl::SleepFor(kRemovePause);
  }
  return absl::UnavailableError(absl::StrCat("cannot remove ", dir, ": ", Errno(error)));
}

// v2: the controllers `dir` offers its children, of those chorus uses.
absl::Status EnableControllers(const std::string& dir) {
  absl::StatusOr<std::string> offered = ReadFile(dir + "/cgroup.controllers");
  if (!offered.ok()) return offered.status();
  std::vector<std::string> enable;
  for (absl::string_view c : absl::StrSplit(*offered, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    if (c == "memory" || c == "pids" || c == "cpuset") enable.push_back(absl::StrCat("+", c));
  }
  if (enable.empty()) return absl::OkStatus();
  return WriteFile(dir + "/cgroup.subtree_control", absl::StrJoin(enable, " "));
}

// v1 cpuset: a new cpuset copies its parent's CPUs and memory nodes.
absl::Status InheritCpuset(const std::string& dir) {
  const std::string parent = dir.substr(0, dir.rfind('/'));
  for (const char* file : {"cpuset.cpus", "cpuset.mems"}) {
    absl::StatusOr<std::string> value = ReadFile(absl::StrCat(parent, "/", file));
    if (!value.ok()) return value.status();
    const std::string current = ReadFile(absl::StrCat(dir, "/", file)).value_or("");
    if (!absl::StripAsciiWhitespace(current).empty()) continue;
    if (absl::Status s = WriteFile(absl::StrCat(dir, "/", file),
                                   std::string(absl::StripAsciiWhitespace(*value)));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Writes `text` to `dir`/`file` where the kernel has that file (swap
// limits exist only with swap accounting).
absl::Status WriteIfPresent(const std::string& dir, const char* file, const std::string& text) {
  const std::string path = absl::StrCat(dir, "/", file);
  return Exists(path) ? WriteFile(path, text) : absl::OkStatus();
}

// The limits of `controller` ("" on v2: all of them) on the rank's `dir`.
absl::Status SetLimits(int version, const std::string& controller, const std::string& dir,
                       const CgroupLimits& limits) {
  const bool v2 = version == 2;
  if ((v2 || controller == "memory") && limits.memory_bytes > 0) {
    const std::string bytes = std::to_string(limits.memory_bytes);
    RETURN_IF_ERROR(WriteFile(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"), bytes));
    // Best effort: without swap accounting the kernel has no such file,
    // and with swap off there is nothing to bound.
    WriteIfPresent(dir, v2 ? "memory.swap.max" : "memory.memsw.limit_in_bytes", v2 ? "0" : bytes)
        .IgnoreError();
    if (v2) WriteIfPresent(dir, "memory.oom.group", "1").IgnoreError();
  }
  if ((v2 || controller == "pids") && limits.max_processes > 0) {
    RETURN_IF_ERROR(WriteIfPresent(dir, "pids.max", std::to_string(limits.max_processes)));
  }
  if (!v2 && controller == "cpuset") RETURN_IF_ERROR(InheritCpuset(dir));
  if ((v2 || controller == "cpuset") && !limits.cpus.empty()) {
    RETURN_IF_ERROR(WriteIfPresent(dir, "cpuset.cpus", FormatCpuList(limits.cpus)));
  }
  return absl::OkStatus();
}

// Makes `dir` (one level below an existing one) ready for children.
absl::Status PrepareLevel(int version, const std::string& controller, const std::string& dir) {
  if (absl::Status made = MakeDir(dir); !made.ok()) return made;
  if (version == 2) return EnableControllers(dir);
  if (controller == "cpuset") return InheritCpuset(dir);
  return absl::OkStatus();
}

// v2: lets `parent` enable controllers for its children, moving this
// process out of it when it holds processes (Note [Rank cgroups]).
absl::Status EnableAtParent(const std::string& parent) {
  absl::Status enabled = EnableControllers(parent);
  if (enabled.ok()) return enabled;
  const std::string own = parent + "/chorus-agent";
  if (absl::Status made = MakeDir(own); !made.ok()) return made;
  if (absl::Status moved = JoinSelf(own + "/cgroup.procs"); !moved.ok()) return moved;
  return EnableControllers(parent);
}

}  // namespace

CgroupLayout DetectCgroupLayout(absl::string_view mounts, absl::string_view self_cgroup) {
  const std::map<std::string, std::string> own = OwnCgroupPaths(self_cgroup);
  CgroupLayout v1;
  v1.version = 1;
  for (absl::string_view line : absl::StrSplit(mounts, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.size() < 4) continue;
    const std::string point = UnescapeMountPath(fields[1]);
    if (fields[2] == "cgroup2") {
      absl::StatusOr<std::string> offered = ReadFile(point + "/cgroup.controllers");
      if (!offered.ok()) continue;
      std::vector<absl::string_view> names =
          absl::StrSplit(*offered, absl::ByAnyChar(" \n"), absl::SkipEmpty());
      if (std::find(names.begin(), names.end(), "memory") == names.end()) continue;
      CgroupLayout v2;
      v2.version = 2;
      auto path = own.find("");
      v2.parents[""] = JoinCgroupPath(point, path == own.end() ? "/" : path->second);
      return v2;
    }
    if (fields[2] != "cgroup") continue;
    for (absl::string_view option : absl::StrSplit(fields[3], ',')) {
      if (option != "memory" && option != "pids" && option != "cpuset") continue;
      const std::string controller(option);
      auto path = own.find(controller);
      v1.parents[controller] = JoinCgroupPath(point, path == own.end() ? "/" : path->second);
    }
  }
  if (v1.parents.count("memory") == 0) {
    CgroupLayout none;
    none.problem =
        "no cgroup v2 hierarchy with the memory controller and no cgroup v1 memory hierarchy is "
        "mounted";
    return none;
  }
  return v1;
}

RankCgroup::RankCgroup(int version, std::vector<std::string> dirs, std::string memory_dir,
                       CgroupLimits limits)
    : version_(version),
      dirs_(std::move(dirs)),
      memory_dir_(std::move(memory_dir)),
      limits_(std::move(limits)) {
  for (const std::string& dir : dirs_) procs_.push_back(dir + "/cgroup.procs");
}

RankCgroup::~RankCgroup() { Remove().IgnoreError(); }

int64_t RankCgroup::OomKills() const {
  const std::string file = memory_dir_ + (version_ == 2 ? "/memory.events" : "/memory.oom_control");
  absl::StatusOr<std::string> text = ReadFile(file);
  return text.ok() ? KeyedValue(*text, "oom_kill") : -1;
}

absl::Status RankCgroup::Remove() {
  if (removed_) return absl::OkStatus();
  removed_ = true;
  absl::Status status;
  for (const std::string& dir : dirs_) {
    if (absl::Status removed = RemoveCgroupDir(dir); !removed.ok()) {
      status.Update(removed);
      continue;
    }
    // The job's directory goes with its last rank here; another rank of
    // the job on this agent keeps it (EBUSY / ENOTEMPTY).
    const std::string job_dir = dir.substr(0, dir.rfind('/'));
    ::rmdir(job_dir.c_str());
  }
  return status;
}

RankCgroups RankCgroups::ForThisHost(const std::string& agent_name) {
  absl::StatusOr<std::string> mounts = ReadFile("/proc/self/mounts");
  absl::StatusOr<std::string> self = ReadFile("/proc/self/cgroup");
  if (!mounts.ok() || !self.ok()) {
    return Disabled(!mounts.ok() ? std::string(mounts.status().message())
                                 : std::string(self.status().message()));
  }
  return RankCgroups(DetectCgroupLayout(*mounts, *self), agent_name);
}

RankCgroups RankCgroups::Disabled(const std::string& why) {
  RankCgroups disabled;
  disabled.why_disabled_ = why;
  return disabled;
}

RankCgroups::RankCgroups(CgroupLayout layout, const std::string& agent_name)
    : layout_(std::move(layout)) {
  if (layout_.version == 0) {
    why_disabled_ = layout_.problem;
    return;
  }
  std::map<std::string, std::string> made;
  for (const auto& [controller, parent] : layout_.parents) {
    absl::Status ready = layout_.version == 2 ? EnableAtParent(parent) : absl::OkStatus();
    const std::string chorus = absl::StrCat(parent, "/", kChorusDir);
    const std::string agent = absl::StrCat(chorus, "/", agent_name);
    // Another agent that stops removes chorus/ when it is empty, maybe
    // between the two mkdirs here: then they are made again.
    for (int attempt = 0; ready.ok(); ++attempt) {
      ready = PrepareLevel(layout_.version, controller, chorus);
      if (ready.ok()) ready = PrepareLevel(layout_.version, controller, agent);
      if (ready.ok() || Exists(chorus) || attempt == 2) break;
      ready = absl::OkStatus();
    }
    if (!ready.ok()) {
      for (const auto& [c, dir] : made) ::rmdir(dir.c_str());
      why_disabled_ = std::string(ready.message());
      return;
    }
    made[controller] = agent;
  }
  agent_dir_of_ = std::move(made);
  for (const auto& [controller, dir] : agent_dir_of_) agent_dirs_.push_back(dir);
}

RankCgroups::~RankCgroups() {
  for (const std::string& dir : agent_dirs_) {
    // chorus/ too, unless another agent's directory is in it.
    if (::rmdir(dir.c_str()) == 0) ::rmdir(dir.substr(0, dir.rfind('/')).c_str());
  }
}

absl::StatusOr<std::unique_ptr<RankCgroup>> RankCgroups::Create(const std::string& job_id,
                                                                const std::string& name,
                                                                const CgroupLimits& limits) const {
  if (!enabled()) return absl::FailedPreconditionError(why_disabled_);
  // Both become directory names.
  for (const std::string* part : {&job_id, &name}) {
    if (part->empty() || *part == "." || *part == ".." ||
        part->find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", *part, "\" cannot name a cgroup directory"));
    }
  }
  std::vector<std::string> dirs;
  std::string memory_dir;
  // Whatever is made before an error is removed with the RankCgroup.
  auto made = [&] { return std::make_unique<RankCgroup>(layout_.version, dirs, memory_dir, limits); };
  for (const auto& [controller, agent_dir] : agent_dir_of_) {
    const std::string job = absl::StrCat(agent_dir, "/", job_id);
    const std::string rank = absl::StrCat(job, "/", name);
    absl::Status ready;
    // The job's last other rank may remove the job's directory between the
    // two mkdirs (RankCgroup::Remove): then it is made again.
    for (int attempt = 0; attempt < 3; ++attempt) {
      ready = PrepareLevel(layout_.version, controller, job);
      if (ready.ok()) ready = MakeDir(rank);
      if (ready.ok() || Exists(job)) break;
    }
    if (!ready.ok()) {
      made().reset();
      return ready;
    }
    dirs.push_back(rank);
    if (controller == "memory" || controller.empty()) memory_dir = rank;
    if (absl::Status set = SetLimits(layout_.version, controller, rank, limits); !set.ok()) {
      made().reset();
      return set;
    }
  }
  return made();
}

}  // namespace chorus
