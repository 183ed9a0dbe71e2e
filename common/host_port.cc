#include "common/host_port.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

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

absl::StatusOr<std::vector<HostPort>> ParseHostPortList(absl::string_view addresses) {
  const std::vector<absl::string_view> entries = absl::StrSplit(addresses, ',');
  std::vector<HostPort> parsed;
  for (size_t i = 0; i < entries.size(); ++i) {
    const absl::string_view entry = absl::StripAsciiWhitespace(entries[i]);
    const std::string where =
        entries.size() == 1 ? "" : absl::StrCat("entry ", i + 1, " of \"", addresses, "\": ");
    if (entry.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where,
          "an empty address; write HOST:PORT or a list \"a:29650,b:29650\" without empty "
          "entries"));
    }
    absl::StatusOr<HostPort> one = ParseHostPort(entry);
    if (!one.ok()) return absl::InvalidArgumentError(absl::StrCat(where, one.status().message()));
    for (const HostPort& earlier : parsed) {
      if (earlier.host == one->host && earlier.port == one->port) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "\"", entry, "\" is listed twice; name each coordinator once"));
      }
    }
    parsed.push_back(*std::move(one));
  }
  return parsed;
}

std::string FormatHostPort(absl::string_view host, int port) {
  if (absl::StrContains(host, ':')) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

}  // namespace chorus
