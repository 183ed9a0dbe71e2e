#include "coordinator/scheduling/running_job.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/memory_estimate.h"
#include "common/output_limits.h"

namespace chorus {
namespace {

// How many of a failed program rank's last output lines its reason quotes.
constexpr int kProgramReasonLines = 3;
// How much of a failed rank's output its reason quotes, at most (the end).
constexpr size_t kQuotedOutputBytes = 2048;

// The newest lines of an exit report's tail, bounded as an agent should
// have (Note [Bounded job output] in common/output_limits.h). For a
// program, without chorus-rank's own log lines (Note [Rank log tag] in
// common/logging.h): the reason quotes the program.
std::deque<std::string> ReportedTail(const v1::RankExited& exited, bool program) {
  std::deque<std::string> tail;
  const int n = exited.stderr_tail_size();
  for (int i = std::max(0, n - static_cast<int>(kMaxTailLines)); i < n; ++i) {
    const std::string& line = exited.stderr_tail(i);
    if (program && absl::StartsWith(line, kRankLogTag)) continue;
    tail.push_back(BoundReceivedLine(line));
  }
  BoundTail(tail);
  return tail;
}

// The first line of a history that dropped lines: "(N earlier changes not
// kept)".
constexpr absl::string_view kDroppedPrefix = "(";
constexpr absl::string_view kDroppedSuffix = " earlier changes not kept)";

// N if `line` is the count of dropped lines, else 0.
int64_t DroppedCount(absl::string_view line) {
  int64_t count = 0;
  if (!absl::ConsumePrefix(&line, kDroppedPrefix) || !absl::ConsumeSuffix(&line, kDroppedSuffix) ||
      !absl::SimpleAtoi(line, &count)) {
    return 0;
  }
  return count;
}

}  // namespace

std::string ListNewcomers(const std::vector<std::string>& newcomers) {
  const size_t listed = std::min(newcomers.size(), static_cast<size_t>(kListedNewcomers));
  std::string text =
      absl::StrJoin(newcomers.begin(), newcomers.begin() + static_cast<ptrdiff_t>(listed), ", ");
  if (listed < newcomers.size())
    absl::StrAppend(&text, " and ", newcomers.size() - listed, " more");
  return text;
}

void AppendHistory(std::vector<std::string>& history, std::string line) {
  history.push_back(std::move(line));
  const int64_t dropped_before = DroppedCount(history.front());
  const size_t first_change = dropped_before > 0 ? 1 : 0;
  const size_t changes = history.size() - first_change;
  if (changes <= static_cast<size_t>(kHistoryLines)) return;
  const size_t excess = changes - kHistoryLines;
  history.erase(history.begin() + static_cast<ptrdiff_t>(first_change),
                history.begin() + static_cast<ptrdiff_t>(first_change + excess));
  const std::string count =
      absl::StrCat(kDroppedPrefix, dropped_before + static_cast<int64_t>(excess), kDroppedSuffix);
  if (first_change == 1) {
    history.front() = count;
  } else {
    history.insert(history.begin(), count);
  }
}

RankState RankState::At(const RankSlot& slot) {
  RankState rank;
  rank.agent_id = slot.agent_id;
  rank.slot = slot.slot;
  rank.local_rank = slot.local_rank;
  rank.local_world_size = slot.local_world_size;
  return rank;
}

RunningJob::RunningJob(const v1::Job& job, int world_size, int64_t generation)
    : hang_detection(job.spec().hang_detection()),
      owner(job.owner()),
      priority(job.spec().priority() != v1::JobSpec::PRIORITY_UNSPECIFIED ? job.spec().priority()
                                                                          : v1::JobSpec::NORMAL),
      device(job.spec().resources().device()),
      min_ranks(job.spec().resources().min_ranks()),
      memory_limit_bytes(RankMemoryLimitBytes(job.spec())),
      max_processes(RankProcessLimit(job.spec())),
      program(job.spec().has_program()),
      elastic(job.spec().has_elastic()),
      elastic_spec(job.spec().elastic()),
      preemptible(job.spec().resources().preemptible()),
      rendezvous_(job.job_id(), generation, world_size),
      restarts_(job.restarts()),
      upload_grant_(UploadGrantFor(job, world_size, generation)) {}

void RunningJob::SetLimits(v1::LaunchRanks& launch) const {
  launch.set_memory_limit_bytes(memory_limit_bytes);
  launch.set_max_processes(max_processes);
}

bool RunningJob::Steady() const {
  if (!Formed() || AwaitingRanks()) return false;
  if (phase_.planned().has_value() || phase_.waiting() != nullptr ||
      phase_.restarting() != nullptr) {
    return false;
  }
  return std::none_of(ranks_.begin(), ranks_.end(),
                      [](const RankState& r) { return r.state == v1::RankStatus::EXITED; });
}

std::vector<RunningJob::Fate> RunningJob::Fates(const AgentRegistry& agents) const {
  std::vector<Fate> fates(ranks_.size(), Fate::kStays);
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    const RankState& r = ranks_[rank];
    const AgentRegistry::Agent* agent = r.agent_id.empty() ? nullptr : agents.Find(r.agent_id);
    if (r.state == v1::RankStatus::EXITED) {
      fates[rank] = Fate::kExited;
    } else if (r.agent_id.empty()) {
      fates[rank] = Fate::kUnbound;
    } else if (agent == nullptr) {
      fates[rank] = Fate::kAgentGone;
    } else if (agent->draining || leaving_.yielding(r.agent_id, r.slot)) {
      fates[rank] = Fate::kLeavesAtBoundary;
    }
  }
  return fates;
}

