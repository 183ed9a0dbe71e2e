#include "coordinator/checkpoint/checkpoint_data_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/wire.h"
#include "common/status_macros.h"
#include "coordinator/checkpoint/checkpoint_uploads.h"
#include "glog/logging.h"

namespace chorus {
namespace {

// Reads the chunks of one upload into `upload` until the end marker; at
// most `max_bytes` of file data in all (Note [Hostile peers on the data port]).
absl::Status ReceiveFiles(int fd, CheckpointStore::Upload& upload, int64_t max_bytes) {
  // One message, reused: the data buffer keeps its capacity from chunk to
  // chunk, and the name is set only on a file's first chunk, as in Upload.
  v1::CheckpointChunk chunk;
  std::string* data = chunk.mutable_data();
  std::string file;             // the file being received
  uint64_t finished_bytes = 0;  // of the files before it
  const uint64_t limit = static_cast<uint64_t>(max_bytes);
  auto too_big = [&](const std::string& what) {
    return absl::ResourceExhaustedError(
        absl::StrCat("checkpoint file \"", file, "\": ", what, " (after ", finished_bytes,
                     " bytes of earlier files) is more than the limit of ", max_bytes,
                     " bytes per checkpoint (coordinator flag --checkpoint_max_upload_bytes)"));
  };
  for (;;) {
    char header[kChunkHeaderBytes];
    RETURN_IF_ERROR(ReceiveAll(fd, header, sizeof(header), "a checkpoint chunk header"));
    ChunkHeader h;
    RETURN_IF_ERROR(DecodeChunkHeader(header, &h));
    if ((h.flags & ChunkHeader::kEndOfUpload) != 0) return absl::OkStatus();
    std::string* name = chunk.mutable_file_name();
    name->resize(h.name_len);
    RETURN_IF_ERROR(ReceiveAll(fd, name->data(), name->size(), "a checkpoint file name"));
    if (!name->empty()) file = *name;
    // Refused before any of its data is read (offsets other than what has
    // arrived are refused by the upload itself). No sum below overflows:
    // each term is checked against the limit (< 2^63) first.
    if (h.offset > limit || finished_bytes + h.offset + h.data_len > limit) {
      return too_big(absl::StrCat("a chunk of ", h.data_len, " bytes at offset ", h.offset));
    }
    if ((h.flags & ChunkHeader::kLast) != 0 &&
        (h.file_size > limit || finished_bytes + h.file_size > limit)) {
      return too_big(absl::StrCat("a file of ", h.file_size, " bytes"));
    }
    data->resize(h.data_len);
    RETURN_IF_ERROR(ReceiveAll(fd, data->data(), data->size(), "checkpoint data"));
    chunk.set_offset(static_cast<int64_t>(h.offset));
    chunk.set_chunk_crc32c(h.chunk_crc32c);
    chunk.set_last((h.flags & ChunkHeader::kLast) != 0);
    chunk.set_file_size(static_cast<int64_t>(h.file_size));
    chunk.set_file_crc32c(h.file_crc32c);
    RETURN_IF_ERROR(upload.AddChunk(chunk));
    if (chunk.last()) finished_bytes += h.file_size;
  }
}

// A receive that ran into its timeout (ReceiveAll's UNAVAILABLE says so),
// rather than a peer that closed or reset the connection.
bool TimedOut(const absl::Status& status) {
  return absl::IsUnavailable(status) && absl::StrContains(status.message(), "timed out");
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointDataServer>> CheckpointDataServer::Start(
    const std::string& host, int port, CheckpointUploads& uploads) {
  return Start(host, port, uploads, Options());
}

absl::StatusOr<std::unique_ptr<CheckpointDataServer>> CheckpointDataServer::Start(
    const std::string& host, int port, CheckpointUploads& uploads, Options options) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service_name = std::to_string(port);
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service_name.c_str(), &hints,
                             &found);
      rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint data port: cannot resolve host \"",
                                                   host, "\": ", gai_strerror(rc)));
  }
  int fd = -1;
  int error = 0;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = errno;
      continue;
    }
    const int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      error = errno;
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        "--checkpoint_data_port ", port, ": cannot listen on ", host, ":", port, " (",
        std::strerror(error), "); pick another port, or -1 to upload checkpoints over gRPC"));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  (void)::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  options.max_uploads = std::max(1, options.max_uploads);
  options.max_connections = std::max(options.max_uploads, options.max_connections);
  // Keeps ReceiveFiles' sums far from overflowing.
  options.max_upload_bytes = std::clamp<int64_t>(options.max_upload_bytes, 1, int64_t{1} << 62);
  std::unique_ptr<CheckpointDataServer> server(
      new CheckpointDataServer(fd, bound_port, uploads, options));
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

