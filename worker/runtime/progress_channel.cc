#include "worker/runtime/progress_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

// Every record starts with this byte: a serialized heartbeat may be empty,
// and a datagram of length zero would read like the peer's close.
constexpr char kRecordTag = 'P';

absl::Status Errno(const std::string& what) {
  return absl::ErrnoToStatus(errno, absl::StrCat("progress channel: ", what));
}

}  // namespace

absl::StatusOr<ProgressChannelPair> CreateProgressChannel() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    return Errno("socketpair");
  }
  // The program's end must survive exec.
  int flags = fcntl(fds[1], F_GETFD);
  if (flags < 0 || fcntl(fds[1], F_SETFD, flags & ~FD_CLOEXEC) != 0) {
    absl::Status status = Errno("making the program's end inheritable");
    close(fds[0]);
    close(fds[1]);
    return status;
  }
  return ProgressChannelPair{fds[0], fds[1]};
}

absl::StatusOr<std::unique_ptr<ProgressSender>> ProgressSender::FromEnvironment() {
  const char* value = std::getenv(kProgressFdVariable);
  if (value == nullptr || *value == '\0') {
    return absl::NotFoundError(absl::StrCat(
        kProgressFdVariable, " is not set: the program is not running as a Chorus program job"));
  }
  int fd = -1;
  if (!absl::SimpleAtoi(value, &fd) || fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kProgressFdVariable, "=", value, " is not a file descriptor number"));
  }
  struct stat st;
  int type = 0;
  socklen_t len = sizeof(type);
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) ||
      getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET) {
    return absl::InvalidArgumentError(absl::StrCat(
        kProgressFdVariable, "=", value,
        " is not an open progress channel (a SOCK_SEQPACKET socket inherited from chorus-rank)"));
  }
  // The program's own children do not inherit it.
  int flags = fcntl(fd, F_GETFD);
  if (flags >= 0) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  return std::make_unique<ProgressSender>(fd);
}

ProgressSender::ProgressSender(int fd) : fd_(fd) {}

ProgressSender::~ProgressSender() { close(fd_); }

absl::Status ProgressSender::Send(const v1::RankHeartbeat& progress) {
  std::string record(1, kRecordTag);
  if (!progress.AppendToString(&record)) {
    return absl::InvalidArgumentError("progress channel: the record does not serialize");
  }
  if (record.size() > kMaxProgressRecordBytes) {
    return absl::InvalidArgumentError(absl::StrCat("progress channel: a record of ", record.size(),
                                                   " bytes is over the limit of ",
                                                   kMaxProgressRecordBytes));
  }
  while (true) {
    if (send(fd_, record.data(), record.size(), MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) {
      return absl::OkStatus();
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
      return absl::ResourceExhaustedError(
          "progress channel: the supervisor is behind; this record was dropped");
    }
    if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN) {
      return absl::UnavailableError("progress channel: the supervising chorus-rank is gone");
    }
    return Errno("send");
  }
}

ProgressReceiver::ProgressReceiver(int fd) : fd_(fd) {}

ProgressReceiver::~ProgressReceiver() { close(fd_); }

absl::StatusOr<v1::RankHeartbeat> ProgressReceiver::Receive(absl::Time deadline) {
  if (closed_) return absl::OutOfRangeError("progress channel: the program's end is closed");
  std::string buffer(kMaxProgressRecordBytes + 1, '\0');
  bool have = false;
  bool bad = false;
  v1::RankHeartbeat newest;
  // Wait for the first record (or the close), then drain without waiting.
  bool waited = false;
  while (true) {
    if (!waited) {
      pollfd p{fd_, POLLIN, 0};
      const absl::Duration left = deadline - absl::Now();
      const int timeout_ms =
          left <= absl::ZeroDuration()
              ? 0
              : static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
      const int ready = poll(&p, 1, timeout_ms);
      if (ready < 0) {
        if (errno == EINTR) continue;
        return Errno("poll");
      }
      if (ready == 0) {
        if (absl::Now() < deadline) continue;
        return absl::DeadlineExceededError("progress channel: no record by the deadline");
      }
      waited = true;
    }
    const ssize_t n = recv(fd_, buffer.data(), buffer.size(), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // Nothing (more) queued: wait again if nothing came yet.
        if (!have && !bad && absl::Now() < deadline) {
          waited = false;
          continue;
        }
        break;
      }
      if (errno == ECONNRESET) {
        closed_ = true;
        break;
      }
      return Errno("recv");
    }
    if (n == 0) {
      closed_ = true;
      break;
    }
    v1::RankHeartbeat record;
    if (static_cast<size_t>(n) > buffer.size() || buffer[0] != kRecordTag ||
        !record.ParseFromArray(buffer.data() + 1, static_cast<int>(n) - 1)) {
      bad = true;
      continue;
    }
    newest = std::move(record);
    have = true;
  }
  if (have) return newest;
  if (bad) return absl::DataLossError("progress channel: a record that does not parse was skipped");
  if (closed_) return absl::OutOfRangeError("progress channel: the program's end is closed");
  return absl::DeadlineExceededError("progress channel: no record by the deadline");
}

}  // namespace chorus
