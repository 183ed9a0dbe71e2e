// The Scheduler's elastic side (docs/elastic.md): changes of generation,
// planned changes (a drain, a growth, a preemption) that re-form at a step
// boundary the ranks agree on, and what a restart needs to take a job back.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduling/agent_departure.h"
#include "coordinator/scheduling/generation_change.h"
#include "coordinator/scheduling/job_recovery.h"
#include "coordinator/scheduling/rank_messages.h"
#include "coordinator/scheduling/scheduler.h"
#include "glog/logging.h"

namespace chorus {
void Scheduler::ReformLocked(const std::string& job_id, const std::string& cause, ReformKind kind,
                             Outbox& out) {
  auto it = state_.running.find(job_id);
  if (it == state_.running.end()) return;
  RunningJob& run = it->second;
  absl::StatusOr<v1::Job> job = jobs_.Get(job_id);
  if (!job.ok()) return;
  // The callbacks run inside ChangeGeneration, under the lock held here.
  const ChangeInputs in{*job, state_.agents, clock_->Now(),
                        [&] {
                          state_.mu.AssertHeld();
                          return run.staged().SlotsFirst(state_.agents, state_.UnreservedSlots());
                        },
                        [&] {
                          state_.mu.AssertHeld();
                          return state_.QuotaCapped(job_id, job->spec(), run);
                        }};
  GenerationChange change = ChangeGeneration(run, cause, kind, in);
  for (auto& answer : change.joins) out.joins.push_back(std::move(answer));
  for (const auto& [agent_id, slots] : change.stop) {
    out.messages.emplace_back(state_.agents.Find(agent_id)->send,
                              StopRanksMessage(job_id, slots, change.stop_reason));
  }
  for (std::string& message : change.events) RecordEvent(job_id, std::move(message), out);
  if (change.fail.has_value()) {
    EndLocked(job_id, v1::Job::FAILED, *change.fail, out);
    return;
  }
  if (!change.begun.has_value()) return;
  const GenerationBegun& begun = *change.begun;
  ApplyLocked(job_id, ApplyStaged(run, job_id, begun.staged, state_.agents), out);
  run.ResumeFrom(resume_.ForGeneration(job_id, run));
  if (metrics_ != nullptr) metrics_->GenerationStarted(std::string(ReformKindName(begun.kind)));
  LOG(INFO) << job_id << ": " << begun.change;
  records_.Reformed(out.writes, job_id, begun.generation, begun.world, run.restarts(), begun.change,
                    run.Placements(state_.agents));
  for (auto& [agent_id, message] : run.NewcomerLaunchMessages(job_id, coordinator_address_)) {
    out.messages.emplace_back(state_.agents.Find(agent_id)->send, std::move(message));
  }
}

void Scheduler::RequestReformLocked(const std::string& job_id, RunningJob& run,
                                    const std::string& cause, ReformKind kind, Outbox& out) {
  if (run.RestartsAll()) {
    ReformLocked(job_id, cause, kind, out);  // Note [Restart-all]: at once
    return;
  }
  // A drain goes first.
  ElasticPhase::Planned planned{cause, kind, std::nullopt};
  // What ReformLocked will plan if nothing changes before the boundary:
  // ranks on draining agents (and any gone) leave, free slots are taken.
  if (absl::StatusOr<v1::Job> job = jobs_.Get(job_id); job.ok()) {
    planned.world = PlannedWorld(run, state_.agents,
                                 run.staged().SlotsFirst(state_.agents, state_.UnreservedSlots()),
                                 state_.QuotaCapped(job_id, job->spec(), run));
  }
  if (!run.mutable_phase().Plan(std::move(planned))) return;  // a drain goes first
  RecordEvent(job_id,
              absl::StrCat("generation ", run.generation() + 1, " will form at the next ",
                           "step boundary after ", cause),
              out);
}

void Scheduler::RetryWaitingLocked(Outbox& out) {
  for (const std::string& job_id : state_.RetryableWaits(clock_->Now())) {
    auto it = state_.running.find(job_id);
    if (it == state_.running.end() || it->second.phase().waiting() == nullptr) continue;
    const ElasticPhase::Waiting wait = *it->second.phase().waiting();
    ReformLocked(job_id, wait.cause, wait.kind, out);
  }
}

bool Scheduler::StagedJoinLocked(const v1::JoinRequest& request, JoinDone& done, Outbox& out) {
  auto it = state_.running.find(request.job_id());
  if (it == state_.running.end()) return false;
  RunningJob& run = it->second;
  const StagedGrowth::JoinOutcome staged = run.mutable_staged().OnJoin(
      request.agent_id(), request.slot(), request.generation(), request.starts_program_first(),
      run.phase().planned().has_value());
  if (staged.kind == StagedGrowth::JoinOutcome::kStartsProgram) {
    // Its chorus-rank: the planned membership, so that it starts the program.
    absl::StatusOr<v1::Job> job = jobs_.Get(request.job_id());
    if (!job.ok()) return false;
    out.joins.emplace_back(std::move(done), StagedJoinResponse(*job, run, staged.newcomer));
    return true;
  }
  if (staged.kind != StagedGrowth::JoinOutcome::kUp) return false;
  // Its program: up and waiting.
  const int64_t generation = run.staged().generation();
  if (staged.request_change) {
    RequestReformLocked(request.job_id(), run, run.staged().cause(), ReformKind::kScaleUp, out);
  }
  out.joins.emplace_back(std::move(done),
                         absl::UnavailableError(absl::StrCat(
                             "generation ", generation, " of job ", request.job_id(),
                             " forms at its members' next step ", "boundary; join again shortly")));
  return true;
}

absl::StatusOr<v1::AgentInfo> Scheduler::DrainAgent(const std::string& name) {
  Outbox out(*this);
  v1::AgentInfo info;
  {
    absl::MutexLock lock(&state_.mu);
    absl::StatusOr<std::string> id = state_.agents.Resolve(name);
    if (!id.ok()) return id.status();
    if (!state_.agents.Find(*id)->draining) {
      LOG(INFO) << "agent " << *id << " (" << state_.agents.Find(*id)->hello.host()
                << ") is draining: it takes no new ranks";
      // Each change is requested in turn: a restart-all's may end its job.
      for (auto& [job_id, drain] : state_.Drain(*id)) {
        auto it = state_.running.find(job_id);
        if (drain.kind == AgentDrain::Kind::kStays) {
          RecordEvent(job_id, std::move(drain.text), out);
        } else if (it != state_.running.end()) {
          RequestReformLocked(job_id, it->second, drain.text, ReformKind::kDrain, out);
        }
      }
    }
    info = state_.AgentInfo(*id);
    ScheduleLocked(out);
  }
  out.Flush();
  return info;
}

void Scheduler::SaveElasticLocked(Outbox& out) {
  for (auto& [job_id, run] : state_.running) SaveElasticLocked(job_id, run, out);
}

void Scheduler::SaveElasticLocked(const std::string& job_id, RunningJob& run, Outbox& out) {
  if (!run.elastic) return;
  const coordinator::ElasticRecord record = ElasticRecordOf(run, state_.agents);
  // Taken for saved when the write is decided: one that fails is logged,
  // and the job's next change writes the record again.
  if (run.RecordChanged(record.SerializeAsString())) records_.Elastic(out.writes, job_id, record);
}

void Scheduler::GrowLocked(Outbox& out) {
  const absl::Time now = clock_->Now();
  // Growths are requested after the walk: a restart-all's may end a job.
  std::vector<std::pair<std::string, Growth>> growths;
  for (auto& [job_id, run] : state_.running) {
    ApplyLocked(job_id,
                ApplyStaged(run, job_id,
                            run.mutable_staged().OnTick(now, run.phase().planned().has_value()),
                            state_.agents),
                out);
    if (!MayGrow(run, now)) continue;
    absl::StatusOr<v1::Job> job = jobs_.Get(job_id);
    const int max_ranks = job.ok() ? job->spec().resources().max_ranks() : 0;
    // At max_ranks (as most jobs are, every Tick): no scan of the free slots.
    if (static_cast<int>(run.ranks().size()) >= max_ranks) continue;
    std::optional<Growth> growth = PlanGrowth(run, max_ranks, state_.UnreservedSlots(),
                                              state_.QuotaCapped(job_id, job->spec(), run));
    if (growth.has_value()) growths.emplace_back(job_id, *std::move(growth));
  }
  for (const auto& [job_id, growth] : growths) {
    auto it = state_.running.find(job_id);
    if (it == state_.running.end()) continue;
    if (growth.staged) {
      ApplyLocked(job_id,
                  StageGrowth(it->second, job_id, growth, state_.agents, coordinator_address_, now),
                  out);
    } else {
      RequestReformLocked(job_id, it->second, growth.cause, ReformKind::kScaleUp, out);
    }
  }
}

void Scheduler::PreemptLocked(Outbox& out) {
  PreemptionOrders orders = state_.Preempt(clock_->Now(), resume_, requeue_timeout_);
  for (auto& [job_id, text] : orders.events) RecordEvent(job_id, std::move(text), out);
  for (const auto& [job_id, cause] : orders.shrink) {
    auto it = state_.running.find(job_id);
    if (it != state_.running.end())
      RequestReformLocked(job_id, it->second, cause, ReformKind::kPreempt, out);
  }
  for (const auto& [job_id, reason] : orders.requeue) RequeueLocked(job_id, 0, reason, out);
}

}  // namespace chorus
