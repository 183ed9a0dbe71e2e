#include "coordinator/scheduling/reform_plan.h"

#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace chorus {
namespace {

std::string History(const ReformJob& job) {
  if (job.history == nullptr || job.history->empty()) return "";
  return absl::StrCat("; history: ", absl::StrJoin(*job.history, "; "));
}

}  // namespace

std::optional<std::string> RestartsUsedUp(const ReformJob& job) {
  if (!IsFailure(job.kind) || job.restarts < job.max_restarts) return std::nullopt;
  return absl::StrCat(job.cause, "; elastic.max_restarts ", job.max_restarts,
                      " used up in generation ", job.generation, History(job));
}

ReformDecision PlanReform(const ReformJob& job, const std::vector<AgentSlots>& free,
                          const QueuedJob& spec, absl::Time now) {
  if (std::optional<std::string> reason = RestartsUsedUp(job)) {
    return {ReformDecision::Fail{*std::move(reason)}};
  }
  absl::StatusOr<NextGeneration> full = PlanNextGeneration(job.ranks, job.lost, free, spec);
  if (full.ok()) {
    // Note [Staged growth]: after a failure, the survivors alone while they
    // are at least resources.min_ranks; the newcomers come in a growth.
    if (full->newcomers() > 0 && IsFailure(job.kind) && job.stages_replacements) {
      absl::StatusOr<NextGeneration> survivors = PlanNextGeneration(job.ranks, job.lost, {}, spec);
      if (survivors.ok()) return {ReformDecision::Form{*std::move(survivors), true}};
    }
    return {ReformDecision::Form{*std::move(full), false}};
  }
  const std::string why(full.status().message());
  if (!job.waiting_until.has_value()) {
    return {ReformDecision::Wait{now + absl::Seconds(job.wait_seconds), true, why}};
  }
  if (now < *job.waiting_until) return {ReformDecision::Wait{*job.waiting_until, false, why}};
  return {ReformDecision::Fail{absl::StrCat(job.cause, "; generation ", job.generation + 1,
                                            " cannot form: waited elastic.wait_seconds ",
                                            job.wait_seconds, " s and ", why, History(job))}};
}

}  // namespace chorus
