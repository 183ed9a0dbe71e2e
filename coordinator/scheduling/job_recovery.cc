#include "coordinator/scheduling/job_recovery.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace chorus {

namespace {

absl::Time TimeOf(int64_t unix_us) { return absl::FromUnixMicros(unix_us); }

// A saved kind this coordinator does not know (a record of a newer one) is
// taken for a planned change: it does not count as a restart.
ReformKind KindOf(const std::string& name) {
  return ParseReformKind(name).value_or(ReformKind::kScaleUp);
}

// The phase `record` saved (Note [Elastic phase] in elastic_state.h). A
// record always has reform_started_us beside a forming, waiting or
// restart-all part; without one, the change counts from its deadline.
ElasticPhase RestoredPhase(const coordinator::ElasticRecord& record) {
  std::optional<ElasticPhase::Planned> planned;
  if (record.has_planned()) {
    planned = ElasticPhase::Planned{record.planned().cause(), KindOf(record.planned().kind()),
                                    std::nullopt};
    if (record.planned().world() > 0) planned->world = record.planned().world();
  }
  const auto started = [&](int64_t deadline_us) {
    return TimeOf(record.has_reform_started_us() ? record.reform_started_us() : deadline_us);
  };
  std::optional<ElasticPhase::Forming> forming;
  if (record.has_forming()) {
    forming = ElasticPhase::Forming{KindOf(record.forming().kind()),
                                    started(record.forming().deadline_us()),
                                    TimeOf(record.forming().deadline_us())};
  }
  if (record.has_restart_all()) {
    const coordinator::ElasticRecord::RestartAll& r = record.restart_all();
    return ElasticPhase(ElasticPhase::Restarting{r.cause(), KindOf(r.kind()),
                                                 started(r.deadline_us()), TimeOf(r.deadline_us())},
                        std::move(planned));
  }
  if (record.has_waiting()) {
    const coordinator::ElasticRecord::Waiting& w = record.waiting();
    return ElasticPhase(ElasticPhase::Waiting{w.cause(), KindOf(w.kind()), started(w.until_us()),
                                              TimeOf(w.until_us()), std::move(forming)},
                        std::move(planned));
  }
  if (forming.has_value()) return ElasticPhase(*std::move(forming), std::move(planned));
  return ElasticPhase(ElasticPhase::Steady{}, std::move(planned));
}

// Restores the change of generation `record` saved (Note [Elastic restart]).
void RestoreElastic(const coordinator::ElasticRecord& record, RunningJob& run) {
  for (int lost : record.lost_ranks()) {
    if (lost < 0 || lost >= static_cast<int>(run.ranks().size())) continue;
    run.MarkLost(lost);
  }
  run.mutable_phase() = RestoredPhase(record);

  for (int finished : record.finished_ranks()) {
    if (finished < 0 || finished >= static_cast<int>(run.ranks().size())) continue;
    run.MarkFinished(finished);
  }
  run.Restore({record.history().begin(), record.history().end()}, record.recovery_seconds(),
              record.has_last_growth_us() ? TimeOf(record.last_growth_us()) : absl::InfinitePast(),
              record.reforms_in_process());
  if (record.has_restart_all()) {
    for (int stopping : record.restart_all().stopping_ranks()) {
      if (stopping < 0 || stopping >= static_cast<int>(run.ranks().size())) continue;
      run.MarkStopping(stopping);
    }
  }
  run.RecordChanged(record.SerializeAsString());
}

// The phase's part of the record: what RestoredPhase reads back.
void SavePhase(const RunningJob& run, coordinator::ElasticRecord& record) {
  const ElasticPhase& phase = run.phase();
  const auto save_forming = [&](const ElasticPhase::Forming& f) {
    if (run.Formed()) return;
    record.mutable_forming()->set_deadline_us(absl::ToUnixMicros(f.deadline));
    record.mutable_forming()->set_kind(std::string(ReformKindName(f.kind)));
  };
  if (const ElasticPhase::Forming* f = phase.forming()) save_forming(*f);
  if (const ElasticPhase::Waiting* w = phase.waiting()) {
    record.mutable_waiting()->set_until_us(absl::ToUnixMicros(w->until));
    record.mutable_waiting()->set_cause(w->cause);
    record.mutable_waiting()->set_kind(std::string(ReformKindName(w->kind)));
    if (w->unformed.has_value()) save_forming(*w->unformed);
  }
  if (const ElasticPhase::Restarting* r = phase.restarting()) {
    coordinator::ElasticRecord::RestartAll& restart = *record.mutable_restart_all();
    restart.set_cause(r->cause);
    restart.set_kind(std::string(ReformKindName(r->kind)));
    restart.set_deadline_us(absl::ToUnixMicros(r->deadline));
  }
  if (const std::optional<ElasticPhase::Planned>& p = phase.planned()) {
    record.mutable_planned()->set_cause(p->cause);
    record.mutable_planned()->set_kind(std::string(ReformKindName(p->kind)));
    record.mutable_planned()->set_world(p->world.value_or(0));
  }
  if (std::optional<absl::Time> started = phase.started()) {
    record.set_reform_started_us(absl::ToUnixMicros(*started));
  }
}

}  // namespace

