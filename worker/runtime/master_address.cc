#include "worker/runtime/master_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace chorus {

absl::StatusOr<int> PickFreePort(const std::string& host) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "0", &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("MASTER_PORT: cannot resolve CHORUS_RANK_HOST ",
                                               host, ": ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, ::freeaddrinfo);
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound = {};
    socklen_t length = sizeof(bound);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    ::close(fd);
    const int port = bound.ss_family == AF_INET6
                         ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    return port;
  }
  return absl::UnavailableError(
      absl::StrCat("MASTER_PORT: cannot bind a port on CHORUS_RANK_HOST ", host, ": ", last_error));
}

absl::StatusOr<HostPort> AgreeMasterAddress(Store& store, int rank, const std::string& host,
                                            absl::Time deadline) {
  if (rank == 0) {
    ASSIGN_OR_RETURN(const int port, PickFreePort(host));
    HostPort master{host, port};
    RETURN_IF_ERROR(store.Set(kMasterAddressKey, FormatHostPort(host, port)));
    return master;
  }
  absl::StatusOr<std::string> published = store.Get(kMasterAddressKey, deadline);
  if (!published.ok()) {
    return absl::Status(published.status().code(),
                        absl::StrCat("MASTER_ADDR/MASTER_PORT: rank 0 has not published them (",
                                     published.status().message(), ")"));
  }
  absl::StatusOr<HostPort> master = ParseHostPort(*published);
  if (!master.ok()) {
    return absl::InternalError(
        absl::StrCat("MASTER_ADDR/MASTER_PORT: rank 0 published \"", *published, "\""));
  }
  return master;
}

}  // namespace chorus
