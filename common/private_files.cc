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
  const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  // mkdir(2) with 0700: the umask can only take bits away from that.
  if (ec || (::mkdir(dir.c_str(), S_IRWXU) != 0 && errno != EEXIST)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " ", dir, ": cannot create: ", ec ? ec.message() : std::strerror(errno)));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return Errno(absl::StrCat(what, ": cannot stat"), dir);
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(what, " ", dir, " is not a directory"));
  }
  if ((st.st_mode & kOthersBits) == 0) return absl::OkStatus();
  if (::chmod(dir.c_str(), S_IRWXU) != 0) {
    // A directory another user owns (a Kubernetes volume's root, given to
    // the pod's group by fsGroup) cannot be changed; the files made in it
    // are private all the same.
    LOG(WARNING) << what << " " << dir << " is accessible by others (mode "
                 << ModeText(st.st_mode) << ") and cannot be made private: "
                 << std::strerror(errno) << "; chmod 700 " << dir;
  } else {
    LOG(WARNING) << what << " " << dir << " was accessible by others (mode "
                 << ModeText(st.st_mode) << "); made it 0700";
  }
  return absl::OkStatus();
}

int OpenPrivateFile(const std::string& path, int flags) {
  // O_CREAT with 0600: the umask can only take bits away from that.
  const int fd = ::open(path.c_str(), flags | O_CREAT | O_CLOEXEC | O_NOFOLLOW, S_IRUSR | S_IWUSR);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  if ((st.st_mode & (kOthersBits | S_IXUSR)) == 0) return fd;
  if (::fchmod(fd, S_IRUSR | S_IWUSR) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  LOG(WARNING) << path << " was readable by others (mode " << ModeText(st.st_mode)
               << "); made it 0600";
  return fd;
}

absl::Status MakePrivateFile(const std::string& path) {
  const int fd = OpenPrivateFile(path, O_RDWR);
  if (fd < 0) return Errno("cannot open or make private", path);
  ::close(fd);
  return absl::OkStatus();
}

void TightenPrivateTree(const std::string& root, absl::string_view what) {
  namespace fs = std::filesystem;
  int changed = 0, left = 0;
  auto tighten = [&](const fs::path& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || S_ISLNK(st.st_mode)) return;
    if ((st.st_mode & kOthersBits) == 0) return;
    const mode_t mode = S_ISDIR(st.st_mode) ? S_IRWXU : (st.st_mode & S_IRWXU);
    (::chmod(path.c_str(), mode) == 0 ? changed : left) += 1;
  };
  std::error_code ec;
  tighten(root);
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    tighten(it->path());
  }
  if (changed + left == 0) return;
  LOG(WARNING) << what << " " << root << ": " << changed
               << " file(s) and directories others could read were made private (0700/0600)"
               << (left > 0 ? absl::StrCat("; ", left, " could not be changed") : "");
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