coordinator::ElasticRecord ElasticRecordOf(const RunningJob& run, const std::vector<bool>& lost) {
  coordinator::ElasticRecord record;
  record.set_generation(run.generation());
  for (size_t rank = 0; rank < run.ranks().size(); ++rank) {
    const RankState& r = run.ranks()[rank];
    if (r.state == v1::RankStatus::EXITED && r.exit_code == 0 && r.evicted.empty() && !r.stopping) {
      record.add_finished_ranks(static_cast<int>(rank));
    } else if (rank < lost.size() && lost[rank]) {
      record.add_lost_ranks(static_cast<int>(rank));
    }
  }
  SavePhase(run, record);
  if (run.last_growth_at() != absl::InfinitePast()) {
    record.set_last_growth_us(absl::ToUnixMicros(run.last_growth_at()));
  }
  record.set_recovery_seconds(run.recovery_seconds());
  for (const std::string& line : run.history()) record.add_history(line);
  record.set_reforms_in_process(run.reforms_in_process());
  if (run.phase().restarting() != nullptr) {
    coordinator::ElasticRecord::RestartAll& restart = *record.mutable_restart_all();
    for (size_t rank = 0; rank < run.ranks().size(); ++rank) {
      if (run.ranks()[rank].stopping) restart.add_stopping_ranks(static_cast<int>(rank));
    }
  }
  return record;
}

coordinator::ElasticRecord ElasticRecordOf(const RunningJob& run, const AgentRegistry& agents) {
  std::vector<bool> lost;
  for (RunningJob::Fate fate : run.Fates(agents)) {
    lost.push_back(fate == RunningJob::Fate::kExited || fate == RunningJob::Fate::kAgentGone);
  }
  return ElasticRecordOf(run, lost);
}

RunningJob RecoveredJob(const v1::Job& job, absl::Time until,
                        const coordinator::ElasticRecord& record) {
  const bool restore = job.spec().has_elastic() && record.generation() == job.generation();
  // A generation that had not formed answered no rank: they all join again.
  const bool forming = restore && record.has_forming();
  RunningJob run(job, job.placements_size(), job.generation());
  run.AwaitAfterRestart(until);
  for (const v1::RankPlacement& placement : job.placements()) {
    RankState rank;
    rank.slot = placement.slot();
    rank.local_rank = placement.local_rank();
    rank.local_world_size = placement.local_world_size();
    rank.state = v1::RankStatus::LOST;
    rank.recover_host = placement.host();
    rank.recover_agent_pid = placement.agent_pid();
    run.AddRank(std::move(rank), /*joined=*/!forming);
  }
  if (restore) RestoreElastic(record, run);
  return run;
}

std::map<std::string, std::vector<int>> RebindRanks(
    std::map<std::string, RunningJob>& running, const std::string& agent_id,
    const v1::AgentHello& hello, std::vector<std::pair<std::string, int>>* bound) {
  std::map<std::string, std::vector<int>> orphans;
  for (const v1::RunningRank& reported : hello.running()) {
    auto run = running.find(reported.job_id());
    int match = -1;
    if (run != running.end() && reported.generation() <= run->second.generation()) {
      match = run->second.AwaitedRank(hello.host(), hello.pid(), reported.slot());
    }
    if (match < 0 || reported.slot() < 0 || reported.slot() >= hello.slots()) {
      orphans[reported.job_id()].push_back(reported.slot());
      continue;
    }
    run->second.Rebind(match, agent_id, reported.pid());
    bound->emplace_back(reported.job_id(), reported.slot());
  }
  return orphans;
}

std::map<std::string, JobActions> BindAgentRanks(std::map<std::string, RunningJob>& running,
                                                 AgentRegistry& agents, const std::string& agent_id,
                                                 const v1::AgentHello& hello, absl::Time now) {
  std::map<std::string, JobActions> actions;
  std::vector<std::pair<std::string, int>> bound;
  for (auto& [job_id, slots] : RebindRanks(running, agent_id, hello, &bound)) {
    actions[job_id].messages.emplace_back(
        agent_id, StopRanksMessage(job_id, slots, "the coordinator no longer runs this job"));
  }
  for (const auto& [job_id, slot] : bound) {
    agents.SetBusy(agent_id, slot, true);
    JobActions& job = actions[job_id];
    job.logs.push_back(absl::StrCat("slot ", slot, " on ", hello.host(), " is back"));
    RunningJob& run = running.at(job_id);
    const int rank = run.RankOn(agent_id, slot);
    if (rank < 0) continue;
    run.RestartHeartbeatClock(rank, now);
    const ElasticPhase::Restarting* restarting = run.phase().restarting();
    if (restarting != nullptr && run.ranks()[rank].stopping) {
      job.messages.emplace_back(agent_id, StopRanksMessage(job_id, {slot}, restarting->cause));
    }
  }
  return actions;
}

