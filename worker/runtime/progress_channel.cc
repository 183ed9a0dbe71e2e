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
#include "google/protobuf/message_lite.h"

namespace chorus {
namespace {

// Every record starts with this byte: a serialized heartbeat may be empty,
// and a datagram of length zero would read like the peer's close.
constexpr char kRecordTag = 'P';
// Directives, supervisor to program.
constexpr char kDirectiveTag = 'D';

absl::Status Errno(const std::string& what) {
  return absl::ErrnoToStatus(errno, absl::StrCat("progress channel: ", what));
}

// One tagged message, without blocking. `peer` names the other end.
absl::Status SendTagged(int fd, char tag, const google::protobuf::MessageLite& message,
                        const char* peer) {
  std::string bytes(1, tag);
  if (!message.AppendToString(&bytes)) {
    return absl::InvalidArgumentError("progress channel: the message does not serialize");
  }
  if (bytes.size() > kMaxProgressRecordBytes) {
    return absl::InvalidArgumentError(absl::StrCat("progress channel: a message of ", bytes.size(),
                                                   " bytes is over the limit of ",
                                                   kMaxProgressRecordBytes));
  }
  while (true) {
    if (send(fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) {
      return absl::OkStatus();
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
      return absl::ResourceExhaustedError(
          absl::StrCat("progress channel: ", peer, " is behind; this message was dropped"));
    }
    if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN) {
      return absl::UnavailableError(absl::StrCat("progress channel: ", peer, " is gone"));
    }
    return Errno("send");
  }
}

// Waits for `fd` to be readable until `deadline`: true when it is,
// false at the deadline.
absl::StatusOr<bool> WaitReadable(int fd, absl::Time deadline) {
  while (true) {
    pollfd p{fd, POLLIN, 0};
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
    if (ready > 0) return true;
    if (absl::Now() >= deadline) return false;
  }
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
  return FromVariable(kProgressFdVariable);
}

absl::StatusOr<std::unique_ptr<ProgressSender>> ProgressSender::FromVariable(
    const char* variable) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') {
    return absl::NotFoundError(absl::StrCat(variable, " is not set"));
  }
  int fd = -1;
  if (!absl::SimpleAtoi(value, &fd) || fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(variable, "=", value, " is not a file descriptor number"));
  }
  struct stat st;
  int type = 0;
  socklen_t len = sizeof(type);
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) ||
      getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET) {
    return absl::InvalidArgumentError(absl::StrCat(
        variable, "=", value,
        " is not an open progress channel (a SOCK_SEQPACKET socket inherited from the parent "
        "process)"));
  }
  // Our own children do not inherit it.
  int flags = fcntl(fd, F_GETFD);
  if (flags >= 0) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  return std::make_unique<ProgressSender>(fd);
}

ProgressSender::ProgressSender(int fd) : fd_(fd) {}

ProgressSender::~ProgressSender() { close(fd_); }

absl::Status ProgressSender::Send(const v1::RankHeartbeat& progress) {
  return SendTagged(fd_, kRecordTag, progress, "the supervisor");
}

absl::StatusOr<v1::Directive> ProgressSender::ReceiveDirective(absl::Time deadline) {
  std::string buffer(kMaxProgressRecordBytes + 1, '\0');
  while (true) {
    absl::StatusOr<bool> readable = WaitReadable(fd_, deadline);
    if (!readable.ok()) return readable.status();
    if (!*readable) {
      return absl::DeadlineExceededError("progress channel: no directive by the deadline");
    }
    const ssize_t n = recv(fd_, buffer.data(), buffer.size(), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno == ECONNRESET) {
        return absl::OutOfRangeError("progress channel: the supervisor's end is closed");
      }
      return Errno("recv");
    }
    if (n == 0) return absl::OutOfRangeError("progress channel: the supervisor's end is closed");
    v1::Directive directive;
    if (static_cast<size_t>(n) > buffer.size() || buffer[0] != kDirectiveTag ||
        !directive.ParseFromArray(buffer.data() + 1, static_cast<int>(n) - 1)) {
      return absl::DataLossError("progress channel: a directive that does not parse was skipped");
    }
    return directive;
  }
}

ProgressReceiver::ProgressReceiver(int fd) : fd_(fd) {}

ProgressReceiver::~ProgressReceiver() { close(fd_); }

absl::Status ProgressReceiver::SendDirective(const v1::Directive& directive) {
  return SendTagged(fd_, kDirectiveTag, directive, "the program");
}

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
      absl::StatusOr<bool> readable = WaitReadable(fd_, deadline);
      if (!readable.ok()) return readable.status();
      if (!*readable) {
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
