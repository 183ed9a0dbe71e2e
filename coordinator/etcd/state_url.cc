#include "coordinator/etcd/state_url.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/host_port.h"

namespace chorus {
namespace {

constexpr char kForm[] =
    "want etcd://HOST:PORT[,HOST:PORT...]/PREFIX, or no --state for SQLite in --state_dir";

absl::Status Bad(absl::string_view flag, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--state \"", flag, "\": ", why, " (", kForm, ")"));
}

}  // namespace

absl::StatusOr<StateUrl> ParseStateUrl(absl::string_view flag) {
  StateUrl url;
  if (flag.empty()) return url;
  absl::string_view rest = flag;
  if (!absl::ConsumePrefix(&rest, "etcd://")) {
    return Bad(flag, absl::StrContains(flag, "://") ? "unknown scheme" : "not a URL");
  }
  const size_t slash = rest.find('/');
  if (slash == absl::string_view::npos || slash + 1 == rest.size()) {
    return Bad(flag, "no PREFIX: every key goes under it, e.g. /chorus");
  }
  const absl::string_view hosts = rest.substr(0, slash);
  const absl::string_view prefix = rest.substr(slash);
  if (hosts.empty()) return Bad(flag, "no etcd endpoint");
  for (absl::string_view endpoint : absl::StrSplit(hosts, ',')) {
    absl::StatusOr<HostPort> address = ParseHostPort(endpoint);
    if (!address.ok()) return Bad(flag, address.status().message());
    if (address->port == 0) return Bad(flag, absl::StrCat(endpoint, " has port 0"));
  }
  if (absl::EndsWith(prefix, "/")) return Bad(flag, "PREFIX ends with '/'");
  if (absl::StrContains(prefix, "//")) return Bad(flag, "PREFIX has an empty part ('//')");
  url.kind = StateUrl::Kind::kEtcd;
  url.endpoints = std::string(hosts);
  url.prefix = std::string(prefix);
  return url;
}

}  // namespace chorus
