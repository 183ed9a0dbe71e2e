#include "worker/agent/posix_rank_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/cpu_binding.h"
#include "common/output_limits.h"
#include "glog/logging.h"

namespace chorus {
namespace {

// Note [Rank signal mask]
// A rank gets its own process group, default dispositions and only SIGUSR1
// blocked. The agent blocks SIGINT/SIGTERM for its signal thread, and a rank
// must not inherit that or SIGTERM could never stop it. SIGUSR1 (`chorus
// checkpoint`) would kill a rank that has not yet installed its handler
// (loading its libraries takes a while), so it stays pending until
// chorus-rank's main has installed it and unblocks it.

int ExitCodeOf(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -WTERMSIG(wait_status);
}

absl::Status StartError(int error, const std::string& program, const std::string& what) {
  const std::string message = absl::StrCat("could not start ", program, ": ", what);
  if (error == ENOENT || error == ENOTDIR) return absl::NotFoundError(message);
  if (error == EACCES || error == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

// poll()'s timeout for `deadline`: -1 for none, never more than ~12 days,
// rounded up so that a timeout is not reported before the deadline.
int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const double ms = std::ceil(absl::ToDoubleMilliseconds(deadline - absl::Now()));
  return static_cast<int>(std::clamp(ms, 0.0, double{1 << 30}));
}

// Moves the just-spawned `pid` (of `program`) into the cgroups of `procs_files`. The
// parent writes it right after posix_spawn: only the exec and the dynamic
// loader run before, and a rank starts no process and no code of its own
// that early.
absl::Status JoinCgroups(pid_t pid, const std::string& program,
                         const std::vector<std::string>& procs_files) {
  const std::string text = std::to_string(pid);
  for (const std::string& file : procs_files) {
    const int fd = open(file.c_str(), O_WRONLY | O_CLOEXEC);
    const bool written = fd >= 0 && write(fd, text.data(), text.size()) ==
                                        static_cast<ssize_t>(text.size());
    const int error = errno;
    if (fd >= 0) close(fd);
    if (!written) {
      return StartError(error, program,
                        absl::StrCat("joining its cgroup (", file, "): ", std::strerror(error)));
    }
  }
  return absl::OkStatus();
}

class PosixRankProcess final : public RankProcess {
 public:
  PosixRankProcess(pid_t pid, int output_fd) : pid_(pid), output_fd_(output_fd) {}
  PosixRankProcess(const PosixRankProcess&) = delete;
  PosixRankProcess& operator=(const PosixRankProcess&) = delete;

  ~PosixRankProcess() override {
    if (output_fd_ >= 0) close(output_fd_);
    absl::MutexLock lock(&mu_);
    if (exit_code_.has_value()) return;
    kill(-pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }

  pid_t pid() const override { return pid_; }

  // Reads in chunks and never holds more of one line than
  // kMaxOutputLineBytes plus one chunk: the rest of a longer line is
  // counted and discarded as it arrives (Note [Bounded job output]).
  absl::StatusOr<std::string> ReadLine(absl::Time deadline) override {
    while (true) {
      const size_t newline = pending_.find('\n');
      if (newline != std::string::npos) {
        std::string line = BoundOutputLine(absl::string_view(pending_).substr(0, newline),
                                           std::exchange(dropped_, 0));
        pending_.erase(0, newline + 1);
        return line;
      }
      if (pending_.size() > kMaxOutputLineBytes) {
        dropped_ += pending_.size() - kMaxOutputLineBytes;
        pending_.resize(kMaxOutputLineBytes);
      }
      if (output_fd_ < 0) {
        if (pending_.empty() && dropped_ == 0)
          return absl::OutOfRangeError(absl::StrCat("pid ", pid_, " closed its output"));
        std::string line = BoundOutputLine(pending_, std::exchange(dropped_, 0));
        pending_.clear();
        return line;
      }
      pollfd readable{output_fd_, POLLIN, 0};
      const int ready = poll(&readable, 1, PollTimeoutMs(deadline));
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        return absl::DeadlineExceededError(
            absl::StrCat("pid ", pid_, " wrote no complete line before the deadline"));
      }
      char buffer[4096];
      const ssize_t n = ready < 0 ? -1 : read(output_fd_, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        // End of output (or an error reading it: then the output ends here
        // too, and the caller hears why once).
        const int error = n < 0 ? errno : 0;
        close(output_fd_);
        output_fd_ = -1;
        if (error != 0) {
          return absl::InternalError(
              absl::StrCat("reading the output of pid ", pid_, ": ", std::strerror(error)));
        }
        continue;
      }
      pending_.append(buffer, static_cast<size_t>(n));
    }
  }

  absl::StatusOr<int> Wait(absl::Time deadline) override {
    absl::Duration pause = absl::Milliseconds(1);
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (exit_code_.has_value()) return *exit_code_;
        int status = 0;
        const pid_t reaped = waitpid(pid_, &status, WNOHANG);
        if (reaped == pid_) {
          exit_code_ = ExitCodeOf(status);
          // Nothing of the rank may outlive it: its process group goes too
          // (while a member lives, the group id cannot be reused).
          kill(-pid_, SIGKILL);
          return *exit_code_;
        }
        if (reaped < 0 && errno != EINTR) {
          return absl::InternalError(
              absl::StrCat("waiting for pid ", pid_, ": ", std::strerror(errno)));
        }
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " is still running"));
      }
      absl::SleepFor(std::min(pause, deadline - now));
      pause = std::min(pause * 2, absl::Milliseconds(50));
    }
  }

  // Signals go out under mu_, so never to a pid reaped (and maybe reused).
  void Signal(int signal) override {
    absl::MutexLock lock(&mu_);
    if (!exit_code_.has_value()) kill(pid_, signal);
  }

  void SignalGroup(int signal) override {
    absl::MutexLock lock(&mu_);
    if (!exit_code_.has_value()) kill(-pid_, signal);
  }

 private:
  const pid_t pid_;
  // Output: only the reading thread touches these.
  int output_fd_;
  // Output read but not returned yet: at most kMaxOutputLineBytes of an
  // unfinished line (plus the chunk just read), and dropped_, the bytes of
  // that line discarded so far.
  std::string pending_;
  size_t dropped_ = 0;

  absl::Mutex mu_;
  std::optional<int> exit_code_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<RankProcess>> PosixRankLauncher::Start(const RankCommand& command) {
  if (command.argv.empty()) {
    return absl::InvalidArgumentError("rank command: argv is empty; argv[0] must name the program");
  }
  const std::string& program = command.argv[0];
  std::vector<std::string> args = command.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env = command.env;
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    const int error = errno;
    return StartError(error, program,
                      absl::StrCat("a pipe for its output: ", std::strerror(error)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Note [Rank signal mask].
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t blocked, defaults;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGUSR1);
  posix_spawnattr_setsigmask(&attr, &blocked);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  // The child inherits the affinity of the thread that spawns it, so this
  // thread takes the rank's CPUs for the spawn and then its own back: no
  // window in which the rank runs, or starts a thread, unbound.
  const std::vector<int> own_cpus = command.cpus.empty() ? std::vector<int>() : AllowedCpus();
  if (!command.cpus.empty()) {
    if (absl::Status bound = BindThisThread(command.cpus); !bound.ok()) {
      LOG(WARNING) << "starting " << program << " unbound: " << bound.message();
    }
  }
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, program.c_str(), &actions, &attr, argv.data(), envp.data());
  if (!own_cpus.empty()) {
    if (absl::Status restored = BindThisThread(own_cpus); !restored.ok()) {
      LOG(ERROR) << "could not take back the launching thread's CPUs: " << restored.message();
    }
  }
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return StartError(rc, program, std::strerror(rc));
  }
  if (absl::Status joined = JoinCgroups(pid, program, command.cgroup_procs); !joined.ok()) {
    kill(pid, SIGKILL);
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    close(fds[0]);
    return joined;
  }
  return std::unique_ptr<RankProcess>(std::make_unique<PosixRankProcess>(pid, fds[0]));
}

}  // namespace chorus