bool AwaitsToldExit(const RunningJob& run, const v1::AgentHello& hello,
                    const v1::RankExited& exited) {
  if (exited.generation() != run.generation()) return false;
  return run.AwaitedRank(hello.host(), hello.pid(), exited.slot()) >= 0;
}

namespace {

// The lost agent (Note [Agent reconnect grace]) that ran `rank` last, or
// null: the rank has waited since the coordinator restarted.
const LostAgentWait* LostAgentOf(const RankWaitCause& cause, int rank) {
  for (auto it = cause.lost_agents.rbegin(); it != cause.lost_agents.rend(); ++it) {
    if (std::find(it->ranks.begin(), it->ranks.end(), rank) != it->ranks.end()) return &*it;
  }
  return nullptr;
}

// Why the wait of `run` ended with `missing` of `expected` ranks not back:
// "lost contact with the agent on node-b (agent-2), which ran ranks of this
// job; 1 of 2 rank(s) did not come back within 10s", the restart's reason
// for ranks that waited since the coordinator restarted, or both.
std::string WaitFailure(const RunningJob& run, int missing, int expected) {
  std::vector<const LostAgentWait*> agents;  // of missing ranks, oldest first
  int after_restart = 0;
  for (size_t rank = 0; rank < run.ranks().size(); ++rank) {
    const RankState& r = run.ranks()[rank];
    if (!r.agent_id.empty() || r.state == v1::RankStatus::EXITED) continue;
    const LostAgentWait* lost = LostAgentOf(run.wait_cause(), static_cast<int>(rank));
    if (lost == nullptr) {
      ++after_restart;
    } else if (std::find(agents.begin(), agents.end(), lost) == agents.end()) {
      agents.push_back(lost);
    }
  }
  std::vector<std::string> parts;
  if (!agents.empty()) {
    std::vector<std::string> names;
    absl::Duration grace = absl::ZeroDuration();
    for (const LostAgentWait* lost : agents) {
      names.push_back(absl::StrCat(lost->host, " (", lost->agent_id, ")"));
      grace = std::max(grace, lost->grace);
    }
    parts.push_back(absl::StrCat(
        "lost contact with the agent", names.size() > 1 ? "s" : "", " on ",
        absl::StrJoin(names, ", "), ", which ran ranks of this job; ", missing - after_restart,
        " of ", expected, " rank(s) did not come back within ", absl::FormatDuration(grace)));
  }
  if (after_restart > 0) {
    parts.push_back(absl::StrCat(after_restart, " of ", expected,
                                 " rank(s) did not come back after the coordinator restarted"));
  }
  return absl::StrJoin(parts, "; ");
}

// What the event says once every rank is back.
std::string AllBack(const RankWaitCause& cause) {
  std::string back = cause.after_restart ? "every rank is back after the coordinator restart"
                                         : "every rank is back";
  if (cause.lost_agents.empty()) return back;
  std::vector<std::string> hosts;
  for (const LostAgentWait& lost : cause.lost_agents) {
    if (std::find(hosts.begin(), hosts.end(), lost.host) == hosts.end()) {
      hosts.push_back(lost.host);
    }
  }
  return absl::StrCat(back, cause.after_restart ? "; " : ": ", "the agent",
                      hosts.size() > 1 ? "s" : "", " on ", absl::StrJoin(hosts, ", "),
                      " reconnected");
}

}  // namespace

RecoveryProgress CheckRecovery(RunningJob& run, absl::Time now) {
  RecoveryProgress progress;
  if (run.recovering_until() == absl::InfinitePast()) return progress;
  // Ranks lost before the restart (an elastic job's) are not waited for.
  int expected = 0;
  int missing = 0;
  for (const RankState& rank : run.ranks()) {
    if (rank.state == v1::RankStatus::EXITED && rank.agent_id.empty()) continue;
    ++expected;
    if (rank.agent_id.empty()) ++missing;
  }
  if (missing == 0) {
    progress.all_back = true;
    progress.back = AllBack(run.wait_cause());
    run.StopAwaiting();
  } else if (now >= run.recovering_until()) {
    progress.failure = WaitFailure(run, missing, expected);
  }
  return progress;
}

}  // namespace chorus
