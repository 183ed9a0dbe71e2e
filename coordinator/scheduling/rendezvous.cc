#include "coordinator/scheduling/rendezvous.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace chorus {

Rendezvous::Rendezvous(std::string job_id, int64_t generation, int world_size)
    : job_id_(std::move(job_id)), generation_(generation), ranks_(std::max(0, world_size)) {}

absl::Status Rendezvous::CheckGeneration(int64_t generation) const {
  if (generation == generation_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("generation ", generation, " of job ", job_id_,
                                                    " is stale; the current generation is ",
                                                    generation_));
}

void Rendezvous::MarkJoined(int rank) {
  Rank& r = ranks_.at(rank);
  if (!r.joined) ++joined_;
  r.joined = true;
}

bool Rendezvous::Join(int rank, absl::Time deadline, Done done, const Respond& respond,
                      Answers& out) {
  Rank& r = ranks_.at(rank);
  if (r.pending) {  // a retry replaces the earlier call
    out.emplace_back(std::move(r.pending),
                     absl::AbortedError("superseded by a newer Join of the same rank"));
  }
  if (!r.joined) ++joined_;
  r.joined = true;
  r.pending = std::move(done);
  r.deadline = deadline;
  if (!complete()) return false;
  for (size_t each = 0; each < ranks_.size(); ++each) {
    v1::JoinResponse response = respond(static_cast<int>(each));
    if (ranks_[each].pending)
      out.emplace_back(std::move(ranks_[each].pending), std::move(response));
    ranks_[each].pending = nullptr;
  }
  return true;
}

void Rendezvous::Expire(absl::Time now, Answers& out) {
  std::string missing;  // computed once, for the first join that expires
  for (Rank& r : ranks_) {
    if (!r.pending || r.deadline > now) continue;
    if (missing.empty()) missing = MissingRanks();
    out.emplace_back(std::move(r.pending), absl::DeadlineExceededError(absl::StrCat(
                                               "generation ", generation_, " of job ", job_id_,
                                               " did not complete in time; ranks that have not "
                                               "joined: ",
                                               missing)));
    r.pending = nullptr;
    r.joined = false;
    --joined_;
  }
}

std::string Rendezvous::MissingRanks() const {
  std::vector<int> missing;
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    if (!ranks_[rank].joined) missing.push_back(static_cast<int>(rank));
  }
  return absl::StrJoin(missing, ",");
}

void Rendezvous::Abort(const absl::Status& status, Answers& out) {
  for (Rank& r : ranks_) {
    if (r.pending) out.emplace_back(std::move(r.pending), status);
    r.pending = nullptr;
  }
}

}  // namespace chorus
