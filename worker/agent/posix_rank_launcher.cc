#include "worker/agent/posix_rank_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
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

// Note [Starting a rank]
// posix_spawn cannot change credentials, so a rank starts with fork and
// execve. Between the two the child, a copy of a multithreaded agent, may
// only make async-signal-safe calls (another thread may have held the
// allocator's lock at the fork): everything it needs (argv, environment,
// the cgroup.procs paths, the descriptors to keep) is
// prepared by the parent, and the child makes system calls only, in this
// order: its own process group; Note [Rank signal mask]; stdout and stderr
// onto the output pipe; its pid into each cgroup.procs (while it is still
// privileged to); no supplementary groups, then the gid, then the uid
// (setresgid/setresuid, so that no saved id can bring root back); every
// descriptor above stderr closed but those it is to inherit (none of the
// agent's sockets, files or pipes reach user code); execve. A step that
// fails writes which step and errno to a close-on-exec pipe and exits 127;
// the parent reads that pipe until it closes (execve succeeded: nothing was
// written) and otherwise reaps the child and returns the error. The CPU
// binding is inherited from the forking thread, as it was with posix_spawn.

// What the child failed to do: the step (a string literal) and errno.
struct ChildFailure {
  const char* step;
  int error;
};

// Everything the child needs, prepared before the fork.
struct ChildPlan {
  const char* program;
  char* const* argv;
  char* const* envp;
  int output_fd;
  int failure_fd;
  sigset_t blocked;
  std::vector<int> keep;  // sorted descriptors above stderr to keep open
  int max_fd;             // where closing one by one stops, without close_range
  std::vector<const char*> cgroup_procs;
  std::optional<RankCommand::Account> account;
};

[[noreturn]] void ChildFails(const ChildPlan& plan, const char* step) {
  const ChildFailure failure{step, errno};
  ssize_t unused = write(plan.failure_fd, &failure, sizeof(failure));
  (void)unused;
  _exit(127);
}

// Writes this process's pid into `path` with system calls only.
bool WriteOwnPid(const char* path) {
  char text[24];
  int at = sizeof(text);
  pid_t pid = static_cast<pid_t>(syscall(SYS_getpid));
  do {
    text[--at] = static_cast<char>('0' + pid % 10);
    pid /= 10;
  } while (pid > 0);
  const int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t written = write(fd, text + at, sizeof(text) - at);
  const int error = errno;
  close(fd);
  errno = error;
  return written == static_cast<ssize_t>(sizeof(text) - at);
}

// Closes descriptors `first` to `last`; one by one up to `max_fd` on a
// kernel without close_range (before Linux 5.9).
bool CloseRange(unsigned int first, unsigned int last, int max_fd) {
  if (syscall(SYS_close_range, first, last, 0) == 0) return true;
  if (errno != ENOSYS) return false;
  for (unsigned int fd = first; fd <= last && fd < static_cast<unsigned int>(max_fd); ++fd) {
    close(static_cast<int>(fd));
  }
  return true;
}

// Closes every descriptor above stderr but those in plan.keep (sorted).
bool CloseInherited(const ChildPlan& plan) {
  unsigned int first = STDERR_FILENO + 1;
  for (int kept : plan.keep) {
    if (static_cast<unsigned int>(kept) > first &&
        !CloseRange(first, static_cast<unsigned int>(kept) - 1, plan.max_fd)) {
      return false;
    }
    first = static_cast<unsigned int>(kept) + 1;
  }
  return CloseRange(first, ~0U, plan.max_fd);
}

// The child's side of Note [Starting a rank]; never returns.
[[noreturn]] void RunChild(const ChildPlan& plan) {
  if (setpgid(0, 0) != 0) ChildFails(plan, "setpgid");
  if (sigprocmask(SIG_SETMASK, &plan.blocked, nullptr) != 0) ChildFails(plan, "sigprocmask");
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int signal : {SIGTERM, SIGINT, SIGPIPE}) {
    if (sigaction(signal, &default_action, nullptr) != 0) ChildFails(plan, "sigaction");
  }
  if (dup2(plan.output_fd, STDOUT_FILENO) < 0 || dup2(plan.output_fd, STDERR_FILENO) < 0) {
    ChildFails(plan, "dup2 of the output pipe");
  }
  for (const char* procs : plan.cgroup_procs) {
    if (!WriteOwnPid(procs)) ChildFails(plan, procs);
  }
  if (plan.account.has_value()) {
    const RankCommand::Account& a = *plan.account;
    if (syscall(SYS_setgroups, 0, nullptr) != 0) ChildFails(plan, "setgroups(0)");
    if (syscall(SYS_setresgid, a.gid, a.gid, a.gid) != 0) ChildFails(plan, "setgid");
    if (syscall(SYS_setresuid, a.uid, a.uid, a.uid) != 0) ChildFails(plan, "setuid");
  }
  if (!CloseInherited(plan)) ChildFails(plan, "close_range");
  execve(plan.program, plan.argv, plan.envp);
  ChildFails(plan, "execve");
}

