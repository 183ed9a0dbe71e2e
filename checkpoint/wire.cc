#include "checkpoint/wire.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

void Put(char* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t Get(const char* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

// Connects `fd` (non-blocking while connecting) to `address` within `timeout`.
bool ConnectWithin(int fd, const sockaddr* address, socklen_t length, absl::Duration timeout,
                   int* error) {
  const int flags = fcntl(fd, F_GETFL);
  (void)fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int rc = ::connect(fd, address, length);
  // A signal during connect() leaves the connection in progress (EINTR), as
  // a non-blocking start does (EINPROGRESS); poll() restarts after a signal
  // with the time that is left.
  if (rc != 0 && (errno == EINPROGRESS || errno == EINTR)) {
    const absl::Time deadline = absl::Now() + timeout;
    pollfd p{fd, POLLOUT, 0};
    do {
      const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
      rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 0)));
    } while (rc < 0 && errno == EINTR);
    if (rc == 1) {
      socklen_t len = sizeof(*error);
      (void)getsockopt(fd, SOL_SOCKET, SO_ERROR, error, &len);
      rc = *error == 0 ? 0 : -1;
    } else {
      *error = rc == 0 ? ETIMEDOUT : errno;
      rc = -1;
    }
  } else if (rc != 0) {
    *error = errno;
  }
  (void)fcntl(fd, F_SETFL, flags);
  return rc == 0;
}

}  // namespace

void EncodeChunkHeader(const ChunkHeader& h, char out[kChunkHeaderBytes]) {
  Put(out + 0, h.data_len, 4);
  Put(out + 4, h.chunk_crc32c, 4);
  Put(out + 8, h.offset, 8);
  Put(out + 16, h.file_size, 8);
  Put(out + 24, h.file_crc32c, 4);
  Put(out + 28, h.name_len, 2);
  out[30] = static_cast<char>(h.flags);
  out[31] = 0;
}

absl::Status DecodeChunkHeader(const char in[kChunkHeaderBytes], ChunkHeader* h) {
  h->data_len = static_cast<uint32_t>(Get(in + 0, 4));
  h->chunk_crc32c = static_cast<uint32_t>(Get(in + 4, 4));
  h->offset = Get(in + 8, 8);
  h->file_size = Get(in + 16, 8);
  h->file_crc32c = static_cast<uint32_t>(Get(in + 24, 4));
  h->name_len = static_cast<uint16_t>(Get(in + 28, 2));
  h->flags = static_cast<uint8_t>(in[30]);
  if (in[31] != 0 || (h->flags & ~(ChunkHeader::kLast | ChunkHeader::kEndOfUpload)) != 0) {
    return absl::InvalidArgumentError(
        "checkpoint data connection: malformed chunk header (unknown flags)");
  }
  if (h->data_len > kMaxChunkDataBytes) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint data connection: chunk of ",
                                                   h->data_len, " bytes, more than the limit of ",
                                                   kMaxChunkDataBytes));
  }
  if (h->name_len > kMaxFileNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint data connection: file name of ",
                                                   h->name_len, " bytes, more than the limit of ",
                                                   kMaxFileNameBytes));
  }
  if ((h->flags & ChunkHeader::kEndOfUpload) != 0 && (h->data_len != 0 || h->name_len != 0)) {
    return absl::InvalidArgumentError("checkpoint data connection: end-of-upload marker with data");
  }
  return absl::OkStatus();
}

std::string EncodeReply(const absl::Status& status) {
  const absl::string_view message = status.message().substr(0, kMaxReplyMessageBytes);
  std::string out(8, '\0');
  Put(out.data(), static_cast<uint32_t>(status.code()), 4);
  Put(out.data() + 4, message.size(), 4);
  out.append(message.data(), message.size());
  return out;
}