void RunningJob::BeginGeneration(const v1::Job& job, std::vector<RankState> next_ranks,
                                 int64_t generation, ReformKind kind, absl::Time now,
                                 std::vector<int> survivors) {
  const int world = static_cast<int>(next_ranks.size());
  finished_before_reform_ = TrainingFinished();
  ranks_ = std::move(next_ranks);
  rendezvous_ = Rendezvous(job.job_id(), generation, world);
  exited_ok_ = 0;
  rank_of_survivor_ = std::move(survivors);
  ForgetDiagnoses();
  upload_grant_ = UploadGrantFor(job, world, generation);
  generation_started_at_ = now;
  phase_.BeginForming(kind, now, now + absl::Seconds(elastic_spec.wait_seconds()));
}

void RunningJob::CountChange(bool failure, bool grew, bool owes, absl::Time now) {
  if (failure) ++restarts_;
  if (grew) last_growth_at_ = now;
  replacements_owed_ = owes;
}

void RunningJob::Restore(std::vector<std::string> history, double recovery_seconds,
                         absl::Time last_growth_at, bool reforms_in_process) {
  history_ = std::move(history);
  recovery_seconds_ = recovery_seconds;
  if (last_growth_at != absl::InfinitePast()) last_growth_at_ = last_growth_at;
  reforms_in_process_ = reforms_in_process;
}

void RunningJob::MarkFinished(int rank) {
  ranks_[rank].state = v1::RankStatus::EXITED;
  ranks_[rank].recover_host.clear();
  ++exited_ok_;
}

RunningJob RunningJob::Started(const v1::Job& job, const std::vector<RankSlot>& slots,
                               v1::CheckpointManifest resume, AgentRegistry& agents,
                               absl::Time now) {
  RunningJob run(job, static_cast<int>(slots.size()), /*generation=*/1);
  run.resume_ = std::move(resume);
  for (const RankSlot& slot : slots) {
    agents.SetBusy(slot.agent_id, slot.slot, true);
    run.ranks_.push_back(RankState::At(slot));
  }
  run.generation_started_at_ = now;
  run.last_growth_at_ = now;
  return run;
}

