#include "common/private_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/paths.h"
#include "glog/logging.h"

namespace chorus {
namespace {

constexpr mode_t kOthersBits = S_IRWXG | S_IRWXO;

std::string ModeText(mode_t mode) { return absl::StrFormat("%04o", mode & 07777); }

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status MakePrivateDirectory(const std::string& dir, absl::string_view what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", dir, ": cannot create: ", ec.message()));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return Errno(absl::StrCat(what, ": cannot stat"), dir);
  if ((st.st_mode & kOthersBits) == 0) return absl::OkStatus();
  if (::chmod(dir.c_str(), S_IRWXU) != 0) {
    // A directory another user owns (a Kubernetes volume's root, given to
    // the pod's group by fsGroup) cannot be changed; the files made in it
    // are private all the same.
    LOG(WARNING) << what << " " << dir << " is accessible by others (mode "
                 << ModeText(st.st_mode) << ") and cannot be made private: "
                 << std::strerror(errno) << "; chmod 700 " << dir;
  }
  return absl::OkStatus();
}

absl::Status MakePrivateFile(const std::string& path) {
  // O_CREAT with 0600: the umask can only take bits away from that.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, S_IRUSR | S_IWUSR);
  if (fd < 0) return Errno("cannot open", path);
  struct stat st {};
  absl::Status status;
  if (::fstat(fd, &st) != 0) {
    status = Errno("cannot stat", path);
  } else if ((st.st_mode & (kOthersBits | S_IXUSR)) != 0 && ::fchmod(fd, S_IRUSR | S_IWUSR) != 0) {
    status = Errno(absl::StrCat("cannot make private (mode ", ModeText(st.st_mode), ")"), path);
  }
  ::close(fd);
  return status;
}

absl::Status WritePrivateFile(const std::string& path, absl::string_view contents) {
  if (::access(path.c_str(), F_OK) == 0) {
    return absl::AlreadyExistsError(absl::StrCat(path, " already exists"));
  }
  const std::string temporary = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                        S_IRUSR | S_IWUSR);
  if (fd < 0) return Errno("cannot create", temporary);
  const bool written =
      ::write(fd, contents.data(), contents.size()) == static_cast<ssize_t>(contents.size()) &&
      ::fchmod(fd, S_IRUSR | S_IWUSR) == 0 && ::fsync(fd) == 0;
  const int write_errno = errno;
  ::close(fd);
  if (!written) {
    ::unlink(temporary.c_str());
    errno = write_errno;
    return Errno("cannot write", temporary);
  }
  // link(2), unlike rename(2), fails if `path` appeared meanwhile.
  if (::link(temporary.c_str(), path.c_str()) != 0) {
    const int link_errno = errno;
    ::unlink(temporary.c_str());
    if (link_errno == EEXIST) return absl::AlreadyExistsError(absl::StrCat(path, " already exists"));
    errno = link_errno;
    return Errno("cannot create", path);
  }
  ::unlink(temporary.c_str());
  const std::string dir = std::filesystem::path(path).parent_path().string();
  absl::Status synced = FsyncDirectory(dir.empty() ? "." : dir);
  if (!synced.ok()) return absl::FailedPreconditionError(synced.message());
  return absl::OkStatus();
}

absl::Status CheckTokenFileIsPrivate(const std::string& path, absl::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return absl::OkStatus();
  const bool mine = st.st_uid == ::geteuid();
  const mode_t exposed = st.st_mode & (mine ? kOthersBits : S_IRWXO);
  if (exposed == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, " ", path, " is readable by others (mode ",
                                                    ModeText(st.st_mode), "); chmod 600 ", path));
}

}  // namespace chorus
