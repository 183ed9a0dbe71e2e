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
#include "common/env_names.h"
#include "google/protobuf/message_lite.h"

namespace chorus {
namespace {

// Every record starts with this byte: a serialized heartbeat may be empty,
// and a datagram of length zero would read like the peer's close.
constexpr char kRecordTag = 'P';
// Directives, supervisor to program.
constexpr char kDirectiveTag = 'D';
// A rank's join, rank to agent, and its answer, agent to rank.
constexpr char kJoinTag = 'J';
constexpr char kJoinAnswerTag = 'A';

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
  const char* value = std::getenv(kEnvProgressFd);
  if (value == nullptr || *value == '\0') {
    return absl::NotFoundError(absl::StrCat(
        kEnvProgressFd, " is not set: the program is not running as a Chorus program job"));
  }
  return FromVariable(kEnvProgressFd);
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

absl::Status ProgressSender::KeepAcrossExec() {
  const int flags = fcntl(fd_, F_GETFD);
  if (flags < 0 || fcntl(fd_, F_SETFD, flags & ~FD_CLOEXEC) != 0) {
    return Errno("making the channel inheritable across exec");
  }
  return absl::OkStatus();
}

absl::Status ProgressSender::Send(const v1::RankHeartbeat& progress) {
  return SendTagged(fd_, kRecordTag, progress, "the supervisor");
}

absl::Status ProgressSender::SendJoin(const v1::JoinRequest& join) {
  return SendTagged(fd_, kJoinTag, join, "the agent");
}

// Note [One reader, two kinds]
// A rank's end carries two kinds of message from its agent: directives,
// which the HeartbeatStream's reader waits for all the time, and join
// answers, which a rank re-forming waits for meanwhile. Two threads reading
// one socket would each take the other's messages. So one caller at a time
// reads (reading_), and puts what it reads into the queue of its kind; a
// caller that finds another reading waits on mu_ until its own kind is
// queued or the reader is done, then reads itself. The reader reads every
// message as it arrives, so neither kind waits for the other's deadline.
absl::StatusOr<bool> ProgressSender::AwaitIncoming(bool (ProgressSender::*ready)() const,
                                                   absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (!(this->*ready)() && !closed_) {
    if (!reading_) {
      reading_ = true;
      mu_.Unlock();
      const absl::Status read = ReadOne(deadline);
      mu_.Lock();
      reading_ = false;
      if (absl::IsDeadlineExceeded(read)) break;
      if (!read.ok()) return read;
      continue;
    }
    auto turn = [this, ready]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return (this->*ready)() || !reading_ || closed_;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&turn), deadline)) break;
  }
  return (this->*ready)();
}

absl::Status ProgressSender::ReadOne(absl::Time deadline) {
  std::string buffer(kMaxProgressRecordBytes + 1, '\0');
  while (true) {
    absl::StatusOr<bool> readable = WaitReadable(fd_, deadline);
    if (!readable.ok()) return readable.status();
    if (!*readable) return absl::DeadlineExceededError("progress channel: nothing by the deadline");
    const ssize_t n = recv(fd_, buffer.data(), buffer.size(), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno != ECONNRESET) return Errno("recv");
    }
    absl::MutexLock lock(&mu_);
    if (n <= 0) {
      closed_ = true;
      return absl::OkStatus();
    }
    const bool whole = static_cast<size_t>(n) <= buffer.size();
    const char* data = buffer.data() + 1;
    const int size = static_cast<int>(n) - 1;
    if (whole && buffer[0] == kDirectiveTag) {
      v1::Directive directive;
      if (directive.ParseFromArray(data, size)) {
        directives_.push_back(std::move(directive));
        return absl::OkStatus();
      }
    } else if (whole && buffer[0] == kJoinAnswerTag) {
      v1::AgentJoinAnswer answer;
      if (answer.ParseFromArray(data, size)) {
        answers_.push_back(std::move(answer));
        return absl::OkStatus();
      }
    }
    skipped_ = true;
    return absl::OkStatus();
  }
}

absl::StatusOr<v1::Directive> ProgressSender::ReceiveDirective(absl::Time deadline) {
  absl::StatusOr<bool> ready = AwaitIncoming(&ProgressSender::HasDirective, deadline);
  if (!ready.ok()) return ready.status();
  absl::MutexLock lock(&mu_);
  if (!directives_.empty()) {
    v1::Directive directive = std::move(directives_.front());
    directives_.pop_front();
    return directive;
  }
  if (skipped_) {
    skipped_ = false;
    return absl::DataLossError("progress channel: a directive that does not parse was skipped");
  }
  if (closed_) return absl::OutOfRangeError("progress channel: the supervisor's end is closed");
  return absl::DeadlineExceededError("progress channel: no directive by the deadline");
}

absl::StatusOr<v1::AgentJoinAnswer> ProgressSender::ReceiveJoinAnswer(absl::Time deadline) {
  absl::StatusOr<bool> ready = AwaitIncoming(&ProgressSender::HasJoinAnswer, deadline);
  if (!ready.ok()) return ready.status();
  absl::MutexLock lock(&mu_);
  if (!answers_.empty()) {
    v1::AgentJoinAnswer answer = std::move(answers_.front());
    answers_.pop_front();
    return answer;
  }
  if (closed_) return absl::OutOfRangeError("progress channel: the agent's end is closed");
  return absl::DeadlineExceededError("progress channel: no join answer by the deadline");
}

ProgressReceiver::ProgressReceiver(int fd) : fd_(fd) {}

ProgressReceiver::~ProgressReceiver() { close(fd_); }

absl::Status ProgressReceiver::SendDirective(const v1::Directive& directive) {
  return SendTagged(fd_, kDirectiveTag, directive, "the program");
}

absl::Status ProgressReceiver::SendJoinAnswer(const v1::AgentJoinAnswer& answer) {
  return SendTagged(fd_, kJoinAnswerTag, answer, "the rank");
}

std::vector<v1::JoinRequest> ProgressReceiver::TakeJoins() {
  std::vector<v1::JoinRequest> joins;
  joins.swap(joins_);
  return joins;
}

absl::StatusOr<v1::RankHeartbeat> ProgressReceiver::Receive(absl::Time deadline) {
  if (closed_) return absl::OutOfRangeError("progress channel: the program's end is closed");
  std::string buffer(kMaxProgressRecordBytes + 1, '\0');
  bool have = false;
  bool bad = false;
  bool joined = false;
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
        if (!have && !bad && !joined && absl::Now() < deadline) {
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
    if (static_cast<size_t>(n) <= buffer.size() && buffer[0] == kJoinTag) {
      v1::JoinRequest join;
      if (join.ParseFromArray(buffer.data() + 1, static_cast<int>(n) - 1)) {
        joins_.push_back(std::move(join));
        joined = true;
      } else {
        bad = true;
      }
      continue;
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