std::map<std::string, v1::CoordinatorMessage> RunningJob::NewcomerLaunchMessages(
    const std::string& job_id, const std::string& coordinator_address) const {
  std::vector<RankSlot> newcomers;
  const std::vector<RankSlot> slots = Slots();
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    if (ranks_[rank].state == v1::RankStatus::LAUNCHING) newcomers.push_back(slots[rank]);
  }
  return LaunchMessages(job_id, coordinator_address, generation(), newcomers);
}

std::vector<v1::JobEvent> RunningJob::UpdateDiagnoses(const AgentRegistry& agents, absl::Time now) {
  diagnoses_now_ = Diagnose(agents, now);
  return diagnoses_.Update(diagnoses_now_, now);
}

int64_t RunningJob::ReportedStep() const {
  int64_t step = 0;
  for (const RankState& rank : ranks_) step = std::max(step, rank.last_heartbeat.step());
  return step;
}

std::map<std::string, v1::CoordinatorMessage> RunningJob::CheckpointMessages(
    const std::string& job_id, const AgentRegistry& agents) const {
  std::map<std::string, v1::CoordinatorMessage> by_agent;
  for (const RankState& rank : ranks_) {
    if (rank.agent_id.empty() || rank.state == v1::RankStatus::EXITED ||
        agents.Find(rank.agent_id) == nullptr) {
      continue;
    }
    v1::CheckpointRanks& checkpoint = *by_agent[rank.agent_id].mutable_checkpoint();
    checkpoint.set_job_id(job_id);
    checkpoint.add_slots(rank.slot);
  }
  return by_agent;
}

std::vector<RankSlot> RunningJob::Slots() const {
  std::vector<RankSlot> slots;
  for (const RankState& r : ranks_) {
    RankSlot& s = slots.emplace_back();
    s.agent_id = r.agent_id;
    s.slot = r.slot;
    s.local_rank = r.local_rank;
    s.local_world_size = r.local_world_size;
  }
  return slots;
}

// Note [Rank index]
// Every Join, exit and log line finds its rank by (agent, slot); a scan of
// `ranks` made a generation's rendezvous O(ranks^2) (0.3 s of string
// compares at 4,096 ranks, 16,384 would take seconds). Several transitions
// move a rank to another agent or slot (a new generation, a rank awaited,
// bound again or given up), so the index checks itself instead of being
// kept up to date by each of them: a hit is used only if that rank
// still runs on that slot, and a miss or a stale hit rebuilds it (O(ranks))
// and looks again. A lookup for a slot no rank has rebuilds each time, as
// the scan cost before; those are rare (a departed rank's late exit). The
// ranks taken back after a restart (recover_host set) are listed at the
// same time: recover_host is set when a job is taken back, before any
// lookup, or by AwaitAgent, which indexes again; it survives into later
// generations with the rank.
void RunningJob::IndexRanks() const {
  rank_index_.clear();
  recovered_ranks_.clear();
  rank_index_.reserve(ranks_.size());
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    rank_index_.try_emplace(std::make_pair(ranks_[rank].agent_id, ranks_[rank].slot),
                            static_cast<int>(rank));
    if (!ranks_[rank].recover_host.empty()) recovered_ranks_.push_back(static_cast<int>(rank));
  }
}

int RunningJob::RankOn(const std::string& agent_id, int slot) const {
  const auto here = [&](int rank) {
    return rank < static_cast<int>(ranks_.size()) && ranks_[rank].agent_id == agent_id &&
           ranks_[rank].slot == slot;
  };
  auto key = std::make_pair(agent_id, slot);
  if (auto it = rank_index_.find(key); it != rank_index_.end() && here(it->second)) {
    return it->second;
  }
  IndexRanks();
  auto it = rank_index_.find(key);
  return it == rank_index_.end() ? -1 : it->second;
}

int RunningJob::RankOfJoin(const std::string& agent_id, int slot, int64_t pid,
                           const std::string& host) const {
  if (rank_index_.empty()) IndexRanks();
  for (int rank : recovered_ranks_) {
    if (rank >= static_cast<int>(ranks_.size())) continue;
    const RankState& r = ranks_[rank];
    if (!r.recover_host.empty() && pid != 0 && r.pid == pid && r.slot == slot &&
        (host.empty() || host == r.recover_host)) {
      return rank;
    }
  }
  return RankOn(agent_id, slot);
}

