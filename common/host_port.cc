#include "common/host_port.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

absl::Status Invalid(absl::string_view address, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "expected HOST:PORT (e.g. 127.0.0.1:29650 or [::1]:29650), got \"", address, "\": ", why));
}

}  // namespace

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return Invalid(address, "no :PORT");
  absl::string_view host = address.substr(0, colon);
  const absl::string_view port = address.substr(colon + 1);
  if (absl::StrContains(host, '/'))
    return Invalid(address, "the host is a path or URI, not a name or address");
  if (absl::StartsWith(host, "[") || absl::EndsWith(host, "]")) {
    if (host.size() < 2 || host.front() != '[' || host.back() != ']')
      return Invalid(address, "unbalanced brackets");
    host = host.substr(1, host.size() - 2);
  } else if (absl::StrContains(host, ':')) {
    return Invalid(address, "an IPv6 address needs brackets, as in [::1]:29650");
  }
  if (host.empty()) return Invalid(address, "no host");
  int number = 0;
  if (port.empty() || !absl::SimpleAtoi(port, &number) || number < 0 || number > 65535 ||
      port.find_first_not_of("0123456789") != absl::string_view::npos) {
    return Invalid(address,
                   absl::StrCat("the port must be a number in [0, 65535], got \"", port, "\""));
  }
  return HostPort{std::string(host), number};
}

std::string FormatHostPort(absl::string_view host, int port) {
  if (absl::StrContains(host, ':')) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

}  // namespace chorus
