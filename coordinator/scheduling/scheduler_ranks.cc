// The Scheduler's calls from ranks and about them: joins, heartbeats,
// reports, checkpoint requests and output.
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/scheduling/generation_change.h"
#include "coordinator/scheduling/rank_messages.h"
#include "coordinator/scheduling/scheduler.h"

namespace chorus {
void Scheduler::Join(const v1::JoinRequest& request, absl::Time deadline, JoinDone done) {
  Outbox out(*this);
  {
    absl::MutexLock lock(&state_.mu);
    if (metrics_ != nullptr) metrics_->RankJoined("rank");
    JoinLocked(request, deadline, std::move(done), out);
  }
  out.Flush();
}

void Scheduler::AgentJoins(const std::string& agent_id, const v1::RankJoins& batch,
                           absl::Time deadline) {
  Outbox out(*this);
  {
    absl::MutexLock lock(&state_.mu);
    const AgentRegistry::Agent* agent = state_.agents.Find(agent_id);
    if (agent == nullptr) return;
    const AgentSender send = agent->send;
    const int64_t connection = agent->order;
    const std::string host = agent->hello.host();
    for (const v1::JoinRequest& each : batch.joins()) {
      v1::JoinRequest request = each;
      request.set_agent_id(agent_id);  // an agent speaks for its own slots only
      request.set_host(host);
      if (metrics_ != nullptr) metrics_->RankJoined("agent");
      JoinDone done = agent_joins_.DoneFor(agent_id, connection, send, request);
      JoinLocked(request, deadline, std::move(done), out);
    }
  }
  out.Flush();
}

void Scheduler::JoinLocked(const v1::JoinRequest& request, absl::Time deadline, JoinDone done,
                           Outbox& out) {
  // Note [Staged growth] in staged_growth.h: a newcomer started before
  // its generation forms.
  if (StagedJoinLocked(request, done, out)) return;
  auto it = state_.running.find(request.job_id());
  if (it != state_.running.end() && StartsPlannedChange(it->second, request)) {
    const ElasticPhase::Planned planned = *it->second.phase().planned();
    ReformLocked(request.job_id(), planned.cause, planned.kind, out);
    SaveElasticLocked(out);
    it = state_.running.find(request.job_id());
  }
  if (it == state_.running.end()) {
    out.joins.emplace_back(std::move(done), NotRunning(jobs_.Get(request.job_id())));
    return;
  }
  JoinAnswer answer = AnswerJoin(it->second, request);
  if (answer.kind == JoinAnswer::Kind::kJoin) {
    JoinRankLocked(request, answer.rank, deadline, std::move(done), it->second, out);
  } else if (answer.kind == JoinAnswer::Kind::kLeave) {
    out.joins.emplace_back(std::move(done), std::move(answer.leave));
  } else {
    out.joins.emplace_back(std::move(done), std::move(answer.refusal));
  }
}

void Scheduler::JoinRankLocked(const v1::JoinRequest& request, int rank, absl::Time deadline,
                               JoinDone done, RunningJob& run, Outbox& out) {
  run.OnJoining(rank, request.pid());
  std::optional<v1::Job> job;
  RunningJob::Groups groups;
  const auto respond = [&](int r) {
    if (!job.has_value()) {
      job = jobs_.Get(request.job_id()).value_or(v1::Job());
      job->set_job_id(request.job_id());
      job->clear_placements();
      groups = run.GroupsOfRanks();
    }
    return run.JoinResponseFor(*job, r, groups);
  };
  if (!run.mutable_rendezvous().Join(rank, deadline, std::move(done), respond, out.joins)) return;
  run.OnTraining();
  if (std::optional<std::string> formed = OnGenerationFormed(run, clock_->Now())) {
    RecordEvent(request.job_id(), *std::move(formed), out);
  }
  if (metrics_ != nullptr && run.generation_started_at() != absl::InfinitePast()) {
    metrics_->RendezvousCompleted(clock_->Now() - run.generation_started_at());
  }
  SaveElasticLocked(request.job_id(), run, out);
}

absl::Status Scheduler::Report(const v1::ReportRequest& report) {
  std::shared_ptr<std::mutex> writes;
  std::unique_lock<std::mutex> writing;
  v1::Metrics metrics;
  bool program = false;
  {
    absl::MutexLock lock(&state_.mu);
    auto it = state_.running.find(report.job_id());
    if (it == state_.running.end()) return NotRunning(jobs_.Get(report.job_id()));
    ASSIGN_OR_RETURN(metrics, RecordReport(it->second, report));
    if (report.rank() != 0) return absl::OkStatus();
    program = it->second.program;
    writes = it->second.report_writes;
    writing = std::unique_lock<std::mutex>(*writes);
  }
  return records_.Report(report, metrics, program);
}

bool Scheduler::Heartbeat(const v1::RankHeartbeat& heartbeat, v1::Directive* directive) {
  absl::MutexLock lock(&state_.mu);
  return HeartbeatLocked(heartbeat, directive);
}

void Scheduler::AgentHeartbeats(const std::string& agent_id, const v1::RankHeartbeats& batch,
                                double cpu_pressure) {
  Outbox out(*this);
  {
    absl::MutexLock lock(&state_.mu);
    const AgentRegistry::Agent* agent = state_.agents.Find(agent_id);
    if (agent == nullptr) return;
    state_.agents.Heard(agent_id, clock_->Now(), cpu_pressure);
    v1::CoordinatorMessage answer;
    v1::Directive directive;
    for (const v1::RankHeartbeat& heartbeat : batch.heartbeats()) {
      auto it = state_.running.find(heartbeat.job_id());
      int slot = -1;  // unknown for a rank of an older generation or an ended job
      if (it != state_.running.end() &&
          it->second.HasRank(heartbeat.generation(), heartbeat.rank())) {
        const RankState& rank = it->second.ranks()[heartbeat.rank()];
        if (rank.agent_id != agent_id) continue;  // not the agent's to speak for
        slot = rank.slot;
      }
      directive.Clear();
      HeartbeatLocked(heartbeat, &directive, /*via_agent=*/true);
      if (directive.kind() != v1::Directive::KIND_UNSPECIFIED) {
        AddDirective(*answer.mutable_directives(), heartbeat, slot, directive);
      }
    }
    if (answer.has_directives()) out.messages.emplace_back(agent->send, std::move(answer));
  }
  out.Flush();
}

bool Scheduler::HeartbeatLocked(const v1::RankHeartbeat& heartbeat, v1::Directive* directive,
                                bool via_agent) {
  auto it = state_.running.find(heartbeat.job_id());
  if (it == state_.running.end()) {
    absl::StatusOr<v1::Job> job = jobs_.Get(heartbeat.job_id());
    std::optional<v1::Directive> abort = job.ok() ? AbortDirective(*job) : std::nullopt;
    if (directive != nullptr && abort.has_value()) *directive = *std::move(abort);
    return false;
  }
  HeartbeatAnswer answer = RecordHeartbeat(it->second, heartbeat, clock_->Now(), via_agent);
  if (directive != nullptr && answer.directive.kind() != v1::Directive::KIND_UNSPECIFIED) {
    *directive = std::move(answer.directive);
  }
  if (answer.progress) records_.Progress(heartbeat);
  return answer.live;
}

absl::StatusOr<int64_t> Scheduler::RequestCheckpoint(const std::string& job_id) {
  Outbox out(*this);
  int64_t step = 0;
  {
    absl::MutexLock lock(&state_.mu);
    auto it = state_.running.find(job_id);
    if (it == state_.running.end()) {
      return NotRunning(jobs_.Get(job_id), "; only a running job can be checkpointed");
    }
    step = it->second.ReportedStep();
    for (auto& [agent_id, m] : it->second.CheckpointMessages(job_id, state_.agents)) {
      out.messages.emplace_back(state_.agents.Find(agent_id)->send, std::move(m));
    }
  }
  out.Flush();
  return step;
}

void Scheduler::Logs(const std::string& agent_id, const v1::RankLogs& logs) {
  int rank = -1;
  {
    absl::MutexLock lock(&state_.mu);
    auto it = state_.running.find(logs.job_id());
    if (it != state_.running.end()) rank = it->second.RankOn(agent_id, logs.slot());
  }
  logs_.Append(logs.job_id(), rank, logs.slot(), agent_id, absl::ToUnixMicros(clock_->Now()),
               {logs.lines().begin(), logs.lines().end()});
}

}  // namespace chorus