void RunningJob::AddRank(RankState rank, bool joined) {
  if (joined) rendezvous_.MarkJoined(static_cast<int>(ranks_.size()));
  ranks_.push_back(std::move(rank));
}

void RunningJob::HeardFrom(int rank, absl::Time now) { ranks_[rank].heard_at = now; }

void RunningJob::OnHeartbeat(const v1::RankHeartbeat& heartbeat, absl::Time now, bool via_agent) {
  RankState& rank = ranks_[heartbeat.rank()];
  rank.last_heartbeat = heartbeat;
  rank.heartbeat_at = now;
  rank.heard_at = now;
  rank.heartbeats_via_agent = via_agent;
  if (heartbeat.phase() == v1::FINISHED) FinishedTraining(heartbeat.rank());
}

void RunningJob::FinishedTraining(int rank) {
  RankState& r = ranks_[rank];
  if (!r.stopping && r.evicted.empty()) r.finished = true;
}

void RunningJob::OnJoining(int rank, int64_t pid) {
  ranks_[rank].pid = pid;
  ranks_[rank].state = v1::RankStatus::JOINING;
}

void RunningJob::OnTraining() {
  for (RankState& r : ranks_) r.state = v1::RankStatus::TRAINING;
}

bool RunningJob::MarkEvicted(int rank, std::string why) {
  RankState& r = ranks_[rank];
  if (!r.evicted.empty() || r.state == v1::RankStatus::EXITED) return false;
  r.evicted = std::move(why);
  return true;
}

int RunningJob::MarkStopping() {
  int stopping = 0;
  for (RankState& r : ranks_) {
    if (r.state == v1::RankStatus::EXITED) continue;
    r.stopping = true;
    ++stopping;
  }
  return stopping;
}

void RunningJob::MarkStopping(int rank) { ranks_[rank].stopping = true; }

void RunningJob::MarkLost(int rank) {
  ranks_[rank].state = v1::RankStatus::EXITED;
  ranks_[rank].recover_host.clear();  // gone: no agent binds it again
}

int RunningJob::AwaitedRank(const std::string& host, int64_t agent_pid, int slot) const {
  for (int rank = static_cast<int>(ranks_.size()) - 1; rank >= 0; --rank) {
    const RankState& r = ranks_[rank];
    if (r.agent_id.empty() && r.state != v1::RankStatus::EXITED && r.recover_host == host &&
        r.recover_agent_pid == agent_pid && r.slot == slot) {
      return rank;
    }
  }
  return -1;
}

void RunningJob::Rebind(int rank, const std::string& agent_id, int64_t pid) {
  RankState& r = ranks_[rank];
  r.agent_id = agent_id;
  r.pid = pid;
  r.state = Formed() ? v1::RankStatus::TRAINING : v1::RankStatus::JOINING;
}

void RunningJob::RestartHeartbeatClock(int rank, absl::Time now) {
  if (ranks_[rank].heartbeat_at != absl::InfinitePast()) ranks_[rank].heartbeat_at = now;
}

bool RunningJob::GiveUpRank(int rank, const std::string& agent_id) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size()) || !ranks_[rank].agent_id.empty()) {
    return false;
  }
  ranks_[rank].agent_id = agent_id;
  return true;
}

void RunningJob::AwaitAfterRestart(absl::Time until) {
  recovering_until_ = until;
  wait_cause_.after_restart = true;
}

void RunningJob::AwaitLostAgent(LostAgentWait wait, absl::Time until) {
  recovering_until_ = std::max(recovering_until_, until);
  wait_cause_.lost_agents.push_back(std::move(wait));
}

void RunningJob::StopAwaiting() {
  recovering_until_ = absl::InfinitePast();
  wait_cause_ = RankWaitCause();
}

