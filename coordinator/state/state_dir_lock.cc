#include "coordinator/state/state_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/private_files.h"

namespace chorus {

absl::StatusOr<std::unique_ptr<StateDirLock>> StateDirLock::Acquire(const std::string& dir) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("--state_dir must not be empty");
  }
  // Note [Private files]: the directory holds every job's spec and
  // checkpoints and the job-credential secret.
  if (absl::Status s = MakePrivateDirectory(dir, "--state_dir"); !s.ok()) return s;
  const std::string lock_path = dir + "/LOCK";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("--state_dir ", dir, ": cannot open ",
                                                      lock_path, ": ", std::strerror(errno),
                                                      " (is the directory writable?)"));
  }
  // From here on the descriptor belongs to `lock`: every early return closes it.
  std::unique_ptr<StateDirLock> lock(new StateDirLock(dir, fd));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char owner[32] = {0};
    const ssize_t n = ::pread(fd, owner, sizeof(owner) - 1, 0);
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir ", dir, " is in use by another coordinator",
                     n > 0 ? absl::StrCat(" (pid ", std::string(owner, n), ")") : "",
                     "; stop it or choose another --state_dir"));
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return absl::FailedPreconditionError(absl::StrCat("--state_dir ", dir, ": cannot write ",
                                                      lock_path, ": ", std::strerror(errno)));
  }
  return lock;
}

StateDirLock::~StateDirLock() { ::close(fd_); }

}  // namespace chorus