CheckpointDataServer::~CheckpointDataServer() { Shutdown(); }

void CheckpointDataServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
      for (Connection& c : connections_) {
        if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
      }
    }
  }
  absl::MutexLock joining(&join_mu_);  // a second caller waits for the first
  if (acceptor_.joinable()) {
    acceptor_.join();
    ::close(listen_fd_);
  }
  // The acceptor is gone: nobody adds connections any more.
  std::vector<std::thread*> threads;
  {
    absl::MutexLock lock(&mu_);
    for (Connection& c : connections_) threads.push_back(&c.thread);
  }
  for (std::thread* t : threads) {
    if (t->joinable()) t->join();
  }
}

void CheckpointDataServer::AcceptLoop() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno != EINTR && errno != ECONNABORTED) {
        // Out of descriptors or memory: wait a little rather than spin.
        LOG(WARNING) << "checkpoint data port: accept: " << std::strerror(errno);
        mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100));
      }
      continue;
    }
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (it->done) {
        it->thread.join();
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    if (!MakeRoomLocked()) {
      // Far more than uploads may run, all of them past their hello: no
      // thread for this one. The rank sees the connection closed and
      // uploads over gRPC.
      LOG_EVERY_N(WARNING, 100) << "checkpoint data port: " << options_.max_connections
                                << " connections sending uploads or waiting to; closing a new one";
      ::close(fd);
      continue;
    }
    Connection& c = connections_.emplace_back();
    c.fd = fd;
    c.thread = std::thread([this, &c, fd] { Serve(fd, &c); });
  }
}

bool CheckpointDataServer::MakeRoomLocked() {
  int open = 0;
  Connection* oldest_idle = nullptr;
  for (Connection& c : connections_) {
    if (c.done || c.evicted) continue;
    ++open;
    if (!c.past_hello && oldest_idle == nullptr) oldest_idle = &c;
  }
  if (open < options_.max_connections) return true;
  if (oldest_idle == nullptr) return false;
  // Its thread sees the connection end and finishes (AnswerAndClose).
  ::shutdown(oldest_idle->fd, SHUT_RDWR);
  oldest_idle->evicted = true;
  ++idle_dropped_;
  LOG_EVERY_N(WARNING, 100) << "checkpoint data port: " << options_.max_connections
                            << " connections open; dropped the oldest one that sent no hello ("
                            << idle_dropped_ << " so far)";
  return true;
}

absl::StatusOr<std::string> CheckpointDataServer::ReadHello(int fd) {
  // The magic first, so that a stray client (an HTTP probe, say) is told
  // what this port is without waiting for the token's bytes.
  char hello[kHelloMagicBytes + kTokenBytes];
  absl::Status status = ReceiveAll(fd, hello, kHelloMagicBytes, "the upload's hello");
  if (status.ok() && std::memcmp(hello, kHelloMagic, kHelloMagicBytes) != 0) {
    return absl::InvalidArgumentError(
        "this is the coordinator's checkpoint data port; it takes only uploads opened with "
        "CheckpointService.OpenUpload");
  }
  if (status.ok()) {
    status = ReceiveAll(fd, hello + kHelloMagicBytes, kTokenBytes, "the upload token");
  }
  if (TimedOut(status)) {
    return absl::UnavailableError(absl::StrCat("checkpoint data port: ", status.message(),
                                               " (a connection must send its hello within ",
                                               absl::FormatDuration(options_.hello_timeout), ")"));
  }
  if (!status.ok()) return status;
  return std::string(hello + kHelloMagicBytes, kTokenBytes);
}

