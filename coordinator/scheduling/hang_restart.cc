#include "coordinator/scheduling/hang_restart.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/hang/hang_detector.h"
#include "coordinator/hang/hang_policy.h"
#include "coordinator/scheduling/job_recovery.h"

namespace chorus {
namespace {

std::string History(const RunningJob& run) {
  if (run.history().empty()) return "";
  return absl::StrCat("; history: ", absl::StrJoin(run.history(), "; "));
}

bool NamesCulprit(const v1::Diagnosis& d) {
  return d.kind() == v1::Diagnosis::DEAD || d.kind() == v1::Diagnosis::NEVER_JOINED;
}

// Whether `rank` may be evicted: not evicted already, not exited.
bool Evictable(const RunningJob& run, int rank) {
  if (rank < 0 || rank >= static_cast<int>(run.ranks().size())) return false;
  const RankState& r = run.ranks()[rank];
  return r.evicted.empty() && r.state != v1::RankStatus::EXITED;
}

}  // namespace

HangRestart PlanHangRestart(const RunningJob& run, const std::vector<v1::Diagnosis>& diagnoses,
                            absl::Time now) {
  HangRestart restart;
  if (std::any_of(diagnoses.begin(), diagnoses.end(), NamesCulprit)) {
    restart.kind = HangRestart::kEvict;
    for (const v1::Diagnosis& d : diagnoses) {
      if (!NamesCulprit(d)) continue;
      for (int rank : d.ranks()) {
        const bool listed = std::any_of(restart.evictions.begin(), restart.evictions.end(),
                                        [&](const Eviction& e) { return e.rank == rank; });
        if (!Evictable(run, rank) || listed) continue;
        restart.evictions.push_back(
            Eviction{rank, absl::StrCat(v1::Diagnosis::Kind_Name(d.kind()), " ", d.message()),
                     "hang_detection.action RESTART"});
      }
    }
    return restart;
  }
  auto hung = std::find_if(diagnoses.begin(), diagnoses.end(), [](const v1::Diagnosis& d) {
    return d.kind() == v1::Diagnosis::MISMATCH || d.kind() == v1::Diagnosis::STUCK_IN_COLLECTIVE;
  });
  if (hung == diagnoses.end()) return restart;
  // Note [Hang restart]: when to wait.
  restart.kind = HangRestart::kWait;
  if (!run.Formed() || run.recovering_until() != absl::InfinitePast()) return restart;
  for (const RankState& r : run.ranks()) {
    if (r.state == v1::RankStatus::EXITED) continue;
    if (!r.evicted.empty() || now - r.heartbeat_at > kRankSilentAfter) return restart;
  }
  restart.kind = HangRestart::kRestart;
  restart.cause = absl::StrCat("hang_detection.action RESTART for ", DiagnosisKey(*hung),
                               " (every rank re-forms its transport): ", hung->message());
  return restart;
}

std::vector<Eviction> SilentJoiners(const RunningJob& run, absl::Time now) {
  std::vector<Eviction> silent;
  if (!run.elastic || run.phase().forming() == nullptr || run.Formed()) return silent;
  const absl::Duration silent_after = absl::Seconds(run.hang_detection.dead_after_seconds());
  for (int rank = 0; rank < static_cast<int>(run.ranks().size()); ++rank) {
    const RankState& r = run.ranks()[rank];
    if (run.rendezvous().joined(rank) || r.heard_at == absl::InfinitePast() ||
        now - r.heard_at <= silent_after || !Evictable(run, rank)) {
      continue;
    }
    silent.push_back(Eviction{
        rank,
        absl::StrFormat("rank %d has not joined generation %d and its process has sent no "
                        "heartbeat for %.1f s (hang_detection.dead_after_seconds %g): it is "
                        "stopped or not responding",
                        rank, run.generation(), absl::ToDoubleSeconds(now - r.heard_at),
                        run.hang_detection.dead_after_seconds()),
        "the forming generation"});
  }
  return silent;
}

std::optional<std::string> ReformOverdue(const RunningJob& run, absl::Time now) {
  if (const ElasticPhase::Restarting* restarting = run.phase().restarting()) {
    if (now < restarting->deadline) return std::nullopt;
    std::vector<int> running;
    for (size_t rank = 0; rank < run.ranks().size(); ++rank) {
      if (run.ranks()[rank].state != v1::RankStatus::EXITED)
        running.push_back(static_cast<int>(rank));
    }
    return absl::StrCat(restarting->cause, "; restart-all: rank(s) ", absl::StrJoin(running, ","),
                        " of generation ", run.generation(),
                        " did not exit within elastic.wait_seconds ",
                        run.elastic_spec.wait_seconds(), " s of being stopped", History(run));
  }
  // The generation forming, or the one still forming while the job waits
  // for slots (Note [Elastic phase]).
  const ElasticPhase::Forming* forming = run.phase().forming();
  if (const ElasticPhase::Waiting* wait = run.phase().waiting(); wait != nullptr) {
    forming = wait->unformed.has_value() ? &*wait->unformed : nullptr;
  }
  if (forming == nullptr || forming->deadline > now || run.Formed()) return std::nullopt;
  std::vector<int> missing;
  for (int rank = 0; rank < run.rendezvous().world_size(); ++rank) {
    if (!run.rendezvous().joined(rank)) missing.push_back(rank);
  }
  return absl::StrCat("generation ", run.generation(), " did not form within elastic.wait_seconds ",
                      run.elastic_spec.wait_seconds(),
                      " s; ranks that have not joined: ", absl::StrJoin(missing, ","),
                      History(run));
}

JobActions Evict(RunningJob& run, const std::string& job_id, const Eviction& e,
                 const AgentRegistry& agents) {
  const RankState& r = run.ranks()[e.rank];
  if (agents.Find(r.agent_id) == nullptr) return {};
  if (!run.MarkEvicted(e.rank, absl::StrCat(e.by, ": ", e.why))) return {};
  v1::CoordinatorMessage stop =
      StopRanksMessage(job_id, {r.slot}, absl::StrCat("evicted by ", r.evicted));
  stop.mutable_stop()->set_grace_seconds(1);
  JobActions actions;
  actions.messages.emplace_back(r.agent_id, std::move(stop));
  actions.events.push_back(absl::StrCat("evicting rank ", e.rank, " (", e.by, "): ", e.why));
  return actions;
}

DeadlineCheck CheckDeadlines(RunningJob& run, absl::Time now) {
  DeadlineCheck check;
  check.fail = ReformOverdue(run, now);
  if (check.fail.has_value()) return check;
  check.evictions = SilentJoiners(run, now);
  RecoveryProgress progress = CheckRecovery(run, now);
  if (progress.all_back) {
    check.event = std::move(progress.back);
  } else if (!progress.failure.empty() && run.elastic && !run.wait_cause().after_restart) {
    check.give_up_lost_agents = true;
  } else if (!progress.failure.empty()) {
    check.fail = std::move(progress.failure);
  }
  return check;
}

DiagnosisCheck CheckDiagnoses(const RunningJob& run, const std::vector<v1::Diagnosis>& diagnoses,
                              absl::Time now) {
  DiagnosisCheck check;
  // Waiting below resources.min_ranks: the lost ranks are known. Every
  // rank stopping for a restart-all: the next generation starts anew.
  if (run.phase().waiting() != nullptr || run.phase().restarting() != nullptr) return check;
  if (run.elastic && run.hang_detection.action() == v1::HangDetectionSpec::RESTART) {
    HangRestart restart = PlanHangRestart(run, diagnoses, now);
    check.evictions = std::move(restart.evictions);
    if (restart.kind == HangRestart::kRestart) check.restart = std::move(restart.cause);
    if (restart.kind != HangRestart::kNone) return check;
  }
  check.fail = HangFailure(run.hang_detection.action(), diagnoses);
  return check;
}

}  // namespace chorus
