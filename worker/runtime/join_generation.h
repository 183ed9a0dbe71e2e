// Joining a generation of a job at the coordinator, for chorus-rank, the
// built-in trainer and SDK programs that re-form an elastic job
// (docs/elastic.md): through the rank's node agent when it takes its ranks'
// joins (Note [Joins gathered by the agent] in worker/agent/agent.cc), else with
// the rank's own RankService.Join.
//
// Thread-safety: JoinGeneration is a free function (the stub may be
// shared); a GenerationJoiner joins for one thread at a time.
//
// Example:
//   GenerationJoiner joiner(*stub, AgentJoinChannel(AgentChannelFromEnvironment()));
//   ASSIGN_OR_RETURN(v1::JoinResponse joined,
//                    joiner.Join(request, absl::Now() + absl::Minutes(2),
//                                /*until_formed=*/true));
#ifndef CHORUS_WORKER_RUNTIME_JOIN_GENERATION_H_
#define CHORUS_WORKER_RUNTIME_JOIN_GENERATION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "worker/runtime/progress_channel.h"

namespace chorus {

// Joins `request.generation()` before `deadline`. An UNAVAILABLE answer is
// asked for again every 100 ms; with `until_formed` (an elastic job), so is a
// generation that another failure superseded (ABORTED). Errors keep the
// coordinator's code and name the generation and job.
//
// Note [A join is asked for again]
// UNAVAILABLE is either the coordinator's own "join again shortly" (the
// generation forms at the members' next step boundary; the job is taking back
// its ranks after a restart or from agents that lost contact) or no coordinator
// answering at all: the leader was killed or froze while the join was on its
// connection, and `wait_for_ready` does not move a call already on a
// connection. Both are asked for again, for the first join of a job as for a
// re-formation's, so a rendezvous in progress completes under the next leader
// (docs/ha.md). What ends a job's joins for good has other codes:
// FAILED_PRECONDITION (the job is not running), NOT_FOUND, PERMISSION_DENIED.
absl::StatusOr<v1::JoinResponse> JoinGeneration(v1::RankService::StubInterface& ranks,
                                                const v1::JoinRequest& request, absl::Time deadline,
                                                bool until_formed);

// Joins as JoinGeneration does, through the agent's channel while it has
// one: the request goes there, and the agent's answer counts as the
// coordinator's (same codes, same retries). Without a channel, or once the
// agent's end is closed, and for an attempt the agent could not carry (its
// stream to the coordinator is down: AgentJoinAnswer.join_directly), the
// join goes to RankService.Join exactly as JoinGeneration's.
class GenerationJoiner {
 public:
  // `agent`: the rank's end of its agent's channel, when the agent takes
  // joins (AgentJoinChannel); null: always directly. `ranks` must outlive
  // this object.
  GenerationJoiner(v1::RankService::StubInterface& ranks, std::shared_ptr<ProgressSender> agent);

  absl::StatusOr<v1::JoinResponse> Join(const v1::JoinRequest& request, absl::Time deadline,
                                        bool until_formed);

  // Attempts the agent answered (for tests and logs).
  int64_t answered_by_agent() const { return answered_by_agent_; }

 private:
  // One attempt through the agent; nullopt when it must go directly.
  std::optional<absl::StatusOr<v1::JoinResponse>> JoinThroughAgent(const v1::JoinRequest& request,
                                                                   absl::Time deadline);

  v1::RankService::StubInterface& ranks_;
  std::shared_ptr<ProgressSender> agent_;
  int64_t answered_by_agent_ = 0;
};

// `channel` when the agent that started this process takes its ranks'
// joins (it sets CHORUS_AGENT_JOINS=1); null otherwise (an older agent).
std::shared_ptr<ProgressSender> AgentJoinChannel(std::shared_ptr<ProgressSender> channel);

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
