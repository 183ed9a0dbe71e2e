// Rendezvous: one generation of a job's ranks coming together.
//
// Every rank of the generation calls Join; the calls wait, and the one that
// completes the generation answers them all at once (each with its own
// JoinResponse). A join whose deadline passes before that fails at the next
// Expire with DEADLINE_EXCEEDED naming the ranks that have not joined, and
// that rank must join again. A join for another generation is refused
// (FAILED_PRECONDITION naming the current one): elastic re-formation starts a
// new generation and the ranks of the old one must not mix with it.
//
// The answers are not delivered here: they are appended to an `Answers` list
// that the caller delivers once it has released its own lock.
//
// Thread-safety: none; the Scheduler holds its lock around every call.
//
// Example:
//   Rendezvous rendezvous("job-000001", /*generation=*/1, /*world_size=*/2);
//   Rendezvous::Answers answers;
//   rendezvous.Join(0, deadline, done0, respond, answers);   // waits
//   rendezvous.Join(1, deadline, done1, respond, answers);   // answers both
//   for (auto& [done, result] : answers) done(std::move(result));
#ifndef CHORUS_COORDINATOR_SCHEDULING_RENDEZVOUS_H_
#define CHORUS_COORDINATOR_SCHEDULING_RENDEZVOUS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"

namespace chorus {

// Note [Rendezvous is O(ranks)]
// A join that does not complete its generation touches its own rank only. What
// the answers need (the job's spec, the agents' numbering) is read once, by the
// join that completes the generation, and the elastic record is written then,
// in one commit; before, every join copied the job (its placements included:
// O(ranks)) and serialized the elastic record, 4x the 4,096-rank rendezvous.

class Rendezvous {
 public:
  using Done = std::function<void(absl::StatusOr<v1::JoinResponse>)>;
  // Join results to deliver once the caller's lock is released.
  using Answers = std::vector<std::pair<Done, absl::StatusOr<v1::JoinResponse>>>;
  // What rank `rank` is told when the generation is complete.
  using Respond = std::function<v1::JoinResponse(int rank)>;

  Rendezvous(std::string job_id, int64_t generation, int world_size);

  int64_t generation() const { return generation_; }
  int world_size() const { return static_cast<int>(ranks_.size()); }
  bool joined(int rank) const { return ranks_.at(rank).joined; }
  // Whether every rank has joined.
  bool complete() const { return joined_ == world_size(); }

  // OK for the current generation; FAILED_PRECONDITION for any other.
  absl::Status CheckGeneration(int64_t generation) const;

  // Counts `rank` as joined without a call to answer: a rank taken back
  // after a coordinator restart joined before it.
  void MarkJoined(int rank);

  // `rank` joins and waits until `deadline`; a pending join of the same rank
  // is superseded (ABORTED). When this join completes the generation, every
  // waiting join is answered with respond(rank) and Join returns true.
  // REQUIRES: 0 <= rank < world_size().
  bool Join(int rank, absl::Time deadline, Done done, const Respond& respond, Answers& out);

  // Fails the joins whose deadline is at or before `now`.
  void Expire(absl::Time now, Answers& out);

  // Fails every waiting join with `status` (the job ended).
  void Abort(const absl::Status& status, Answers& out);

 private:
  // The ranks that have not joined, as "3,7".
  std::string MissingRanks() const;

  struct Rank {
    bool joined = false;
    Done pending;  // the join waiting for the others
    absl::Time deadline;
  };

  std::string job_id_;
  int64_t generation_;
  std::vector<Rank> ranks_;  // index = rank
  int joined_ = 0;           // ranks_ with `joined` set: completion is O(1) to check
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_RENDEZVOUS_H_
