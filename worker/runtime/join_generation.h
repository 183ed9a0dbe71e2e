// Joining a generation of a job at the coordinator (RankService.Join), for
// chorus-rank and for SDK programs that re-form an elastic job
// (docs/elastic.md).
//
// Thread-safety: a free function; the stub may be shared.
//
// Example:
//   ASSIGN_OR_RETURN(v1::JoinResponse joined,
//                    JoinGeneration(*stub, request, absl::Now() + absl::Minutes(2),
//                                   /*until_formed=*/true));
#ifndef CHORUS_WORKER_RUNTIME_JOIN_GENERATION_H_
#define CHORUS_WORKER_RUNTIME_JOIN_GENERATION_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"

namespace chorus {

// Joins `request.generation()` before `deadline`. With `until_formed` (an
// elastic job), a generation that has not formed yet (UNAVAILABLE) or that
// another failure superseded (ABORTED) is asked for again every 100 ms.
// Errors keep the coordinator's code and name the generation and job.
absl::StatusOr<v1::JoinResponse> JoinGeneration(v1::RankService::StubInterface& ranks,
                                                const v1::JoinRequest& request, absl::Time deadline,
                                                bool until_formed);

// What the agent told the rank it started, from the environment
// (CHORUS_COORDINATOR, CHORUS_JOB_ID, CHORUS_GENERATION, CHORUS_SLOT,
// CHORUS_AGENT_ID): the coordinator's address and this process's Join
// request (pid and host filled in). FAILED_PRECONDITION saying the process
// is started by chorus-worker when one is missing or malformed.
struct RankLaunch {
  std::string coordinator;
  v1::JoinRequest join;
};
absl::StatusOr<RankLaunch> RankLaunchFromEnvironment();

// The JoinResponse handed from a rank's process to the next one: from
// chorus-rank to the program it supervises (CHORUS_JOIN_FILE) or to
// chorus-trainer (CHORUS_RANK_JOINED). WriteJoinFile creates a new file
// in `dir` (mode 0600) and returns its path; ReadJoinFile parses one, with
// errors naming the file.
absl::StatusOr<std::string> WriteJoinFile(const std::string& dir, const v1::JoinResponse& joined);
absl::StatusOr<v1::JoinResponse> ReadJoinFile(const std::string& path);

}  // namespace chorus

#endif  // CHORUS_WORKER_RUNTIME_JOIN_GENERATION_H_
