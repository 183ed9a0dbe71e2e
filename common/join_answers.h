// Join answers sent through a node agent (v1::RankJoinAnswers): what the
// coordinator puts in one message for an agent's ranks, and what the agent
// (or a simulated one) takes out of it for each rank. The parts of a
// JoinResponse that every rank of a generation shares (spec, resume, store
// namespace, world size, restarts, number of agents) travel once per job
// and generation; each rank's entry holds only what is its own (Note [Joins
// through the agent] in coordinator/scheduling/agent_join_outbox.h).
//
// Thread-safety: free functions over the caller's messages.
//
// Example:
//   v1::RankJoinAnswers answers;
//   AddJoinAnswer("job-000001", /*slot=*/3, /*asked_generation=*/2, response, answers);
//   for (const auto& entry : answers.entries()) {
//     absl::StatusOr<v1::JoinResponse> joined = JoinAnswerFor(answers, entry);
//   }
#ifndef CHORUS_COMMON_JOIN_ANSWERS_H_
#define CHORUS_COMMON_JOIN_ANSWERS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "chorus/v1/coordinator.pb.h"

namespace chorus {

// Appends the answer to the join of `slot` of `job_id` for
// `asked_generation` to `answers`: an error as its code and message; a
// response as the rank's own part in the entry, and its shared part in
// answers.shared unless that job and generation's is already there (the
// first one found wins: the coordinator gives every rank of a generation
// the same).
void AddJoinAnswer(const std::string& job_id, int slot, int64_t asked_generation,
                   absl::StatusOr<v1::JoinResponse> answer, v1::RankJoinAnswers& answers);

// The answer `entry` of `answers` gives its rank: the error, or the rank's
// JoinResponse whole (its job and generation's shared part with the entry's
// own). DATA_LOSS naming the job and generation when `answers` lacks the
// shared part of a successful entry (only a broken sender makes one).
absl::StatusOr<v1::JoinResponse> JoinAnswerFor(const v1::RankJoinAnswers& answers,
                                               const v1::RankJoinAnswers::Entry& entry);

}  // namespace chorus

#endif  // CHORUS_COMMON_JOIN_ANSWERS_H_
