// SessionEnvironment: what a program started by Chorus as a `program` job
// learns from its environment — who it is (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, as torchrun sets them), which job and generation it
// belongs to, where the coordinator and the job's store are, the end of the
// progress channel it inherited, and the coordinator's whole JoinResponse
// (the job spec, the checkpoint to resume from) read from CHORUS_JOIN_FILE.
// The supervising chorus-rank sets all of it (docs/sdk.md lists the
// variables).
//
// Thread-safety: ReadSessionEnvironment calls `lookup` from the calling
// thread only; the result is plain data.
//
// Example:
//   ASSIGN_OR_RETURN(SessionEnvironment env, ReadSessionEnvironment(ProcessEnvironment()));
//   std::cout << "rank " << env.rank << " of " << env.world_size << "\n";
#ifndef CHORUS_SDK_ENVIRONMENT_H_
#define CHORUS_SDK_ENVIRONMENT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "chorus/v1/coordinator.pb.h"

namespace chorus {

struct SessionEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int64_t generation = 0;
  std::string job_id;
  std::string coordinator;      // HOST:PORT
  std::string store_namespace;  // the job's and generation's store keys
  std::string rank_host;        // where this rank's Gloo transport binds
  int progress_fd = -1;         // -1: no progress channel
  v1::JoinResponse joined;      // spec, resume manifest, ...
  // Who the coordinator knows this rank as, for joining later generations of
  // an elastic job (optional: empty / -1 / 0 when unset): CHORUS_AGENT_ID,
  // CHORUS_SLOT, and CHORUS_RANK_PID, the supervising chorus-rank's pid.
  std::string agent_id;
  int slot = -1;
  int64_t rank_pid = 0;
};

// Returns the value of an environment variable, or nullopt when unset.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process's own environment (getenv).
EnvironmentLookup ProcessEnvironment();

// Reads and checks every variable. FAILED_PRECONDITION naming the first
// variable that is missing (and how to run the program under Chorus);
// INVALID_ARGUMENT naming a variable that is not a number in range or that
// disagrees with the join file; NOT_FOUND / DATA_LOSS naming the join file
// when it cannot be read or parsed.
absl::StatusOr<SessionEnvironment> ReadSessionEnvironment(const EnvironmentLookup& lookup);

}  // namespace chorus

#endif  // CHORUS_SDK_ENVIRONMENT_H_
