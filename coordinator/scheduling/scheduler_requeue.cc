// Preemption by re-queueing: a running job that is not elastic is
// checkpointed, stopped and sent back to the queue so that a higher-priority
// job can start (preemption.h, docs/scheduling.md; Note [Re-queue] in
// requeue_wait.h).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduling/scheduler.h"
#include "coordinator/scheduling/scheduling_policy.h"
#include "glog/logging.h"

namespace chorus {

int64_t Scheduler::NewestCheckpointLocked(const std::string& job_id) {
  if (!resolve_resume_) return 0;
  std::vector<std::string> skipped;  // placement warns about them, once
  absl::StatusOr<v1::CheckpointManifest> newest = resolve_resume_(job_id, &skipped);
  return newest.ok() ? newest->step() : 0;
}

void Scheduler::StartRequeueLocked(const std::string& job_id, RunningJob& run,
                                   const std::string& holder_id, const QueueEntry& holder,
                                   Outbox& out) {
  const std::string cause =
      absl::StrCat("preempted by ", holder_id, " (", PriorityName(holder.priority), ", ",
                   OwnerName(holder.owner), ")");
  v1::JobEvent to_holder;
  to_holder.set_message(absl::StrCat("preempting ", job_id, " (priority ",
                                     PriorityName(run.priority),
                                     "): it goes back to the queue to make room for this job"));
  RecordEvent(holder_id, std::move(to_holder), out);
  if (run.program) {  // resources.preemptible without checkpoints
    RequeueLocked(job_id, 0,
                  absl::StrCat(cause, "; starts again from scratch (resources.preemptible)"), out);
    return;
  }
  // Its ranks' heartbeats are answered with CHECKPOINT_AND_HOLD from now on.
  int64_t reported_step = 0;
  for (const RankState& rank : run.ranks) {
    reported_step = std::max(reported_step, rank.last_heartbeat.step());
  }
  run.requeue.Begin(cause, reported_step, NewestCheckpointLocked(job_id), clock_->Now(),
                    requeue_timeout_);
  v1::JobEvent event;
  event.set_message(absl::StrCat(cause, ": checkpointing at the next step boundary (step ",
                                 run.requeue.target_step(), " or later), then back to the queue"));
  LOG(INFO) << job_id << ": " << event.message();
  RecordEvent(job_id, std::move(event), out);
}

bool Scheduler::RequeueDueLocked(absl::Time now, Outbox& out) {
  std::vector<std::pair<std::string, RequeueWait::Due>> due;
  for (auto& [job_id, run] : state_.running) {
    if (!run.requeue.active()) continue;
    if (std::optional<RequeueWait::Due> d =
            run.requeue.OnTick(NewestCheckpointLocked(job_id), now)) {
      due.emplace_back(job_id, *std::move(d));
    }
  }
  for (const auto& [job_id, d] : due) {
    if (d.warning.has_value()) {
      v1::JobEvent event;
      event.set_message(*d.warning);
      LOG(WARNING) << job_id << ": " << event.message();
      RecordEvent(job_id, std::move(event), out);
    }
    RequeueLocked(job_id, d.resume_step, d.reason, out);
  }
  return !due.empty();
}

void Scheduler::RequeueLocked(const std::string& job_id, int64_t resume_step,
                              const std::string& reason, Outbox& out) {
  auto it = state_.running.find(job_id);
  if (it == state_.running.end()) return;
  std::vector<std::pair<std::string, int>> live;
  for (const RankState& rank : it->second.ranks) {
    if (!rank.agent_id.empty() && rank.state != v1::RankStatus::EXITED &&
        state_.agents.Find(rank.agent_id) != nullptr) {
      live.emplace_back(rank.agent_id, rank.slot);
    }
  }
  const std::shared_ptr<std::mutex> writes = it->second.report_writes;
  // Stops the ranks and frees the slots without recording an end.
  EndLocked(job_id, v1::Job::CANCELLED, reason, out);
  state_.StopForRequeue(job_id, live);
  out.writes.Add(job_id, [this, &out, job_id, resume_step, reason, writes] {
    std::lock_guard<std::mutex> reports_written(*writes);
    absl::StatusOr<v1::Job> queued =
        jobs_.Requeue(job_id, resume_step > 0 ? job_id : std::string(), reason);
    if (!queued.ok()) {
      LOG(ERROR) << job_id << ": could not send it back to the queue: " << queued.status();
      return;
    }
    out.requeued = true;  // placed once its write made it PENDING
  });
  LOG(INFO) << job_id << ": " << reason;
}

}  // namespace chorus