absl::Status CheckpointDataServer::Admit(Connection* connection) {
  absl::MutexLock lock(&mu_);
  if (connection->evicted) {
    return absl::UnavailableError("checkpoint data port: connection dropped to make room");
  }
  connection->past_hello = true;
  if (uploads_ >= options_.max_uploads) {
    // The token stays valid: the rank uploads over gRPC instead, or comes
    // back.
    return absl::ResourceExhaustedError(absl::StrCat("checkpoint data port: ", options_.max_uploads,
                                                     " uploads are running; upload over gRPC"));
  }
  ++uploads_;
  return absl::OkStatus();
}

absl::Status CheckpointDataServer::Receive(int fd, CheckpointUploads::Started opened) {
  // Accepted: the rank starts sending (its errors from here on are the
  // upload's, not the connection's).
  SetReceiveTimeout(fd, options_.io_timeout);
  absl::Status status =
      SendAll(fd, {EncodeReply(absl::OkStatus())}, "the acceptance of a checkpoint upload");
  const std::string what = absl::StrCat("checkpoint ", opened.grant.manifest.job_id(), " step ",
                                        opened.step, " from rank ", opened.rank);
  const absl::Time start = absl::Now();
  if (status.ok()) status = ReceiveFiles(fd, *opened.upload, options_.max_upload_bytes);
  if (TimedOut(status)) {
    status = absl::UnavailableError(
        absl::StrCat(status.message(), " (the checkpoint data port drops an upload after ",
                     absl::FormatDuration(options_.io_timeout),
                     " without progress: coordinator flag --checkpoint_data_timeout_seconds)"));
  }
  const absl::Time received = absl::Now();
  if (status.ok()) status = checkpoint_uploads_.Complete(std::move(opened)).status();
  if (status.ok()) {
    VLOG(1) << what << ": received over the data port in "
            << absl::ToDoubleSeconds(received - start) << " s, stored in "
            << absl::ToDoubleSeconds(absl::Now() - start) << " s";
  } else {
    LOG(WARNING) << what << ": upload failed: " << status;
  }
  // A failed upload's staging files go with `opened` (CheckpointStore::Upload).
  return status;
}

void CheckpointDataServer::Serve(int fd, Connection* connection) {
  SetSendTimeout(fd, options_.io_timeout);
  // The hello comes at once from a rank; a connection that sends nothing
  // gives its thread back soon.
  SetReceiveTimeout(fd, std::min(options_.io_timeout, options_.hello_timeout));
  SetNoDelay(fd);
  absl::StatusOr<std::string> token = ReadHello(fd);
  absl::Status admitted = token.ok() ? Admit(connection) : token.status();
  absl::StatusOr<CheckpointUploads::Started> opened =
      admitted.ok() ? checkpoint_uploads_.TakeOpened(*token)
                    : absl::StatusOr<CheckpointUploads::Started>(admitted);
  absl::Status status = opened.status();
  if (!opened.ok()) {
    if (absl::IsUnavailable(opened.status())) {
      // Silent or dropped before its hello: a scan, a flood, or a rank
      // that died; logged in bulk by the acceptor.
      VLOG(1) << "checkpoint data port: connection without a hello: " << opened.status();
    } else if (!absl::IsResourceExhausted(opened.status())) {
      LOG(WARNING) << "checkpoint data port: connection refused: " << opened.status();
    }
  } else {
    status = Receive(fd, *std::move(opened));
  }
  if (admitted.ok()) {  // the upload slot Admit took
    absl::MutexLock lock(&mu_);
    --uploads_;
  }
  AnswerAndClose(fd, connection, status);
}

void CheckpointDataServer::AnswerAndClose(int fd, Connection* connection,
                                          const absl::Status& status) {
  const std::string reply = EncodeReply(status);
  (void)SendAll(fd, {reply}, "the answer to a checkpoint upload");
  if (!status.ok()) {
    // The peer may still be sending; closing with unread data would reset
    // the connection and could destroy the answer before it is read. Let
    // it see the answer (it checks between chunks) and stop.
    ::shutdown(fd, SHUT_WR);
    SetReceiveTimeout(fd, absl::Milliseconds(200));
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    std::vector<char> sink(64 << 10);
    while (absl::Now() < deadline) {
      const ssize_t n = ::recv(fd, sink.data(), sink.size(), 0);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
  }
  absl::MutexLock lock(&mu_);
  ::close(fd);
  connection->fd = -1;
  connection->done = true;
}

}  // namespace chorus
