#include "coordinator/scheduling/rank_messages.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace chorus {

HeartbeatAnswer RecordHeartbeat(RunningJob& run, const v1::RankHeartbeat& heartbeat, absl::Time now,
                                bool via_agent) {
  HeartbeatAnswer answer;
  if (run.elastic && heartbeat.generation() == run.generation() - 1) {
    // Note [A survivor that does not join]: heard, though not joined yet.
    const std::vector<int>& now_rank = run.rank_of_survivor();
    if (heartbeat.rank() >= 0 && heartbeat.rank() < static_cast<int>(now_rank.size()) &&
        now_rank[heartbeat.rank()] >= 0) {
      run.HeardFrom(now_rank[heartbeat.rank()], now);
    }
  }
  if (run.elastic && heartbeat.generation() < run.generation()) {
    answer.directive.set_kind(v1::Directive::RE_RENDEZVOUS);
    answer.directive.set_generation(run.generation());
    answer.directive.set_reason(run.history().empty() ? "" : run.history().back());
    return answer;
  }
  if (!run.HasRank(heartbeat.generation(), heartbeat.rank())) return answer;
  answer.live = true;
  run.OnHeartbeat(heartbeat, now, via_agent);
  // Note [Restart-all]: the program re-forms in its own process.
  if (heartbeat.reforms_in_process()) run.NoteReformsInProcess();
  if (run.phase().planned().has_value() && run.phase().waiting() == nullptr && run.Formed()) {
    answer.directive.set_kind(v1::Directive::REFORM_AT_STEP_BOUNDARY);
    answer.directive.set_generation(run.generation() + 1);
    answer.directive.set_reason(run.phase().planned()->cause);
    answer.directive.set_world_size(run.phase().planned()->world.value_or(0));
  }
  // Note [Re-queue]: a job preempted to go back to the queue.
  if (run.requeue().active()) {
    answer.directive.set_kind(v1::Directive::CHECKPOINT_AND_HOLD);
    answer.directive.set_reason(run.requeue().cause());
  }
  // A program job sends no metrics along the way: rank 0's heartbeats carry
  // the program's progress records.
  answer.progress = run.program && heartbeat.rank() == 0 && heartbeat.step() > 0;
  return answer;
}

JoinAnswer AnswerJoin(const RunningJob& run, const v1::JoinRequest& request) {
  JoinAnswer answer;
  const std::string& job_id = request.job_id();
  if (run.leaving().departing(request.agent_id(), request.slot())) {
    // A rank on a draining agent, at the step boundary: it leaves.
    answer.kind = JoinAnswer::Kind::kLeave;
    answer.leave.set_leave(true);
    answer.leave.set_generation(run.generation());
    return answer;
  }
  if (run.elastic && request.generation() > run.generation()) {
    // A survivor of the current generation: its communicator failed before
    // the coordinator heard why (docs/elastic.md).
    answer.refusal = absl::UnavailableError(absl::StrCat(
        "generation ", request.generation(), " of job ", job_id,
        " has not formed yet (the current one is ", run.generation(), "); join again shortly"));
    return answer;
  }
  // An elastic job's rank of an older generation whose slot is still the
  // job's joins the current one (a newcomer launched for a generation that
  // another failure superseded).
  if (absl::Status current = run.rendezvous().CheckGeneration(request.generation());
      !current.ok() && !run.elastic) {
    answer.refusal = std::move(current);
    return answer;
  }
  const int rank =
      run.RankOfJoin(request.agent_id(), request.slot(), request.pid(), request.host());
  if (rank < 0 && run.AwaitingRanks()) {
    // Note [Elastic restart], Note [Agent reconnect grace]: its agent has
    // not reconnected yet.
    answer.refusal = absl::UnavailableError(
        absl::StrCat("job ", job_id, " is taking back its ranks ",
                     run.wait_cause().lost_agents.empty() ? "after a coordinator restart"
                                                          : "from agents that lost contact",
                     "; join again shortly"));
  } else if (rank < 0) {
    answer.refusal = absl::NotFoundError(absl::StrCat(
        "job ", job_id, " has no rank on ", request.agent_id(), " slot ", request.slot()));
  } else {
    answer.kind = JoinAnswer::Kind::kJoin;
    answer.rank = rank;
  }
  return answer;
}

