#include "common/tcp_relay_for_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/time/clock.h"

namespace chorus {
namespace {

// How often the relay's threads look at their flags.
constexpr int kPollMs = 20;

// Writes all of `data` to `fd`; false when the peer is gone (or a write
// timed out: the sockets have a 1 s send timeout).
bool WriteAll(int fd, const char* data, ssize_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0) return false;
    data += n;
    size -= n;
  }
  return true;
}

}  // namespace

TcpRelay::TcpRelay(int backend_port) : backend_port_(backend_port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), length) == 0 &&
      ::listen(listen_fd_, 16) == 0 &&
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port_ = ntohs(address.sin_port);
  }
  acceptor_ = std::thread([this] { AcceptConnections(); });
}

TcpRelay::~TcpRelay() {
  stop_.store(true);
  acceptor_.join();
  absl::MutexLock lock(&mu_);
  for (std::thread& pump : pumps_) pump.join();
  ::close(listen_fd_);
}

void TcpRelay::HoldNewConnections(absl::Duration hold) {
  absl::MutexLock lock(&mu_);
  hold_ = hold;
}

int TcpRelay::accepted() const {
  absl::MutexLock lock(&mu_);
  return accepted_;
}

void TcpRelay::AcceptConnections() {
  while (!stop_.load()) {
    if (frozen_.load()) {
      absl::SleepFor(absl::Milliseconds(kPollMs));
      continue;
    }
    pollfd listening{listen_fd_, POLLIN, 0};
    if (::poll(&listening, 1, kPollMs) <= 0) continue;
    const int client = ::accept(listen_fd_, nullptr, nullptr);
    if (client < 0) continue;
    const int backend = ConnectToBackend();
    if (backend < 0) {
      ::close(client);
      continue;
    }
    absl::MutexLock lock(&mu_);
    ++accepted_;
    const absl::Time start = absl::Now() + hold_;
    pumps_.emplace_back([this, client, backend, start] { Pump(client, backend, start); });
  }
}

int TcpRelay::ConnectToBackend() const {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(backend_port_);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void TcpRelay::Pump(int client, int backend, absl::Time start) {
  const timeval send_timeout{1, 0};
  for (int fd : {client, backend}) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
  }
  char buffer[16384];
  const int cuts = cuts_.load();
  bool open = true;
  while (open && !stop_.load() && cuts_.load() == cuts) {
    if (frozen_.load() || absl::Now() < start) {
      absl::SleepFor(absl::Milliseconds(kPollMs));
      continue;
    }
    pollfd fds[2] = {{client, POLLIN, 0}, {backend, POLLIN, 0}};
    if (::poll(fds, 2, kPollMs) <= 0) continue;
    for (int i = 0; i < 2 && open; ++i) {
      if (fds[i].revents == 0) continue;
      const ssize_t n = ::recv(fds[i].fd, buffer, sizeof(buffer), 0);
      open = n > 0 && WriteAll(fds[1 - i].fd, buffer, n);
    }
  }
  ::close(client);
  ::close(backend);
}

}  // namespace chorus
