// HOST:PORT addresses as users write them on the command line and as gRPC
// targets are written: "127.0.0.1:29650", "node7:29650", "[::1]:29650".
// One parser for every flag, environment variable and target that holds
// such an address, and lists of them ("a:29650,b:29650") where several
// coordinators may lead.
//
// Thread-safety: plain functions of their arguments.
//
// Example:
//   ASSIGN_OR_RETURN(HostPort address, ParseHostPort(flag_value));
//   Bind(address.host, address.port);       // host "::1", port 29650
//   FormatHostPort(address.host, 0);        // "[::1]:0"
#ifndef CHORUS_COMMON_HOST_PORT_H_
#define CHORUS_COMMON_HOST_PORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace chorus {

struct HostPort {
  std::string host;  // a name or an IP address; IPv6 without brackets
  int port = 0;      // in [0, 65535]; 0 = any free port where one is bound
};

// Splits "HOST:PORT" or "[IPV6]:PORT". INVALID_ARGUMENT quoting `address`
// when it has no host or port, unbalanced brackets, an IPv6 address without
// brackets, a host that is a URI or path (it contains '/'), or a port that
// is not a number in [0, 65535].
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

// Splits a comma-separated list of coordinator addresses, "HOST:PORT" or
// "a:29650,b:29650,c:29650" (spaces around entries are ignored). At least
// one entry; INVALID_ARGUMENT naming the bad entry and its position when
// one does not parse or is empty, or when an address is listed twice.
absl::StatusOr<std::vector<HostPort>> ParseHostPortList(absl::string_view addresses);

// "host:port", with brackets around an IPv6 host.
std::string FormatHostPort(absl::string_view host, int port);

}  // namespace chorus

#endif  // CHORUS_COMMON_HOST_PORT_H_