bool RunningJob::AwaitingRanks() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const RankState& r) {
    return r.agent_id.empty() && r.state != v1::RankStatus::EXITED;
  });
}

std::vector<int> RunningJob::AwaitAgent(const std::string& agent_id, const std::string& host,
                                        int64_t agent_pid) {
  std::vector<int> waiting;
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    RankState& r = ranks_[rank];
    if (r.agent_id != agent_id || r.state == v1::RankStatus::EXITED) continue;
    r.agent_id.clear();
    r.recover_host = host;
    r.recover_agent_pid = agent_pid;
    r.state = v1::RankStatus::LOST;
    waiting.push_back(static_cast<int>(rank));
  }
  IndexRanks();
  return waiting;
}

bool RunningJob::RunsOn(const std::string& agent_id) const {
  for (const RankState& r : ranks_) {
    if (r.agent_id == agent_id && r.state != v1::RankStatus::EXITED) return true;
  }
  return leaving_.DepartingOn(agent_id);
}

std::map<std::string, std::vector<int>> RunningJob::ReleaseSlots(AgentRegistry& agents) const {
  std::map<std::string, std::vector<int>> to_stop;
  for (const RankState& r : ranks_) {
    if (agents.Find(r.agent_id) == nullptr) continue;
    agents.SetBusy(r.agent_id, r.slot, false);
    if (r.state != v1::RankStatus::EXITED) to_stop[r.agent_id].push_back(r.slot);
  }
  for (const auto& [agent_id, slot] : leaving_.Departing()) {
    if (agents.Find(agent_id) == nullptr) continue;
    agents.SetBusy(agent_id, slot, false);
    to_stop[agent_id].push_back(slot);
  }
  for (const StagedNewcomer& n : staged_.newcomers()) {
    if (agents.Find(n.slot.agent_id) == nullptr) continue;
    agents.SetBusy(n.slot.agent_id, n.slot.slot, false);
    to_stop[n.slot.agent_id].push_back(n.slot.slot);
  }
  return to_stop;
}

std::string RunningJob::StoreNamespace(const v1::Job& job, int64_t gen) {
  // Note [Re-queue]: each start after a preemption is a new run of the job
  // whose generations count from 1 again; its keys must not meet the last
  // run's.
  return job.preemptions() == 0
             ? absl::StrCat(job.job_id(), "/gen-", gen)
             : absl::StrCat(job.job_id(), "/run-", job.preemptions() + 1, "/gen-", gen);
}

bool RunningJob::HasRank(int64_t gen, int rank) const {
  return gen == generation() && rank >= 0 && rank < static_cast<int>(ranks_.size());
}

std::vector<RankView> RunningJob::HangViews(const AgentRegistry& agents) const {
  std::vector<RankView> views;
  // An agent's ranks are neighbours (placement fills an agent's slots in
  // rank order), so one lookup serves a run of them.
  const std::string* looked_up = nullptr;
  const AgentRegistry::Agent* agent = nullptr;
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    const RankState& r = ranks_[rank];
    RankView v;
    v.rank = static_cast<int>(rank);
    // Note [Diagnoses during shutdown]: a finished rank is not watched.
    v.exited = r.state == v1::RankStatus::EXITED || r.finished;
    v.has_heartbeat = r.heartbeat_at != absl::InfinitePast();
    v.heartbeat_at = r.heartbeat_at;
    v.recorded = &r.last_heartbeat;
    if (looked_up == nullptr || *looked_up != r.agent_id) {
      agent = agents.Find(r.agent_id);
      looked_up = &r.agent_id;
    }
    if (agent != nullptr) {
      v.node_cpu_pressure = agent->cpu_pressure;  // Note [A starved node]
      // Note [A silent agent's ranks].
      if (r.heartbeats_via_agent) v.relay_heard_at = agent->heard_at;
    }
    // Note [Agent reconnect grace]: its heartbeats come back with its agent.
    const bool away = r.agent_id.empty() && !v.exited;
    if ((v.has_heartbeat || v.exited) && !away) views.push_back(std::move(v));
  }
  return views;
}

