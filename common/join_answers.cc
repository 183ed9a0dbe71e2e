#include "common/join_answers.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

// The fields of a JoinResponse that are the rank's own; everything else is
// the same for every rank of the generation.
void KeepOwn(const v1::JoinResponse& full, v1::JoinResponse& own) {
  own.set_rank(full.rank());
  own.set_generation(full.generation());
  own.set_local_rank(full.local_rank());
  own.set_local_world_size(full.local_world_size());
  own.set_group_rank(full.group_rank());
  own.set_leave(full.leave());
}

const v1::RankJoinAnswers::Shared* FindShared(const v1::RankJoinAnswers& answers,
                                              const std::string& job_id, int64_t generation) {
  // Newest first: an agent's answers of one moment are for a job or two.
  for (int i = answers.shared_size() - 1; i >= 0; --i) {
    const v1::RankJoinAnswers::Shared& shared = answers.shared(i);
    if (shared.job_id() == job_id && shared.response().generation() == generation) return &shared;
  }
  return nullptr;
}

}  // namespace

void AddJoinAnswer(const std::string& job_id, int slot, int64_t asked_generation,
                   absl::StatusOr<v1::JoinResponse> answer, v1::RankJoinAnswers& answers) {
  v1::RankJoinAnswers::Entry& entry = *answers.add_entries();
  entry.set_job_id(job_id);
  entry.set_slot(slot);
  entry.set_asked_generation(asked_generation);
  if (!answer.ok()) {
    entry.set_code(static_cast<int>(answer.status().code()));
    entry.set_message(std::string(answer.status().message()));
    return;
  }
  KeepOwn(*answer, *entry.mutable_response());
  // A `leave` answer carries nothing to share (only its generation).
  if (answer->leave() || FindShared(answers, job_id, answer->generation()) != nullptr) return;
  v1::RankJoinAnswers::Shared& shared = *answers.add_shared();
  shared.set_job_id(job_id);
  v1::JoinResponse& common = *shared.mutable_response();
  common = *std::move(answer);
  common.clear_rank();
  common.clear_local_rank();
  common.clear_local_world_size();
  common.clear_group_rank();
  common.clear_leave();
}

absl::StatusOr<v1::JoinResponse> JoinAnswerFor(const v1::RankJoinAnswers& answers,
                                               const v1::RankJoinAnswers::Entry& entry) {
  if (entry.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(entry.code()), entry.message());
  }
  const v1::JoinResponse& own = entry.response();
  if (own.leave()) return own;
  const v1::RankJoinAnswers::Shared* shared =
      FindShared(answers, entry.job_id(), own.generation());
  if (shared == nullptr) {
    return absl::DataLossError(absl::StrCat(
        "the coordinator's join answers for job ", entry.job_id(), " lack the part of generation ",
        own.generation(), " every rank shares (slot ", entry.slot(), ")"));
  }
  v1::JoinResponse joined = shared->response();
  joined.MergeFrom(own);
  return joined;
}

}  // namespace chorus
