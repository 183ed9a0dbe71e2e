// PosixRankLauncher: the real RankLauncher. It starts a rank with fork and
// execve (Note [Starting a rank] in posix_rank_launcher.cc) in a process
// group of its own, stdout and stderr sharing one pipe the agent reads, with
// default signal dispositions and only SIGUSR1 blocked (Note [Rank signal
// mask]), bound to the command's CPUs when it names some, in the cgroups it
// names, as its account when it names one, and holding no descriptor of the
// launcher's but those it names.
//
// Thread-safety: Start is thread-safe; the processes follow RankProcess's
// contract (rank_launcher.h).
//
// Example:
//   PosixRankLauncher launcher;
//   absl::StatusOr<std::unique_ptr<RankProcess>> rank =
//       launcher.Start({{"/bin/echo", "hello"}, {}});
//   absl::StatusOr<std::string> line = (*rank)->ReadLine(absl::Now() + absl::Seconds(5));
//   // *line == "hello"
#ifndef CHORUS_WORKER_AGENT_POSIX_RANK_LAUNCHER_H_
#define CHORUS_WORKER_AGENT_POSIX_RANK_LAUNCHER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/agent/rank_launcher.h"

namespace chorus {

class PosixRankLauncher final : public RankLauncher {
 public:
  // NOT_FOUND / PERMISSION_DENIED / INTERNAL, "could not start PROGRAM: why",
  // when the program cannot be executed or the child could not join a cgroup
  // or take the account (PERMISSION_DENIED "setuid to uid U gid G: ..." for
  // a launcher that is not root); INVALID_ARGUMENT on an empty argv.
  absl::StatusOr<std::unique_ptr<RankProcess>> Start(const RankCommand& command) override;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_AGENT_POSIX_RANK_LAUNCHER_H_