bool StartsPlannedChange(const RunningJob& run, const v1::JoinRequest& request) {
  return run.elastic && run.phase().planned().has_value() && run.phase().waiting() == nullptr &&
         !run.AwaitingRanks() && request.generation() == run.generation() + 1 && run.Formed();
}

absl::StatusOr<v1::Metrics> RecordReport(RunningJob& run, const v1::ReportRequest& report) {
  if (report.final() && report.success() && run.elastic && !run.RestartsAll() &&
      report.generation() >= 1 && report.generation() < run.generation()) {
    // Note [Diagnoses during shutdown]: the rank finished training in a
    // generation the job has left since (a restart ordered as it finished).
    run.NoteFinishedBeforeReform();
    return report.metrics();
  }
  if (!run.HasRank(report.generation(), report.rank())) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", report.rank(), " of generation ",
                                                      report.generation(), " is not part of job ",
                                                      report.job_id(), " now"));
  }
  if (report.final() && report.success()) {
    // A rank being stopped (a restart-all) whose program exits 0 on
    // SIGTERM did not finish training.
    run.FinishedTraining(report.rank());
  }
  v1::Metrics metrics = report.metrics();
  if (run.elastic) {  // what only the coordinator knows
    (*metrics.mutable_values())["restarts"] = run.restarts();
    (*metrics.mutable_values())["recovery_seconds"] = run.recovery_seconds();
  }
  return metrics;
}

v1::Metrics WithProgress(v1::Metrics latest, int64_t step, int64_t epoch, double loss,
                         double samples_per_second) {
  if (step < latest.step()) return latest;
  latest.set_step(step);
  latest.set_epoch(epoch);
  if (loss != 0) latest.set_loss(loss);
  if (samples_per_second != 0) latest.set_samples_per_second(samples_per_second);
  return latest;
}

v1::JoinResponse StagedJoinResponse(const v1::Job& job, const RunningJob& run,
                                    const StagedNewcomer& newcomer) {
  v1::JoinResponse response;
  response.set_rank(newcomer.rank);
  response.set_world_size(run.staged().world_size());
  response.set_generation(run.staged().generation());
  *response.mutable_spec() = job.spec();
  response.set_store_namespace(RunningJob::StoreNamespace(job, run.staged().generation()));
  response.set_local_rank(newcomer.slot.local_rank);
  response.set_local_world_size(newcomer.slot.local_world_size);
  if (!run.resume().job_id().empty()) *response.mutable_resume() = run.resume();
  response.set_restarts(run.restarts());
  response.set_staged(true);
  return response;
}

std::optional<v1::Directive> AbortDirective(const v1::Job& job) {
  if (job.state() != v1::Job::FAILED && job.state() != v1::Job::CANCELLED) return std::nullopt;
  v1::Directive directive;
  directive.set_kind(v1::Directive::ABORT);
  directive.set_reason(absl::StrCat("job ", job.job_id(), " is ", v1::Job::State_Name(job.state()),
                                    ": ", job.reason()));
  return directive;
}

void AddDirective(v1::RankDirectives& directives, const v1::RankHeartbeat& heartbeat, int slot,
                  const v1::Directive& directive) {
  v1::RankDirectives::Entry& entry = *directives.add_entries();
  entry.set_job_id(heartbeat.job_id());
  entry.set_slot(slot);
  entry.set_rank(heartbeat.rank());
  entry.set_generation(heartbeat.generation());
  *entry.mutable_directive() = directive;
}

absl::Status NotRunning(const absl::StatusOr<v1::Job>& job, const std::string& then) {
  if (!job.ok()) return job.status();
  return absl::FailedPreconditionError(
      absl::StrCat("job ", job->job_id(), " is ", v1::Job::State_Name(job->state()), then));
}

}  // namespace chorus