bool RunningJob::TrainingFinished() const {
  return finished_before_reform_ ||
         std::any_of(ranks_.begin(), ranks_.end(), [](const RankState& r) { return r.finished; });
}

std::vector<v1::Diagnosis> RunningJob::Diagnose(const AgentRegistry& agents, absl::Time now) const {
  std::vector<v1::Diagnosis> diagnoses = DiagnoseHangs(hang_detection, HangViews(agents), now);
  if (TrainingFinished()) VoidDuringShutdown(diagnoses);
  return diagnoses;
}

std::map<std::string, v1::CoordinatorMessage> RunningJob::LaunchMessages(
    const std::string& job_id, const std::string& coordinator_address) const {
  return LaunchMessages(job_id, coordinator_address, generation(), Slots());
}

std::map<std::string, v1::CoordinatorMessage> RunningJob::LaunchMessages(
    const std::string& job_id, const std::string& coordinator_address, int64_t generation,
    const std::vector<RankSlot>& slots) const {
  std::map<std::string, v1::CoordinatorMessage> launches;
  for (const RankSlot& s : slots) {
    v1::LaunchRanks* launch = launches[s.agent_id].mutable_launch();
    launch->set_job_id(job_id);
    launch->set_generation(generation);
    launch->set_coordinator(coordinator_address);
    SetLimits(*launch);
    v1::RankLaunch* rank = launch->add_ranks();
    rank->set_slot(s.slot);
    rank->set_local_rank(s.local_rank);
    rank->set_local_world_size(s.local_world_size);
  }
  return launches;
}

std::vector<v1::RankPlacement> RunningJob::Placements(const AgentRegistry& agents) const {
  std::vector<v1::RankPlacement> placements;
  for (const RankState& r : ranks_) {
    const v1::AgentHello& hello = agents.Find(r.agent_id)->hello;
    v1::RankPlacement& recorded = placements.emplace_back();
    recorded.set_host(hello.host());
    recorded.set_agent_pid(hello.pid());
    recorded.set_slot(r.slot);
    recorded.set_local_rank(r.local_rank);
    recorded.set_local_world_size(r.local_world_size);
  }
  return placements;
}

RunningJob::Groups RunningJob::GroupsOfRanks() const {
  Groups groups;
  groups.of_rank.reserve(ranks_.size());
  absl::flat_hash_map<std::string, int> numbers;
  for (const RankState& r : ranks_) {
    const std::string& group = r.agent_id.empty() ? r.recover_host : r.agent_id;
    auto [it, added] = numbers.try_emplace(group, groups.count);
    if (added) ++groups.count;
    groups.of_rank.push_back(it->second);
  }
  return groups;
}

v1::JoinResponse RunningJob::JoinResponseFor(const v1::Job& job, int rank,
                                             const Groups& groups) const {
  v1::JoinResponse response;
  response.set_rank(rank);
  response.set_world_size(static_cast<int>(ranks_.size()));
  response.set_generation(generation());
  *response.mutable_spec() = job.spec();
  response.set_store_namespace(StoreNamespace(job, generation()));
  response.set_local_rank(ranks_[rank].local_rank);
  response.set_local_world_size(ranks_[rank].local_world_size);
  if (!resume_.job_id().empty()) *response.mutable_resume() = resume_;
  response.set_restarts(restarts_);
  response.set_group_rank(groups.of_rank.at(rank));
  response.set_group_world_size(groups.count);
  return response;
}