absl::Status SendAll(int fd, std::initializer_list<absl::string_view> parts,
                     absl::string_view what) {
  std::vector<iovec> iov;
  for (absl::string_view p : parts) {
    if (!p.empty()) iov.push_back({const_cast<char*>(p.data()), p.size()});
  }
  size_t next = 0;
  while (next < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + next;
    msg.msg_iovlen = std::min<size_t>(iov.size() - next, IOV_MAX);
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      const bool timed_out = errno == EAGAIN || errno == EWOULDBLOCK;
      return absl::UnavailableError(absl::StrCat(
          "sending ", what, ": ",
          timed_out ? "timed out (the receiver stopped reading)" : std::strerror(errno)));
    }
    size_t left = static_cast<size_t>(n);
    while (next < iov.size() && left >= iov[next].iov_len) left -= iov[next++].iov_len;
    if (left > 0) {
      iov[next].iov_base = static_cast<char*>(iov[next].iov_base) + left;
      iov[next].iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status ReceiveAll(int fd, char* out, size_t n, absl::string_view what) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, out + got, n - got, 0);
    if (r == 0)
      return absl::UnavailableError(
          absl::StrCat("receiving ", what, ": the connection was closed"));
    if (r < 0) {
      if (errno == EINTR) continue;
      const bool timed_out = errno == EAGAIN || errno == EWOULDBLOCK;
      return absl::UnavailableError(
          absl::StrCat("receiving ", what, ": ", timed_out ? "timed out" : std::strerror(errno)));
    }
    got += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

absl::Status ReceiveReply(int fd, absl::Status* answer) {
  char head[8];
  RETURN_IF_ERROR(ReceiveAll(fd, head, sizeof(head), "the coordinator's answer"));
  const uint32_t code = static_cast<uint32_t>(Get(head, 4));
  const uint32_t length = static_cast<uint32_t>(Get(head + 4, 4));
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated) ||
      length > kMaxReplyMessageBytes) {
    return absl::UnavailableError("receiving the coordinator's answer: malformed reply");
  }
  std::string message(length, '\0');
  RETURN_IF_ERROR(ReceiveAll(fd, message.data(), length, "the coordinator's answer"));
  if (code == 0) {
    *answer = absl::OkStatus();
  } else {
    *answer = absl::Status(static_cast<absl::StatusCode>(code),
                           message.empty() ? std::string("checkpoint upload failed") : message);
  }
  return absl::OkStatus();
}

void SetSendTimeout(int fd, absl::Duration timeout) {
  const timeval tv = absl::ToTimeval(timeout);
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void SetReceiveTimeout(int fd, absl::Duration timeout) {
  const timeval tv = absl::ToTimeval(timeout);
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

void SetNoDelay(int fd) {
  const int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

absl::StatusOr<std::string> NewUploadToken() {
  std::string token(kTokenBytes, '\0');
  size_t got = 0;
  while (got < token.size()) {
    const ssize_t n = ::getrandom(token.data() + got, token.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  return token;
}

absl::StatusOr<int> ConnectTcp(const std::string& host, int port,
                               absl::Duration connect_timeout) {
  std::string name = host;
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']')
    name = name.substr(1, name.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(name.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("checkpoint data port: cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  int fd = -1;
  int error = 0;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = errno;
      continue;
    }
    if (!ConnectWithin(fd, a->ai_addr, a->ai_addrlen, connect_timeout, &error)) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("checkpoint data port ", host, ":", port,
                                               " cannot be reached: ", std::strerror(error)));
  }
  return fd;
}

absl::StatusOr<std::unique_ptr<CheckpointDataUpload>> CheckpointDataUpload::Connect(
    const std::string& host, int port, absl::string_view token, absl::Duration connect_timeout,
    absl::Duration timeout) {
  if (token.size() != kTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint upload token of ", token.size(),
                                                   " bytes, expected ", kTokenBytes));
  }
  ASSIGN_OR_RETURN(const int fd, ConnectTcp(host, port, connect_timeout));
  SetNoDelay(fd);
  SetSendTimeout(fd, timeout);
  SetReceiveTimeout(fd, timeout);
  std::unique_ptr<CheckpointDataUpload> upload(new CheckpointDataUpload(fd));
  RETURN_IF_ERROR(SendAll(fd, {absl::string_view(kHelloMagic, kHelloMagicBytes), token},
                          "the checkpoint upload's token"));
  absl::Status accepted;
  RETURN_IF_ERROR(ReceiveReply(fd, &accepted));
  RETURN_IF_ERROR(accepted);
  return upload;
}

CheckpointDataUpload::~CheckpointDataUpload() { ::close(fd_); }

absl::Status CheckpointDataUpload::BeginFile(const std::string& name) {
  if (name.empty() || name.size() > kMaxFileNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint file name \"", name, "\": empty or too long"));
  }
  file_name_ = name;
  first_chunk_ = true;
  offset_ = 0;
  file_crc_ = 0;
  gather_.clear();
  return absl::OkStatus();
}