// What the failure pipe says: nullopt once it closed with nothing in it
// (the program runs), else the child's failure.
std::optional<ChildFailure> ReadChildFailure(int fd) {
  ChildFailure failure{};
  ssize_t n;
  do {
    n = read(fd, &failure, sizeof(failure));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(failure))) return failure;
  if (n == 0) return std::nullopt;
  return ChildFailure{"reading its start report", n < 0 ? errno : EIO};
}

// The error Start returns for `failure`, naming the step unless it was
// execve itself.
absl::Status ChildStartError(const ChildFailure& failure, const std::string& program,
                             const RankCommand& command) {
  const absl::string_view step = failure.step;
  std::string what = std::strerror(failure.error);
  if (step == "setuid" || step == "setgid" || step == "setgroups(0)") {
    what = absl::StrCat(
        step, " to uid ", command.account->uid, " gid ", command.account->gid, ": ", what,
        failure.error == EPERM ? " (only an agent running as root may run ranks as another account)"
                               : "");
  } else if (std::count(command.cgroup_procs.begin(), command.cgroup_procs.end(), step) > 0) {
    what = absl::StrCat("cannot join the cgroup ", step, ": ", what);
  } else if (step != "execve") {
    what = absl::StrCat(step, ": ", what);
  }
  return StartError(failure.error, program, what);
}

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

  int output[2];
  int failure[2];
  if (pipe2(output, O_CLOEXEC) != 0) {
    const int error = errno;
    return StartError(error, program,
                      absl::StrCat("a pipe for its output: ", std::strerror(error)));
  }
  if (pipe2(failure, O_CLOEXEC) != 0) {
    const int error = errno;
    close(output[0]);
    close(output[1]);
    return StartError(error, program,
                      absl::StrCat("a pipe for its start report: ", std::strerror(error)));
  }
  // Note [Starting a rank].
  ChildPlan plan{program.c_str(), argv.data(), envp.data(), output[1], failure[1]};
  sigemptyset(&plan.blocked);
  sigaddset(&plan.blocked, SIGUSR1);  // Note [Rank signal mask]
  const long open_max = sysconf(_SC_OPEN_MAX);
  plan.max_fd = static_cast<int>(open_max > 0 ? std::min(open_max, long{1 << 20}) : 65536);
  plan.keep = command.inherit_fds;
  plan.keep.push_back(failure[1]);  // close-on-exec: it goes at the execve
  std::sort(plan.keep.begin(), plan.keep.end());
  plan.keep.erase(std::remove_if(plan.keep.begin(), plan.keep.end(),
                                 [](int fd) { return fd <= STDERR_FILENO; }),
                  plan.keep.end());
  for (const std::string& procs : command.cgroup_procs) plan.cgroup_procs.push_back(procs.c_str());
  plan.account = command.account;
  // The child inherits the affinity of the thread that forks it, so this
  // thread takes the rank's CPUs for the fork and then its own back: no
  // window in which the rank runs, or starts a thread, unbound.
  const std::vector<int> own_cpus = command.cpus.empty() ? std::vector<int>() : AllowedCpus();
  if (!command.cpus.empty()) {
    if (absl::Status bound = BindThisThread(command.cpus); !bound.ok()) {
      LOG(WARNING) << "starting " << program << " unbound: " << bound.message();
    }
  }
  const pid_t pid = fork();
  if (pid == 0) RunChild(plan);
  const int fork_error = errno;
  if (!own_cpus.empty()) {
    if (absl::Status restored = BindThisThread(own_cpus); !restored.ok()) {
      LOG(ERROR) << "could not take back the launching thread's CPUs: " << restored.message();
    }
  }
  close(output[1]);
  close(failure[1]);
  if (pid < 0) {
    close(output[0]);
    close(failure[0]);
    return StartError(fork_error, program, absl::StrCat("fork: ", std::strerror(fork_error)));
  }
  const std::optional<ChildFailure> failed = ReadChildFailure(failure[0]);
  close(failure[0]);
  if (failed.has_value()) {
    close(output[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return ChildStartError(*failed, program, command);
  }
  return std::unique_ptr<RankProcess>(std::make_unique<PosixRankProcess>(pid, output[0]));
}

}  // namespace chorus
