// The Scheduler's elastic side: a job with spec.elastic lives through lost
// ranks by forming a new generation (docs/elastic.md). Survivors keep their
// slots and processes and join the next generation themselves (their
// communicator fails when a peer dies); newcomers are launched on free slots.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/generation_plan.h"
#include "coordinator/scheduler.h"
#include "glog/logging.h"

namespace chorus {
namespace {

std::string History(const RunningJob& run) {
  if (run.history.empty()) return "";
  return absl::StrCat("; history: ", absl::StrJoin(run.history, "; "));
}

}  // namespace

void Scheduler::ReformLocked(const std::string& job_id, const std::string& cause, Outbox& out) {
  auto it = running_.find(job_id);
  if (it == running_.end()) return;
  RunningJob& run = it->second;
  absl::StatusOr<v1::Job> job = jobs_.Get(job_id);
  if (!job.ok()) return;
  const int64_t old_generation = run.generation();
  const int old_world = static_cast<int>(run.ranks.size());
  if (run.restarts >= run.elastic_spec.max_restarts()) {
    EndLocked(job_id, v1::Job::FAILED,
              absl::StrCat(cause, "; elastic.max_restarts ", run.elastic_spec.max_restarts(),
                           " used up in generation ", old_generation, History(run)),
              out);
    return;
  }
  // The lost ranks' slots are free for newcomers (the process has exited).
  std::vector<bool> lost(run.ranks.size(), false);
  for (size_t rank = 0; rank < run.ranks.size(); ++rank) {
    const RankState& r = run.ranks[rank];
    if (r.state != v1::RankStatus::EXITED) continue;
    lost[rank] = true;
    if (agents_.Find(r.agent_id) != nullptr) agents_.SetBusy(r.agent_id, r.slot, false);
  }
  absl::StatusOr<NextGeneration> next =
      PlanNextGeneration(run.Slots(), lost, agents_.FreeSlots(), ToQueuedJob(job_id, job->spec()));
  if (!next.ok()) {
    EndLocked(job_id, v1::Job::FAILED,
              absl::StrCat(cause, "; generation ", old_generation + 1,
                           " cannot form: ", next.status().message(), History(run)),
              out);
    return;
  }
  const int64_t generation = old_generation + 1;
  const int world = static_cast<int>(next->ranks.size());
  run.rendezvous.Abort(
      absl::AbortedError(absl::StrCat("generation ", old_generation, " of job ", job_id,
                                      " was superseded by generation ", generation, ": ", cause)),
      out.joins);
  std::vector<RankState> ranks;
  std::vector<std::string> newcomers;
  for (int rank = 0; rank < world; ++rank) {
    const int old = next->old_rank[rank];
    RankState r = old >= 0 ? run.ranks[old] : RankState::At(next->ranks[rank]);
    r.local_rank = next->ranks[rank].local_rank;
    r.local_world_size = next->ranks[rank].local_world_size;
    // Heartbeats of the old generation say nothing about the new one.
    r.heartbeat_at = absl::InfinitePast();
    r.last_heartbeat.Clear();
    r.state = old >= 0 ? v1::RankStatus::JOINING : v1::RankStatus::LAUNCHING;
    if (old < 0) {
      agents_.SetBusy(r.agent_id, r.slot, true);
      const AgentRegistry::Agent* agent = agents_.Find(r.agent_id);
      newcomers.push_back(absl::StrCat("rank ", rank, " on ",
                                       agent != nullptr ? agent->hello.host() : r.agent_id,
                                       " slot ", r.slot));
    } else if (old != rank) {
      newcomers.push_back(absl::StrCat("rank ", old, " is now rank ", rank));
    }
    ranks.push_back(std::move(r));
  }
  ++run.restarts;
  const std::string change = absl::StrCat(
      "generation ", generation, " after ", cause, ": ", old_world, " -> ", world, " ranks",
      newcomers.empty() ? "" : absl::StrCat(" (", absl::StrJoin(newcomers, ", "), ")"),
      ", restart ", run.restarts, " of ", run.elastic_spec.max_restarts());
  run.history.push_back(change);
  run.ranks = std::move(ranks);
  run.rendezvous = Rendezvous(job_id, generation, world);
  run.exited_ok = 0;
  run.diagnoses = DiagnosisHistory();
  run.upload_grant = UploadGrantFor(*job, world, generation);
  const absl::Time now = clock_->Now();
  run.reform_started = now;
  run.generation_started_at = now;
  if (metrics_ != nullptr) metrics_->GenerationStarted("rank_lost");
  run.form_deadline = now + absl::Seconds(run.elastic_spec.wait_seconds());
  LOG(INFO) << job_id << ": " << change;
  if (absl::StatusOr<v1::Job> s =
          jobs_.MarkReformed(job_id, generation, world, run.restarts, change);
      !s.ok()) {
    LOG(ERROR) << job_id << ": could not record generation " << generation << ": " << s.status();
  }
  if (absl::Status s = jobs_.SavePlacements(job_id, run.Placements(agents_)); !s.ok()) {
    LOG(ERROR) << job_id << ": could not record placements: " << s;
  }
  for (auto& launch_for : run.LaunchMessages(job_id, coordinator_address_)) {
    // A named reference, not a structured binding: C++17 lambdas cannot
    // capture those (clang refuses).
    const std::string& agent_id = launch_for.first;
    auto& message = launch_for.second;
    // Only newcomers are launched; survivors join by themselves.
    v1::LaunchRanks* launch = message.mutable_launch();
    auto* list = launch->mutable_ranks();
    list->erase(std::remove_if(list->begin(), list->end(),
                               [&](const v1::RankLaunch& l) {
                                 return run.ranks[run.RankOn(agent_id, l.slot())].state !=
                                        v1::RankStatus::LAUNCHING;
                               }),
                list->end());
    if (launch->ranks_size() > 0) {
      out.messages.emplace_back(agents_.Find(agent_id)->send, std::move(message));
    }
  }
}

std::optional<std::string> Scheduler::ReformOverdueLocked(const RunningJob& run,
                                                          absl::Time now) const {
  if (run.form_deadline > now || run.Formed()) return std::nullopt;
  std::vector<int> missing;
  for (int rank = 0; rank < run.rendezvous.world_size(); ++rank) {
    if (!run.rendezvous.joined(rank)) missing.push_back(rank);
  }
  return absl::StrCat("generation ", run.generation(), " did not form within elastic.wait_seconds ",
                      run.elastic_spec.wait_seconds(),
                      " s; ranks that have not joined: ", absl::StrJoin(missing, ","),
                      History(run));
}

bool Scheduler::EvictLocked(const std::string& job_id, RunningJob& run,
                            const std::vector<v1::Diagnosis>& diagnoses, Outbox& out) {
  for (const v1::Diagnosis& d : diagnoses) {
    if (d.kind() == v1::Diagnosis::STRAGGLER || d.kind() == v1::Diagnosis::DEAD ||
        d.kind() == v1::Diagnosis::NEVER_JOINED) {
      continue;
    }
    return false;
  }
  for (const v1::Diagnosis& d : diagnoses) {
    if (d.kind() != v1::Diagnosis::DEAD && d.kind() != v1::Diagnosis::NEVER_JOINED) continue;
    for (int rank : d.ranks()) {
      if (rank < 0 || rank >= static_cast<int>(run.ranks.size())) continue;
      RankState& r = run.ranks[rank];
      if (!r.evicted.empty() || r.state == v1::RankStatus::EXITED) continue;
      const AgentRegistry::Agent* agent = agents_.Find(r.agent_id);
      if (agent == nullptr) continue;
      r.evicted = absl::StrCat(v1::Diagnosis::Kind_Name(d.kind()), " ", d.message());
      LOG(INFO) << job_id << ": evicting rank " << rank << ": " << r.evicted;
      // A stopped (SIGSTOP) process ignores SIGTERM: the agent's SIGKILL
      // after the grace ends it.
      v1::CoordinatorMessage stop = StopRanksMessage(
          job_id, {r.slot}, absl::StrCat("evicted by hang_detection.action RESTART: ", r.evicted));
      stop.mutable_stop()->set_grace_seconds(1);
      out.messages.emplace_back(agent->send, std::move(stop));
      v1::JobEvent event;
      event.set_message(
          absl::StrCat("evicting rank ", rank, " (hang_detection.action RESTART): ", r.evicted));
      (void)jobs_.AddEvent(job_id, std::move(event));
    }
  }
  return true;
}

void Scheduler::NoteFormedLocked(const std::string& job_id, RunningJob& run) {
  if (run.reform_started == absl::InfinitePast()) return;
  const double seconds = absl::ToDoubleSeconds(clock_->Now() - run.reform_started);
  run.recovery_seconds = seconds;
  run.reform_started = absl::InfinitePast();
  run.form_deadline = absl::InfiniteFuture();
  v1::JobEvent event;
  event.set_message(absl::StrCat("generation ", run.generation(), " formed with ", run.ranks.size(),
                                 " ranks, ", absl::SixDigits(seconds),
                                 " s after the failure (recovery_seconds)"));
  if (absl::Status s = jobs_.AddEvent(job_id, std::move(event)); !s.ok()) {
    LOG(ERROR) << job_id << ": could not record the formed generation: " << s;
  }
}

}  // namespace chorus
