#include "coordinator/scheduling/scheduler.h"

#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/scheduling/agent_departure.h"
#include "coordinator/scheduling/generation_change.h"
#include "coordinator/scheduling/hang_restart.h"
#include "coordinator/scheduling/job_recovery.h"
#include "coordinator/scheduling/rank_messages.h"
#include "glog/logging.h"

namespace chorus {

void Scheduler::AfterWrites(const std::vector<std::string>& settled,
                            const std::vector<std::string>& unrecorded, bool requeued) {
  Outbox out(*this);
  {
    absl::MutexLock lock(&state_.mu);
    for (const std::string& job_id : settled) state_.Settled(job_id);
    // A start whose write failed: no launch went out (nothing to stop, no
    // rank joined); its slots are free again and the job stays queued.
    for (const std::string& job_id : unrecorded) {
      auto it = state_.running.find(job_id);
      if (it == state_.running.end()) continue;  // ended meanwhile (a cancel)
      it->second.ReleaseSlots(state_.agents);
      it->second.mutable_rendezvous().Abort(absl::AbortedError("its start was not recorded"),
                                            out.joins);
      state_.running.erase(it);
      LOG(WARNING) << job_id
                   << ": not started, as its start could not be recorded; it stays queued";
    }
    // Not after a failed write: a store that refuses writes would be asked
    // again at once, for ever. The next change or Tick places again.
    if (requeued) ScheduleLocked(out);
  }
  out.Flush();
}

Scheduler::Scheduler(JobManager& jobs, Clock* clock, SchedulerOptions options)
    : jobs_(jobs),
      clock_(clock ? clock : &real_clock_),
      state_(options.scheduling_policy, clock_->Now()) {
  Configure(std::move(options));
}

void Scheduler::Configure(SchedulerOptions options) {
  absl::MutexLock lock(&state_.mu);
  resume_ = JobResume(std::move(options.resume_resolver), std::move(options.newest_committed));
  coordinator_address_ = std::move(options.coordinator_address);
  metrics_ = options.metrics;
  state_.fair_share = FairShare(options.scheduling_policy.fair_share_half_life, clock_->Now());
  state_.policy = std::move(options.scheduling_policy);
  requeue_timeout_ = options.requeue_checkpoint_timeout;
  reconnect_grace_ = options.agent_reconnect_grace;
}

absl::StatusOr<std::string> Scheduler::AddAgent(const v1::AgentHello& hello, Sender send) {
  Outbox out(*this);
  absl::StatusOr<std::string> added;
  {
    absl::MutexLock lock(&state_.mu);
    added = AddAgentLocked(hello, std::move(send), out);
  }
  out.Flush();
  return added;
}

absl::StatusOr<std::string> Scheduler::AddAgentLocked(const v1::AgentHello& hello, Sender send,
                                                      Outbox& out) {
  // An agent process connecting again before its old stream was seen to
  // end is the old agent lost; its ranks are rebound below (without this
  // they would be told to stop as no job's).
  std::vector<std::string> rebinding;
  if (std::optional<std::string> old = state_.agents.StillOpen(hello)) {
    LOG(WARNING) << "agent " << *old << " on " << hello.host() << " connected again (pid "
                 << hello.pid() << ") before its old stream ended";
    RemoveAgentLocked(*old, out, &rebinding);
  }
  std::string id;
  ASSIGN_OR_RETURN(id, state_.agents.Add(hello, std::move(send)));
  state_.agents.Heard(id, clock_->Now());
  const AgentRegistry::Agent& agent = *state_.agents.Find(id);
  v1::CoordinatorMessage welcome;
  welcome.mutable_welcome()->set_agent_id(id);
  out.messages.emplace_back(agent.send, welcome);
  LOG(INFO) << "agent " << id << " on " << hello.host() << " offers " << hello.slots() << " "
            << v1::ResourceSpec::Device_Name(agent.hello.device()) << " slot(s)";
  // Ranks it still runs: rebound to the jobs taken back after a restart;
  // those whose job is no longer running are stopped.
  for (auto& [job_id, actions] :
       BindAgentRanks(state_.running, state_.agents, id, hello, clock_->Now())) {
    ApplyLocked(job_id, std::move(actions), out);
  }
  // Note [Exits told again] in job_recovery.h: an exit a rank still waits
  // for is taken as if it had just been sent.
  for (const v1::RankExited& exited : hello.exited()) {
    auto run = state_.running.find(exited.job_id());
    if (run == state_.running.end() || !AwaitsToldExit(run->second, hello, exited)) continue;
    LOG(INFO) << exited.job_id() << ": slot " << exited.slot() << " on " << hello.host()
              << " exited with code " << exited.exit_code()
              << " before this coordinator led (its agent tells it again)";
    RankExitedLocked(id, exited, out);
  }
  // Note [An agent back before its stream ended] in agent_departure.h: ranks
  // its hello did not list are lost.
  for (const std::string& job_id : rebinding) {
    auto it = state_.running.find(job_id);
    if (it == state_.running.end()) continue;
    const std::string cause = GiveUpUnbound(it->second, hello);
    if (!cause.empty()) ReformLocked(job_id, cause, ReformKind::kAgentLost, out);
  }
  ScheduleLocked(out);
  return id;
}

void Scheduler::RemoveAgent(const std::string& agent_id) {
  Outbox out(*this);
  {
    absl::MutexLock lock(&state_.mu);
    if (!RemoveAgentLocked(agent_id, out)) return;
    ScheduleLocked(out);
  }
  out.Flush();
}

void Scheduler::OnAgentMessage(const std::string& agent_id, const v1::AgentMessage& message,
                               absl::Time join_deadline) {
  switch (message.kind_case()) {
    case v1::AgentMessage::kRankExited:
      return RankExited(agent_id, message.rank_exited());
    case v1::AgentMessage::kLogs:
      return Logs(agent_id, message.logs());
    case v1::AgentMessage::kHeartbeats:
      return AgentHeartbeats(agent_id, message.heartbeats(), message.cpu_pressure());
    case v1::AgentMessage::kJoins:
      return AgentJoins(agent_id, message.joins(), join_deadline);
    case v1::AgentMessage::kPingTimeUs: {
      absl::MutexLock lock(&state_.mu);
      return state_.agents.Heard(agent_id, clock_->Now(), message.cpu_pressure());
    }
    default:  // a second hello, or a kind this coordinator does not know
      return;
  }
}

bool Scheduler::RemoveAgentLocked(const std::string& agent_id, Outbox& out,
                                  std::vector<std::string>* rebinding) {
  const AgentRegistry::Agent* agent = state_.agents.Find(agent_id);
  if (agent == nullptr) return false;
  const v1::AgentHello hello = agent->hello;
  state_.RemoveAgent(agent_id);
  for (const std::string& job_id : state_.JobsOn(agent_id)) {
    AgentLoss loss = OnAgentLost(state_.running.at(job_id), agent_id, hello, reconnect_grace_,
                                 rebinding != nullptr, clock_->Now());
    switch (loss.kind) {
      case AgentLoss::Kind::kNone:
        break;
      case AgentLoss::Kind::kRebind:
        rebinding->push_back(job_id);
        break;
      case AgentLoss::Kind::kAwait:
        RecordEvent(job_id, std::move(loss.text), out);
        break;
      case AgentLoss::Kind::kReform:
        ReformLocked(job_id, loss.text, ReformKind::kAgentLost, out);
        break;
      case AgentLoss::Kind::kFail:
        EndLocked(job_id, v1::Job::FAILED, loss.text, out);
        break;
    }
  }
  return true;
}

void Scheduler::Schedule() {
  Outbox out(*this);
  {
    absl::MutexLock lock(&state_.mu);
    ScheduleLocked(out);
  }
  out.Flush();
}

void Scheduler::ScheduleLocked(Outbox& out) {
  // Running elastic jobs below resources.min_ranks come before queued jobs.
  RetryWaitingLocked(out);
  // A reservation holder short of slots takes them from lower-priority
  // elastic jobs; slots no queued job takes let running elastic jobs grow.
  if (PlaceQueuedLocked(out)) {
    PreemptLocked(out);
    GrowLocked(out);
  }
  SaveElasticLocked(out);
}

bool Scheduler::PlaceQueuedLocked(Outbox& out) {
  state_.AdvanceFairShare(clock_->Now());
  // A job that cannot resume fails without taking its slots: place again.
  for (bool replan = true; replan;) {
    replan = false;
    state_.Replan(jobs_);
    for (const JobPlacement& placement : state_.plan.placed) {
      absl::StatusOr<v1::Job> job = jobs_.Get(placement.job_id);
      if (!job.ok()) {
        LOG(ERROR) << "reading queued job " << placement.job_id << ": " << job.status();
        return false;
      }
      absl::StatusOr<v1::CheckpointManifest> resume = ResumeLocked(*job, out);
      if (!resume.ok()) {
        RecordFailure(job->job_id(),
                      absl::StrCat("cannot resume from ", job->resume_from(), ": ",
                                   resume.status().message()),
                      out);
        replan = true;
        break;
      }
      StartLocked(*job, placement, *std::move(resume), out);
    }
  }
  return true;
}

absl::StatusOr<v1::CheckpointManifest> Scheduler::ResumeLocked(const v1::Job& job, Outbox& out) {
  std::vector<std::string> skipped;
  absl::StatusOr<v1::CheckpointManifest> found = resume_.ForStart(job, &skipped);
  for (const std::string& warning : skipped) {
    RecordEvent(job.job_id(), absl::StrCat("warning: ", warning, "; using an older one"), out);
  }
  return found;
}
void Scheduler::StartLocked(const v1::Job& job, const JobPlacement& placement,
                            v1::CheckpointManifest resume, Outbox& out) {
  const std::string& job_id = job.job_id();
  const int world = static_cast<int>(placement.ranks.size());
  RunningJob run =
      RunningJob::Started(job, placement.ranks, std::move(resume), state_.agents, clock_->Now());
  auto recorded = std::make_shared<bool>(false);
  records_.Started(out.writes, job_id, world, run.Placements(state_.agents), recorded);
  Outbox::Launch& launch = out.launches.emplace_back();
  launch.job_id = job_id;
  launch.recorded = std::move(recorded);
  for (auto& [agent_id, message] : run.LaunchMessages(job_id, coordinator_address_)) {
    launch.messages.emplace_back(state_.agents.Find(agent_id)->send, std::move(message));
  }
  LOG(INFO) << "started " << job_id << " with " << world << " rank(s)";
  if (metrics_ != nullptr) metrics_->GenerationStarted("start");
  state_.running.erase(job_id);
  state_.running.emplace(job_id, std::move(run));
}

std::map<std::string, std::vector<int>> Scheduler::EndLocked(const std::string& job_id,
                                                             v1::Job::State state,
                                                             const std::string& reason,
                                                             Outbox& out) {
  auto it = state_.running.find(job_id);
  if (it == state_.running.end()) return {};
  std::map<std::string, std::vector<int>> to_stop = it->second.ReleaseSlots(state_.agents);
  it->second.mutable_rendezvous().Abort(
      absl::AbortedError(absl::StrCat("job ", job_id, " ended: ", reason)), out.joins);
  for (const auto& [agent_id, slots] : to_stop) {
    out.messages.emplace_back(state_.agents.Find(agent_id)->send,
                              StopRanksMessage(job_id, slots, reason));
  }
  // A report accepted before the end is written before it (Note [Reports
  // are written outside the scheduler's lock]).
  const std::shared_ptr<std::mutex> writes = it->second.report_writes;
  state_.running.erase(it);
  if (state != v1::Job::CANCELLED) records_.Ended(out.writes, job_id, state, reason, writes);
  return to_stop;
}

bool Scheduler::RequeueDueLocked(absl::Time now, Outbox& out) {
  const std::vector<std::pair<std::string, RequeueWait::Due>> due =
      state_.RequeuesDue(now, resume_);
  for (const auto& [job_id, d] : due) {
    if (d.warning.has_value()) RecordEvent(job_id, *d.warning, out);
    RequeueLocked(job_id, d.resume_step, d.reason, out);
  }
  return !due.empty();
}

void Scheduler::RequeueLocked(const std::string& job_id, int64_t resume_step,
                              const std::string& reason, Outbox& out) {
  auto it = state_.running.find(job_id);
  if (it == state_.running.end()) return;
  const std::shared_ptr<std::mutex> writes = it->second.report_writes;
  LOG(INFO) << job_id << ": " << reason;
  // Its ranks are stopped and their slots stay busy until they exit; no end
  // is recorded: the job is PENDING again once its write has run, and is
  // placed then (out.requeued).
  state_.StopForRequeue(job_id, EndLocked(job_id, v1::Job::CANCELLED, reason, out));
  records_.Requeued(out.writes, job_id, resume_step, reason, writes, &out.requeued);
}

void Scheduler::RankExited(const std::string& agent_id, const v1::RankExited& exited) {
  Outbox out(*this);
  {
    absl::MutexLock lock(&state_.mu);
    RankExitedLocked(agent_id, exited, out);
    ScheduleLocked(out);
  }
  out.Flush();
}

void Scheduler::RankExitedLocked(const std::string& agent_id, const v1::RankExited& exited,
                                 Outbox& out) {
  // Note [Re-queue]: a rank of a re-queued job's last run; its slot is free.
  if (state_.StoppedRankExited(agent_id, exited.slot(), exited.job_id())) return;
  auto it = state_.running.find(exited.job_id());
  if (it == state_.running.end()) return;  // already ended (e.g. stopped after a failure)
  const AgentRegistry::Agent* agent = state_.agents.Find(agent_id);
  if (agent == nullptr) return;
  if (std::optional<StagedGrowth::Actions> staged = it->second.mutable_staged().OnExited(
          agent_id, exited.slot(), it->second.phase().planned().has_value())) {
    // Note [Staged growth] in staged_growth.h: it was not a rank yet.
    ApplyLocked(exited.job_id(), ApplyStaged(it->second, exited.job_id(), *staged, state_.agents),
                out);
  } else if (it->second.mutable_leaving().OnExited(agent_id, exited.slot())) {
    // A rank that left at a planned re-formation (a drain, a preemption).
    state_.agents.SetBusy(agent_id, exited.slot(), false);
    LOG(INFO) << exited.job_id() << ": the rank that left slot " << exited.slot() << " of "
              << agent->hello.host() << " exited with code " << exited.exit_code();
  } else if (std::optional<JobEnd> end = it->second.RecordExit(agent_id, agent->hello, exited)) {
    if (end->state == v1::Job::FAILED && it->second.elastic) {
      ReformLocked(exited.job_id(), end->reason, ReformKind::kRankLost, out);
    } else {
      EndLocked(exited.job_id(), end->state, end->reason, out);
    }
  } else if (it->second.phase().restarting() != nullptr) {
    // Note [Restart-all]: a rank it stopped; the last one's exit starts
    // the next generation.
    const ElasticPhase::Restarting restarting = *it->second.phase().restarting();
    ReformLocked(exited.job_id(), restarting.cause, restarting.kind, out);
  }
}

absl::StatusOr<v1::Job> Scheduler::Cancel(const std::string& job_id, const std::string& reason) {
  // First the cancellation is written, which the answer waits for; then
  // the ranks are stopped.
  absl::StatusOr<v1::Job> job = absl::UnknownError("not cancelled");
  {
    Outbox out(*this);
    {
      absl::MutexLock lock(&state_.mu);
      std::shared_ptr<std::mutex> writes;
      if (auto running = state_.running.find(job_id); running != state_.running.end()) {
        writes = running->second.report_writes;
      }
      state_.Settle(job_id);  // not placed meanwhile
      out.settling.push_back(job_id);
      records_.Cancelled(out.writes, job_id, reason, writes, &job);
    }
    out.Flush();
  }
  if (!job.ok()) return job;
  Outbox out(*this);
  {
    absl::MutexLock lock(&state_.mu);
    EndLocked(job_id, v1::Job::CANCELLED, job->reason(), out);
    ScheduleLocked(out);
  }
  out.Flush();
  return job;
}

void Scheduler::Tick() {
  Outbox out(*this);
  {
    absl::MutexLock lock(&state_.mu);
    const absl::Time now = clock_->Now();
    state_.AdvanceFairShare(now);
    std::vector<std::pair<std::string, std::string>> to_fail;
    std::vector<std::string> to_reform;
    for (auto& [job_id, run] : state_.running) {
      run.mutable_rendezvous().Expire(now, out.joins);
      DeadlineCheck check = CheckDeadlines(run, now);
      for (const Eviction& e : check.evictions) {
        ApplyLocked(job_id, Evict(run, job_id, e, state_.agents), out);
      }
      if (check.event.has_value()) RecordEvent(job_id, *std::move(check.event), out);
      if (check.give_up_lost_agents) to_reform.push_back(job_id);
      if (check.fail.has_value()) to_fail.emplace_back(job_id, *std::move(check.fail));
    }
    for (const std::string& job_id : to_reform) {
      ReformLocked(job_id, GiveUpLostAgents(state_.running.at(job_id)), ReformKind::kAgentLost,
                   out);
    }
    RetryWaitingLocked(out);
    GrowLocked(out);
    if (RequeueDueLocked(now, out)) ScheduleLocked(out);
    // New and cleared diagnoses become events; then each job's hang policy
    // acts on its current ones.
    std::vector<std::string> diagnosed;
    for (auto& [job_id, run] : state_.running) {
      for (v1::JobEvent& event : run.UpdateDiagnoses(state_.agents, now)) {
        if (event.has_diagnosis() && metrics_ != nullptr) {
          metrics_->DiagnosisSeen(event.diagnosis().kind());
        }
        records_.Event(out.writes, job_id, std::move(event));
      }
      diagnosed.push_back(job_id);
    }
    for (const std::string& job_id : diagnosed) {
      auto running = state_.running.find(job_id);
      if (running == state_.running.end()) continue;  // ended by a hang restart before it
      RunningJob& run = running->second;
      DiagnosisCheck check = CheckDiagnoses(run, run.diagnoses_now(), now);
      for (const Eviction& e : check.evictions) {
        ApplyLocked(job_id, Evict(run, job_id, e, state_.agents), out);
      }
      if (check.restart.has_value()) {  // may end the job (past elastic.max_restarts)
        LOG(INFO) << job_id << ": " << *check.restart;
        ReformLocked(job_id, *check.restart, ReformKind::kHangRestart, out);
      }
      if (check.fail.has_value()) to_fail.emplace_back(job_id, *std::move(check.fail));
    }
    for (const auto& [job_id, reason] : to_fail) EndLocked(job_id, v1::Job::FAILED, reason, out);
    if (!to_fail.empty()) ScheduleLocked(out);
    SaveElasticLocked(out);
  }
  out.Flush();
}

void Scheduler::ApplyLocked(const std::string& job_id, JobActions actions, Outbox& out) {
  for (auto& [agent_id, message] : actions.messages) {
    if (const AgentRegistry::Agent* agent = state_.agents.Find(agent_id)) {
      out.messages.emplace_back(agent->send, std::move(message));
    }
  }
  for (const std::string& line : actions.logs) LOG(INFO) << job_id << ": " << line;
  for (std::string& message : actions.events) RecordEvent(job_id, std::move(message), out);
}

void Scheduler::RecordEvent(const std::string& job_id, std::string message, Outbox& out) {
  LOG(INFO) << job_id << ": " << message;
  v1::JobEvent event;
  event.set_message(std::move(message));
  records_.Event(out.writes, job_id, std::move(event));
}

void Scheduler::RecordFailure(const std::string& job_id, const std::string& reason, Outbox& out) {
  state_.Settle(job_id);  // the store lists it PENDING until the write
  out.settling.push_back(job_id);
  records_.Failed(out.writes, job_id, reason);
}

void Scheduler::Recover(const std::vector<v1::Job>& running, absl::Duration grace) {
  Outbox out(*this);
  absl::ReleasableMutexLock lock(&state_.mu);
  const absl::Time until = clock_->Now() + grace;
  for (const v1::Job& job : running) {
    if (job.placements().empty()) {
      RecordFailure(job.job_id(),
                    "the coordinator restarted and has no record of where this job's ranks ran",
                    out);
      continue;
    }
    absl::StatusOr<coordinator::ElasticRecord> record = job.spec().has_elastic()
                                                            ? jobs_.LoadElasticRecord(job.job_id())
                                                            : coordinator::ElasticRecord();
    LOG_IF(ERROR, !record.ok()) << job.job_id() << ": cannot read its elastic state (taken back "
                                << "as if it were steady): " << record.status();
    RunningJob run = RecoveredJob(job, until, record.value_or(coordinator::ElasticRecord()));
    // What the ranks that join from now on are told to resume from (Note [A
    // generation's checkpoint] in job_resume.h).
    if (absl::StatusOr<v1::CheckpointManifest> resume = ResumeLocked(job, out); resume.ok()) {
      run.ResumeFrom(*std::move(resume));
    } else {
      LOG(WARNING) << job.job_id() << ": its ranks that join again are told no checkpoint to "
                   << "resume from: " << resume.status().message();
    }
    run.ResumeFrom(resume_.ForGeneration(job.job_id(), run));
    if (metrics_ != nullptr) metrics_->GenerationStarted("recovered");
    RecordEvent(
        job.job_id(),
        absl::StrCat("the coordinator restarted; waiting up to ", absl::FormatDuration(grace),
                     " for its ", run.ranks().size(), " rank(s) to come back with their agents"),
        out);
    state_.running.erase(job.job_id());
    state_.running.emplace(job.job_id(), std::move(run));
  }
  // `chorus queue` lists state_.plan's order, and jobs missing from it in submit
  // order: plan the queue taken back now, not at the first placement pass
  // (an agent coming back), which may be seconds away after a takeover.
  state_.Replan(jobs_);
  lock.Release();
  out.Flush();
}

void Scheduler::set_coordinator_address(std::string address) {
  absl::MutexLock lock(&state_.mu);
  coordinator_address_ = std::move(address);
}

}  // namespace chorus
