// MASTER_ADDR and MASTER_PORT for a `program` job (docs/programs.md), as
// torchrun provides them: rank 0 of each generation picks a free TCP port on
// its host and publishes "host:port" in the generation's store; every other
// rank reads it from there. The supervising chorus-rank does it for the
// ranks it starts; an elastic SDK program that becomes rank 0 of a later
// generation in its own process publishes it itself
// (Session::JoinNextGeneration), so that newcomers find it.
//
// Thread-safety: the functions touch only their arguments.
//
// Example:
//   ASSIGN_OR_RETURN(HostPort master, AgreeMasterAddress(store, rank, rank_host,
//                                                        absl::Now() + absl::Minutes(5)));
#ifndef CHORUS_WORKER_RUNTIME_MASTER_ADDRESS_H_
#define CHORUS_WORKER_RUNTIME_MASTER_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/host_port.h"
#include "worker/comm/store.h"

namespace chorus {

// The store key rank 0 publishes MASTER_ADDR:MASTER_PORT under (in the
// generation's namespace).
inline constexpr char kMasterAddressKey[] = "program/master_address";

// A TCP port that was free on `host` a moment ago: bound with port 0 and
// closed again (as torchrun picks MASTER_PORT). UNAVAILABLE naming the host
// when it cannot bind there.
absl::StatusOr<int> PickFreePort(const std::string& host);

// Rank 0 picks a free port on `host` and publishes "host:port" in `store`;
// every other rank waits for it until `deadline` (DEADLINE_EXCEEDED saying
// rank 0 did not publish it).
absl::StatusOr<HostPort> AgreeMasterAddress(Store& store, int rank, const std::string& host,
                                            absl::Time deadline);

}  // namespace chorus

#endif  // CHORUS_WORKER_RUNTIME_MASTER_ADDRESS_H_
