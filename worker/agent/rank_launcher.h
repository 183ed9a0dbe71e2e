// RankLauncher: how the node agent starts a rank process, and RankProcess:
// what it can do with one once started (read its output line by line, wait
// for its exit, signal it or its process group). The agent talks to processes
// only through these two interfaces, so tests can give it scripted processes
// (worker/agent/agent_test.cc); PosixRankLauncher (posix_rank_launcher.h) is
// the real one.
//
// Thread-safety: RankLauncher::Start may be called from any thread. On a
// RankProcess, ReadLine and Wait are called by one thread (the agent's
// monitor of that rank); pid, Signal and SignalGroup from any thread,
// concurrently with them.
//
// Example:
//   std::unique_ptr<RankLauncher> launcher = std::make_unique<PosixRankLauncher>();
//   absl::StatusOr<std::unique_ptr<RankProcess>> rank =
//       launcher->Start({{"/usr/bin/chorus-rank"}, {"CHORUS_JOB_ID=job-1"}});
//   if (!rank.ok()) return rank.status();
//   for (auto line = (*rank)->ReadLine(absl::Now() + absl::Seconds(1)); line.ok();
//        line = (*rank)->ReadLine(absl::Now() + absl::Seconds(1)))
//     std::cerr << *line << "\n";
//   absl::StatusOr<int> code = (*rank)->Wait(absl::Now() + absl::Seconds(10));
#ifndef CHORUS_WORKER_AGENT_RANK_LAUNCHER_H_
#define CHORUS_WORKER_AGENT_RANK_LAUNCHER_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace chorus {

// What to run for one rank.
struct RankCommand {
  // argv[0] is the path of the program (not searched in PATH).
  std::vector<std::string> argv;
  // The complete environment, "KEY=value" each.
  std::vector<std::string> env;
  // The CPUs the process (and every thread and process it starts) may run
  // on; empty: the launcher's own (Note [Binding ranks to CPUs] in
  // common/cpu_binding.cc).
  std::vector<int> cpus;
  // The Unix account the process runs as (Note [Rank accounts] in
  // worker/agent/rank_accounts.h): its uid and gid, no supplementary
  // groups. Unset: the launcher's own credentials.
  struct Account {
    uid_t uid = 0;
    gid_t gid = 0;
  };
  std::optional<Account> account;
  // Files (cgroup.procs of the rank's cgroups) the child writes its own pid
  // into before exec, so it runs no code of its own outside them; a failed
  // write fails the start (Note [Rank cgroups] in worker/agent/rank_cgroup.cc).
  std::vector<std::string> cgroup_procs;
  // Descriptors of the launcher the process keeps, at the same numbers
  // (they must not be close-on-exec); every other one above stderr is
  // closed before the program runs.
  std::vector<int> inherit_fds;
};

// One started rank process. Destroying it before Wait() has seen the exit
// kills its process group and reaps it: no process outlives its RankProcess.
class RankProcess {
 public:
  virtual ~RankProcess() = default;

  // The process id (for logs and reports); it leads its own process group.
  virtual pid_t pid() const = 0;

  // The next line the process wrote to stdout or stderr (one merged stream),
  // without its newline; an unterminated last line comes back at end of
  // output. DEADLINE_EXCEEDED if no line is complete by `deadline`;
  // OUT_OF_RANGE once the output has ended (every writer closed it).
  virtual absl::StatusOr<std::string> ReadLine(absl::Time deadline) = 0;

  // Waits for the process to exit: its exit code, or -N if signal N ended
  // it. DEADLINE_EXCEEDED if it still runs at `deadline`. Once it has
  // returned an exit, later calls return the same, and whatever else was
  // left in the process group has been killed (nothing of a rank outlives
  // it).
  virtual absl::StatusOr<int> Wait(absl::Time deadline) = 0;

  // Sends `signal` to the process alone (SIGUSR1: checkpoint now). Does
  // nothing once Wait() has seen the exit.
  virtual void Signal(int signal) = 0;

  // Sends `signal` to the process's whole group (SIGTERM, SIGKILL: stop).
  // Does nothing once Wait() has seen the exit.
  virtual void SignalGroup(int signal) = 0;
};

class RankLauncher {
 public:
  virtual ~RankLauncher() = default;

  // Starts `command` in a process group of its own, its stdout and stderr
  // captured for ReadLine. An error (naming the program) if it cannot start.
  virtual absl::StatusOr<std::unique_ptr<RankProcess>> Start(const RankCommand& command) = 0;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_AGENT_RANK_LAUNCHER_H_