std::optional<JobEnd> RunningJob::RecordExit(const std::string& agent_id,
                                             const v1::AgentHello& agent,
                                             const v1::RankExited& exited) {
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    RankState& r = ranks_[rank];
    // A rank that exited while the coordinator was restarting is reported
    // after its agent reconnects, before it was bound again.
    const bool unbound_here =
        r.agent_id.empty() && r.recover_host == agent.host() && r.recover_agent_pid == agent.pid();
    if ((r.agent_id != agent_id && !unbound_here) || r.slot != exited.slot() ||
        r.state == v1::RankStatus::EXITED) {
      continue;
    }
    if (unbound_here) r.agent_id = agent_id;
    r.state = v1::RankStatus::EXITED;
    r.exit_code = exited.exit_code();
    // Note [Restart-all]: expected, unless training is over (Note
    // [Diagnoses during shutdown]).
    if (r.stopping && !(exited.exit_code() == 0 && TrainingFinished())) return std::nullopt;
    if (!r.evicted.empty() && !(exited.exit_code() == 0 && TrainingFinished())) {
      return JobEnd{v1::Job::FAILED, absl::StrCat("rank ", rank, " (", agent.host(), ", pid ",
                                                  exited.pid(), ") was evicted by ", r.evicted)};
    }
    if (exited.exit_code() != 0) {
      // Note [Rank cgroups]: the agent saw the kernel's OOM killer fire in
      // the rank's cgroup.
      const std::string how =
          exited.out_of_memory_limit_bytes() > 0
              ? absl::StrCat("was killed: out of memory: the job's limit is ",
                             FormatBinaryBytes(exited.out_of_memory_limit_bytes()),
                             " per rank (resources.memory_bytes)")
          : exited.exit_code() < 0 ? absl::StrCat("was killed by signal ", -exited.exit_code())
                                   : absl::StrCat("exited with code ", exited.exit_code());
      JobEnd end{v1::Job::FAILED, absl::StrCat("rank ", rank, " (", agent.host(), ", pid ",
                                               exited.pid(), ") ", how)};
      // Note [Agent reconnect grace]: a rank that fails while the job waits
      // for a lost agent's ranks has most likely lost them as peers (their
      // host died): the reason names that agent too.
      std::vector<std::string> away;
      for (const LostAgentWait& w : wait_cause_.lost_agents) {
        const bool missing = std::any_of(w.ranks.begin(), w.ranks.end(), [&](int k) {
          return k >= 0 && k < static_cast<int>(ranks_.size()) && ranks_[k].agent_id.empty() &&
                 ranks_[k].state != v1::RankStatus::EXITED;
        });
        if (missing) away.push_back(absl::StrCat(w.host, " (", w.agent_id, ")"));
      }
      if (!away.empty()) {
        absl::StrAppend(&end.reason, " while the job waited for the ranks of the agent(s) on ",
                        absl::StrJoin(away, ", "), ", with which contact was lost");
      }
      const std::deque<std::string> tail = ReportedTail(exited, program);
      if (program && !tail.empty()) {
        // A user's program says why in its own words, often over a few
        // lines (a Python traceback ends with the error, after the frame).
        const size_t first = tail.size() - std::min<size_t>(tail.size(), kProgramReasonLines);
        absl::StrAppend(
            &end.reason, "; last output: ",
            KeepEnd(absl::StrJoin(tail.begin() + first, tail.end(), " | "), kQuotedOutputBytes));
      } else if (!tail.empty()) {
        // Note [Rank error record]: what the rank said of its failure, even
        // with lines after it.
        const std::string* record = LastErrorRecord(tail);
        absl::StrAppend(&end.reason, "; last stderr: ",
                        KeepEnd(record != nullptr ? *record : tail.back(), kQuotedOutputBytes));
      }
      return end;
    }
    if (++exited_ok_ == static_cast<int>(ranks_.size())) {
      return JobEnd{v1::Job::SUCCEEDED, "every rank exited with code 0"};
    }
    return std::nullopt;
  }
  return std::nullopt;
}