absl::Status CheckpointDataUpload::Write(absl::string_view bytes) {
  while (!bytes.empty()) {
    if (gather_.empty() && bytes.size() >= kGatherBytes) {
      const size_t n = std::min(bytes.size(), kSendBytes);
      if (absl::Status s = SendChunk(bytes.substr(0, n), /*last=*/false); !s.ok()) return s;
      bytes.remove_prefix(n);
      continue;
    }
    const size_t n = std::min(bytes.size(), kGatherBytes - gather_.size());
    gather_.append(bytes.data(), n);
    bytes.remove_prefix(n);
    if (gather_.size() == kGatherBytes) {
      if (absl::Status s = SendChunk(gather_, /*last=*/false); !s.ok()) return s;
      gather_.clear();
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointDataUpload::EndFile() {
  absl::Status s = SendChunk(gather_, /*last=*/true);
  gather_.clear();
  return s;
}

absl::Status CheckpointDataUpload::SendChunk(absl::string_view data, bool last) {
  if (failed_)
    return absl::FailedPreconditionError("checkpoint data connection: an earlier send failed");
  // The coordinator answers early only to refuse the upload: stop sending.
  if (Answered())
    return ReasonFor(absl::UnavailableError("the coordinator ended the checkpoint upload"));
  ChunkHeader h;
  h.data_len = static_cast<uint32_t>(data.size());
  h.chunk_crc32c = Crc32c(data);
  h.offset = offset_;
  file_crc_ = Crc32cCombine(file_crc_, h.chunk_crc32c, data.size());
  offset_ += data.size();
  if (last) {
    h.flags = ChunkHeader::kLast;
    h.file_size = offset_;
    h.file_crc32c = file_crc_;
  }
  absl::string_view name;
  if (first_chunk_) {
    name = file_name_;
    h.name_len = static_cast<uint16_t>(name.size());
    first_chunk_ = false;
  }
  char header[kChunkHeaderBytes];
  EncodeChunkHeader(h, header);
  const absl::Time start = absl::Now();
  absl::Status s = SendAll(fd_, {absl::string_view(header, sizeof(header)), name, data},
                           absl::StrCat("checkpoint file ", file_name_));
  send_time_ += absl::Now() - start;
  if (!s.ok()) return ReasonFor(s);
  bytes_sent_ += static_cast<int64_t>(data.size());
  return absl::OkStatus();
}

absl::Status CheckpointDataUpload::ReasonFor(const absl::Status& send_error) {
  failed_ = true;
  absl::Status answer;
  if (!ReceiveReply(fd_, &answer).ok() || answer.ok()) return send_error;
  return answer;
}

bool CheckpointDataUpload::Answered() const {
  char c;
  const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

absl::Status CheckpointDataUpload::Finish() {
  if (failed_)
    return absl::FailedPreconditionError("checkpoint data connection: an earlier send failed");
  ChunkHeader h;
  h.flags = ChunkHeader::kEndOfUpload;
  char header[kChunkHeaderBytes];
  EncodeChunkHeader(h, header);
  if (absl::Status s = SendAll(fd_, {absl::string_view(header, sizeof(header))},
                               "the end of the checkpoint upload");
      !s.ok()) {
    return ReasonFor(s);
  }
  failed_ = true;  // one upload per connection
  absl::Status answer;
  RETURN_IF_ERROR(ReceiveReply(fd_, &answer));
  return answer;
}

}  // namespace chorus
