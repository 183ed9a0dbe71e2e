// StateUrl: where a coordinator keeps its durable state, from --state.
//
//   (empty)                                 SQLite in --state_dir (the default)
//   etcd://HOST:PORT[,HOST:PORT...]/PREFIX  etcd, every key under PREFIX
//
// Example:
//   ASSIGN_OR_RETURN(StateUrl url, ParseStateUrl("etcd://10.0.0.1:2379,10.0.0.2:2379/chorus"));
//   // url.kind == StateUrl::Kind::kEtcd, url.endpoints == "10.0.0.1:2379,10.0.0.2:2379",
//   // url.prefix == "/chorus"
#ifndef CHORUS_COORDINATOR_ETCD_STATE_URL_H_
#define CHORUS_COORDINATOR_ETCD_STATE_URL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace chorus {

struct StateUrl {
  enum class Kind { kSqlite, kEtcd };
  Kind kind = Kind::kSqlite;
  std::string endpoints;  // kEtcd: "HOST:PORT,HOST:PORT"
  std::string prefix;     // kEtcd: "/NAME[/NAME...]", no trailing '/'
};

// INVALID_ARGUMENT quoting `flag` and saying what is expected: an unknown
// scheme, no endpoint, an endpoint without a port, no prefix, an empty path
// segment ("//") or a trailing '/'.
absl::StatusOr<StateUrl> ParseStateUrl(absl::string_view flag);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_ETCD_STATE_URL_H_