namespace {

void AddStatusRow(const RankState& r, int rank, double caused, const AgentRegistry& agents,
                  absl::Time now, v1::JobStatus& status) {
  v1::RankStatus* row = status.add_ranks();
  row->set_rank(rank);
  const AgentRegistry::Agent* agent = agents.Find(r.agent_id);
  // A rank waiting for its agent to come back is shown on its host.
  row->set_host(agent != nullptr          ? agent->hello.host()
                : !r.recover_host.empty() ? r.recover_host
                                          : r.agent_id);
  row->set_pid(r.pid);
  row->set_state(r.state);
  row->set_exit_code(r.exit_code);
  if (r.heartbeat_at == absl::InfinitePast()) return;
  const v1::RankHeartbeat& hb = r.last_heartbeat;
  row->set_step(hb.step());
  row->set_phase(hb.phase());
  row->set_phase_seconds(hb.phase_seconds());
  row->set_heartbeat_age_seconds(absl::ToDoubleSeconds(now - r.heartbeat_at));
  row->set_last_completed_seq(hb.flight_recorder().last_completed_seq());
  row->set_step_time_seconds(hb.timings().step_seconds());
  row->set_compute_seconds(hb.timings().compute_seconds());
  row->set_comm_wait_seconds(hb.timings().comm_wait_seconds());
  row->set_caused_wait_seconds(caused);
  row->set_samples_per_second(hb.samples_per_second());
  row->set_loss(hb.loss());
}

}  // namespace

void RunningJob::AddStatusRows(const AgentRegistry& agents, absl::Time now, v1::JobStatus& status,
                               const StatusRows& rows) const {
  // Note [Who the others waited for] in hang_detector.h.
  std::vector<double> waits;
  waits.reserve(ranks_.size());
  for (const RankState& r : ranks_) {
    const bool known = r.heartbeat_at != absl::InfinitePast() &&
                       r.state != v1::RankStatus::EXITED && r.last_heartbeat.has_timings();
    waits.push_back(known ? r.last_heartbeat.timings().comm_wait_seconds() : -1);
  }
  const std::vector<double> caused = WaitCausedBy(waits);
  v1::RankSummary& summary = *status.mutable_rank_summary();
  summary.set_ranks(static_cast<int>(ranks_.size()));
  summary.set_oldest_heartbeat_rank(-1);
  summary.set_most_waited_for_rank(-1);
  std::map<v1::RankStatus::State, int> by_state;
  bool any_step = false;
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    const RankState& r = ranks_[rank];
    ++by_state[r.state];
    if (waits[rank] >= 0 &&
        (summary.most_waited_for_rank() < 0 || caused[rank] > summary.most_waited_for_seconds())) {
      summary.set_most_waited_for_rank(static_cast<int>(rank));
      summary.set_most_waited_for_seconds(caused[rank]);
    }
    if (r.heartbeat_at == absl::InfinitePast()) continue;
    const int64_t step = r.last_heartbeat.step();
    summary.set_min_step(any_step ? std::min(summary.min_step(), step) : step);
    summary.set_max_step(any_step ? std::max(summary.max_step(), step) : step);
    any_step = true;
    const double age = absl::ToDoubleSeconds(now - r.heartbeat_at);
    if (r.state != v1::RankStatus::EXITED &&
        (summary.oldest_heartbeat_rank() < 0 || age > summary.oldest_heartbeat_age_seconds())) {
      summary.set_oldest_heartbeat_rank(static_cast<int>(rank));
      summary.set_oldest_heartbeat_age_seconds(age);
    }
  }
  for (const auto& [state, count] : by_state) {
    (*summary.mutable_by_state())[v1::RankStatus::State_Name(state)] = count;
  }
  const int n = static_cast<int>(ranks_.size());
  const int first = std::clamp(rows.offset, 0, n);
  const int last = rows.limit >= n - first ? n : first + std::max(0, rows.limit);
  status.set_rank_offset(first);
  for (int rank = first; rank < last; ++rank) {
    AddStatusRow(ranks_[rank], rank, caused[rank], agents, now, status);
  }
  std::vector<int> also = rows.also;
  std::sort(also.begin(), also.end());
  also.erase(std::unique(also.begin(), also.end()), also.end());
  for (int rank : also) {
    if (rank < 0 || rank >= n || (rank >= first && rank < last)) continue;
    AddStatusRow(ranks_[rank], rank, caused[rank], agents, now, status);
  }
}

}  // namespace chorus
