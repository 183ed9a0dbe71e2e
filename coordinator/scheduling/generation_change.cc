#include "coordinator/scheduling/generation_change.h"

#include <algorithm>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "coordinator/scheduling/generation_plan.h"
#include "coordinator/scheduling/reform_plan.h"

namespace chorus {
namespace {

// `run` as PlanReform sees it after `cause` of `kind`, without its ranks:
// the caller that plans adds them (O(ranks)).
ReformJob ReformJobOf(const RunningJob& run, const std::string& cause, ReformKind kind) {
  ReformJob job;
  job.cause = cause;
  job.kind = kind;
  job.generation = run.generation();
  job.restarts = run.restarts();
  job.max_restarts = run.elastic_spec.max_restarts();
  job.wait_seconds = run.elastic_spec.wait_seconds();
  job.stages_replacements = run.program && !run.RestartsAll();
  if (const ElasticPhase::Waiting* wait = run.phase().waiting()) job.waiting_until = wait->until;
  job.history = &run.history();
  return job;
}

// Who leaves at a change: ranks that exited (their slots are free for
// newcomers), ranks whose agent is gone, and ranks on a draining agent or
// preempted (they leave at this step boundary and exit by themselves: their
// slots stay busy until their exit is reported, so they go to `leaving`).
std::vector<bool> LostRanks(const RunningJob& run, AgentRegistry& agents,
                            std::vector<std::pair<std::string, int>>& leaving) {
  const std::vector<RunningJob::Fate> fates = run.Fates(agents);
  std::vector<bool> lost(run.ranks().size(), false);
  for (size_t rank = 0; rank < run.ranks().size(); ++rank) {
    const RankState& r = run.ranks()[rank];
    lost[rank] = fates[rank] != RunningJob::Fate::kStays;
    if (fates[rank] == RunningJob::Fate::kExited && agents.Find(r.agent_id) != nullptr) {
      agents.SetBusy(r.agent_id, r.slot, false);
    } else if (fates[rank] == RunningJob::Fate::kLeavesAtBoundary) {
      leaving.emplace_back(r.agent_id, r.slot);
    }
  }
  return lost;
}

// The ranks of the next generation: survivors keep their state (and join
// by themselves), newcomers take their slots; `newcomers` describes who is
// new or renumbered.
std::vector<RankState> NextRanks(const RunningJob& run, const NextGeneration& next,
                                 AgentRegistry& agents, std::vector<std::string>& newcomers) {
  std::vector<RankState> ranks;
  for (size_t rank = 0; rank < next.ranks.size(); ++rank) {
    const int old = next.old_rank[rank];
    RankState r = old >= 0 ? run.ranks()[old] : RankState::At(next.ranks[rank]);
    r.local_rank = next.ranks[rank].local_rank;
    r.local_world_size = next.ranks[rank].local_world_size;
    // Heartbeats of the old generation say nothing about the new one.
    r.heartbeat_at = absl::InfinitePast();
    r.last_heartbeat.Clear();
    r.finished = false;  // RunningJob::finished_before_reform() keeps that it did
    r.state = old >= 0 ? v1::RankStatus::JOINING : v1::RankStatus::LAUNCHING;
    if (old < 0) {
      agents.SetBusy(r.agent_id, r.slot, true);
      const AgentRegistry::Agent* agent = agents.Find(r.agent_id);
      newcomers.push_back(absl::StrCat("rank ", rank, " on ",
                                       agent != nullptr ? agent->hello.host() : r.agent_id,
                                       " slot ", r.slot));
    } else if (old != static_cast<int>(rank)) {
      newcomers.push_back(absl::StrCat("rank ", old, " is now rank ", rank));
    }
    ranks.push_back(std::move(r));
  }
  return ranks;
}

// The history line of a change to `world` ranks in `generation`.
std::string DescribeChange(const RunningJob& run, const v1::JobSpec& spec, int64_t generation,
                           int old_world, int world, const std::string& cause, bool failure,
                           const std::vector<std::string>& newcomers) {
  // Note [Hot spares] in sdk/decentralized_data_parallel.h.
  const absl::StatusOr<int> training = TrainingRanks(spec, world);
  const std::string spares =
      training.ok() && *training < world
          ? absl::StrCat(", ", *training, " training and ", world - *training, " hot spare",
                         world - *training == 1 ? "" : "s")
          : "";
  const bool all_new =
      world > 0 && static_cast<int>(newcomers.size()) == world && run.RestartsAll();
  return absl::StrCat(
      "generation ", generation, " after ", cause, ": ", old_world, " -> ", world, " ranks", spares,
      all_new             ? " (restart-all: every rank started again)"
      : newcomers.empty() ? ""
                          : absl::StrCat(" (", ListNewcomers(newcomers), ")"),
      failure ? absl::StrCat(", restart ", run.restarts(), " of ", run.elastic_spec.max_restarts())
              : ", at a step boundary (not a restart)");
}

// Note [Restart-all] in running_job.h: whether every rank of `run` has
// stopped, so that the next generation may start. The first call has the
// live ranks stopped (into `change`) and puts run.phase() in Restarting with
// the change (`cause`, `kind`); later calls (the stopped ranks' exits, lost
// agents, other changes meanwhile) keep it, a failure replacing a planned
// change. Once none is live, `cause` and `kind` are set to the change to
// make (the phase stays Restarting until the next generation forms or the
// job waits).
bool StopAllForRestart(RunningJob& run, std::string& cause, ReformKind& kind,
                       const ChangeInputs& in, GenerationChange& change) {
  // Live: not exited, on a connected agent or awaited after a coordinator
  // restart (it may still run there).
  std::map<std::string, std::vector<int>> live;  // slots by agent id
  int awaited = 0;
  for (const RankState& r : run.ranks()) {
    if (r.state == v1::RankStatus::EXITED) continue;
    if (r.agent_id.empty()) {
      ++awaited;
    } else if (in.agents.Find(r.agent_id) != nullptr) {
      live[r.agent_id].push_back(r.slot);
    }
  }
  if (ElasticPhase::Restarting* restarting = run.mutable_phase().restarting()) {
    if (IsFailure(kind) && !IsFailure(restarting->kind)) {
      restarting->cause = cause;
      restarting->kind = kind;
    }
    if (!live.empty() || awaited > 0) return false;
    cause = restarting->cause;
    kind = restarting->kind;
    return true;
  }
  if (live.empty() && awaited == 0) return true;
  run.mutable_phase().BeginRestarting(cause, kind, in.now,
                                      in.now + absl::Seconds(run.elastic_spec.wait_seconds()));
  const std::string why =
      absl::StrCat("restart-all for generation ", run.generation() + 1, " after ", cause);
  // Joins waiting for a generation that will not form are answered now.
  run.mutable_rendezvous().Abort(
      absl::AbortedError(absl::StrCat("job ", in.job.job_id(), ": ", why)), change.joins);
  const int stopping = run.MarkStopping();
  change.stop = std::move(live);
  change.stop_reason = why;
  change.events.push_back(absl::StrCat(why, ": stopping the ", stopping,
                                       " running rank(s) (the program does not re-form in its ",
                                       "own process); every rank starts again once they have "
                                       "exited"));
  return false;
}

// The next generation with form.next: survivors keep their state, staged
// newcomers are adopted, newcomers are LAUNCHING; `leaving` depart.
void Form(RunningJob& run, const std::string& cause, ReformKind kind,
          const ReformDecision::Form& form, const std::vector<std::pair<std::string, int>>& leaving,
          const ChangeInputs& in, GenerationChange& change) {
  const NextGeneration& next = form.next;
  const bool failure = IsFailure(kind);
  const int64_t old_generation = run.generation();
  const int old_world = static_cast<int>(run.ranks().size());
  const int64_t generation = old_generation + 1;
  const int world = static_cast<int>(next.ranks.size());
  run.mutable_rendezvous().Abort(
      absl::AbortedError(absl::StrCat("generation ", old_generation, " of job ", in.job.job_id(),
                                      " was superseded by generation ", generation, ": ", cause)),
      change.joins);
  std::vector<std::string> newcomers;
  std::vector<RankState> ranks = NextRanks(run, next, in.agents, newcomers);
  // Note [Staged growth] in staged_growth.h: newcomers already running
  // join; they are not launched again.
  StagedGrowth::Actions staged = run.mutable_staged().OnGenerationBegun(next.ranks);
  for (const auto& [agent_id, slot] : staged.adopted) {
    for (RankState& r : ranks) {
      if (r.agent_id == agent_id && r.slot == slot) r.state = v1::RankStatus::JOINING;
    }
  }
  // Note [Staged growth]: a survivors-only generation owes its replacements.
  run.CountChange(failure, world > old_world, form.replacements_owed, in.now);
  std::string line =
      DescribeChange(run, in.job.spec(), generation, old_world, world, cause, failure, newcomers);
  run.AddHistory(line);
  run.mutable_leaving().OnGenerationBegun(leaving);
  std::vector<int> rank_of_survivor(old_world, -1);
  for (int rank = 0; rank < world; ++rank) {
    const int old = next.old_rank[rank];
    if (old >= 0 && old < old_world) rank_of_survivor[old] = rank;
  }
  run.BeginGeneration(in.job, std::move(ranks), generation, kind, in.now,
                      std::move(rank_of_survivor));
  change.begun =
      GenerationChange::Begun{generation, world, kind, std::move(line), std::move(staged)};
}

}  // namespace

GenerationChange ChangeGeneration(RunningJob& run, const std::string& cause_heard,
                                  ReformKind kind_heard, const ChangeInputs& in) {
  GenerationChange change;
  std::string cause = cause_heard;
  ReformKind kind = kind_heard;
  // Before a restart-all stops any rank: a failure past max_restarts fails
  // the job at once.
  if (std::optional<std::string> reason = RestartsUsedUp(ReformJobOf(run, cause, kind))) {
    change.fail = std::move(reason);
    return change;
  }
  // Note [Restart-all]: the next generation starts once every rank stopped.
  if ((run.RestartsAll() || run.phase().restarting() != nullptr) &&
      !StopAllForRestart(run, cause, kind, in, change)) {
    return change;
  }
  std::vector<std::pair<std::string, int>> leaving;
  ReformJob planned = ReformJobOf(run, cause, kind);
  planned.ranks = run.Slots();
  planned.lost = LostRanks(run, in.agents, leaving);
  ReformDecision decision = PlanReform(planned, in.free_slots(), in.capped(), in.now);
  if (auto* fail = std::get_if<ReformDecision::Fail>(&decision.verdict)) {
    change.fail = fail->reason;
  } else if (auto* wait = std::get_if<ReformDecision::Wait>(&decision.verdict)) {
    // Below resources.min_ranks: wait for slots (an agent that connects, a
    // job that ends) rather than fail at once.
    if (wait->begins) {
      run.mutable_phase().BeginWaiting(cause, kind, in.now, wait->until);
      change.events.push_back(absl::StrCat("generation ", run.generation() + 1, " after ", cause,
                                           " waits up to elastic.wait_seconds ",
                                           run.elastic_spec.wait_seconds(),
                                           " s for free slots: ", wait->why));
    }
  } else {
    Form(run, cause, kind, std::get<ReformDecision::Form>(decision.verdict), leaving, in, change);
  }
  return change;
}

std::optional<int> PlannedWorld(const RunningJob& run, const AgentRegistry& agents,
                                const std::vector<AgentSlots>& free, const QueuedJob& capped) {
  std::vector<bool> lost;
  for (RunningJob::Fate fate : run.Fates(agents)) lost.push_back(fate != RunningJob::Fate::kStays);
  absl::StatusOr<NextGeneration> next = PlanNextGeneration(run.Slots(), lost, free, capped);
  if (!next.ok()) return std::nullopt;
  return static_cast<int>(next->ranks.size());
}

std::optional<std::string> OnGenerationFormed(RunningJob& run, absl::Time now) {
  const std::optional<ElasticPhase::Forming> formed = run.mutable_phase().GenerationFormed();
  if (!formed.has_value()) return std::nullopt;
  const double seconds = absl::ToDoubleSeconds(now - formed->started);
  const bool failure = IsFailure(formed->kind);
  if (failure) run.NoteRecovery(seconds);
  return absl::StrCat(
      "generation ", run.generation(), " formed with ", run.ranks().size(), " ranks, ",
      absl::SixDigits(seconds),
      failure ? " s after the failure (recovery_seconds)" : " s after the step boundary");
}

bool MayGrow(const RunningJob& run, absl::Time now) {
  if (!run.elastic || !run.Steady() || run.staged().active()) return false;
  return run.replacements_owed() ||
         now >= run.last_growth_at() + absl::Seconds(run.elastic_spec.scale_up_interval_seconds());
}

std::optional<Growth> PlanGrowth(const RunningJob& run, int max_ranks,
                                 const std::vector<AgentSlots>& free, const QueuedJob& capped) {
  if (static_cast<int>(run.ranks().size()) >= max_ranks) return std::nullopt;
  absl::StatusOr<NextGeneration> next =
      PlanNextGeneration(run.Slots(), std::vector<bool>(run.ranks().size(), false), free, capped);
  if (!next.ok() || next->newcomers() == 0) return std::nullopt;
  Growth growth;
  growth.cause =
      run.replacements_owed()
          ? absl::StrCat(next->newcomers(), " newcomer(s) replace the rank(s) lost in generation ",
                         run.generation() - 1)
          : absl::StrCat(next->newcomers(), " free slot(s) let the job grow from ",
                         run.ranks().size(), " towards resources.max_ranks ", max_ranks);
  growth.staged = run.program && !run.RestartsAll();
  growth.next = *std::move(next);
  return growth;
}

JobActions StageGrowth(RunningJob& run, const std::string& job_id, const Growth& growth,
                       AgentRegistry& agents, const std::string& coordinator_address,
                       absl::Time now) {
  const int64_t generation = run.generation() + 1;
  const NextGeneration& next = growth.next;
  std::vector<StagedNewcomer> newcomers;
  std::vector<RankSlot> slots;
  std::vector<std::string> where;
  for (size_t rank = 0; rank < next.ranks.size(); ++rank) {
    if (next.old_rank[rank] >= 0) continue;
    const RankSlot& slot = next.ranks[rank];
    agents.SetBusy(slot.agent_id, slot.slot, true);
    newcomers.push_back(StagedNewcomer{slot, static_cast<int>(rank), false});
    slots.push_back(slot);
    where.push_back(absl::StrCat("rank ", rank, " on ", agents.Find(slot.agent_id)->hello.host(),
                                 " slot ", slot.slot));
  }
  JobActions actions;
  for (auto& [agent_id, message] :
       run.LaunchMessages(job_id, coordinator_address, generation, slots)) {
    actions.messages.emplace_back(agent_id, std::move(message));
  }
  run.mutable_staged().Start(generation, static_cast<int>(next.ranks.size()), growth.cause,
                             std::move(newcomers), now,
                             absl::Seconds(run.elastic_spec.wait_seconds()));
  actions.events.push_back(absl::StrCat("generation ", generation, " after ", growth.cause,
                                        ": starting ", absl::StrJoin(where, ", "),
                                        "; the job re-forms at a step boundary once they are up"));
  return actions;
}

JobActions ApplyStaged(RunningJob& run, const std::string& job_id,
                       const StagedGrowth::Actions& staged, AgentRegistry& agents) {
  JobActions actions;
  for (const auto& [agent_id, slot] : staged.freed) {
    agents.SetBusy(agent_id, slot, false);
    actions.logs.push_back(
        absl::StrCat("staged newcomer on slot ", slot, " exited before it joined"));
  }
  for (const auto& [agent_id, slots] : staged.stop) {
    if (agents.Find(agent_id) == nullptr) continue;
    for (int slot : slots) run.mutable_leaving().Depart(agent_id, slot);  // busy until they exit
    actions.messages.emplace_back(agent_id, StopRanksMessage(job_id, slots, staged.stop_reason));
  }
  if (!actions.messages.empty()) actions.logs.push_back(staged.stop_reason);
  return actions;
}

}  // namespace chorus
