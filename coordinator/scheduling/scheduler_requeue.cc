// Preemption by re-queueing: a running job that is not elastic is
// checkpointed, stopped and sent back to the queue so that a higher-priority
// job can start (preemption.h, docs/scheduling.md).
//
// Note [Re-queue]
// PreemptLocked (scheduler_elastic.cc) picks whole jobs by PlanPreemption.
// A job on the built-in trainer is checkpointable: it honours a checkpoint
// request (the `chorus checkpoint` signal) at its next step boundary,
// whatever its checkpoint schedule, and resumes from a checkpoint. A
// program job is not (nothing says it saves one), unless
// resources.preemptible lets it be stopped and started again from scratch.
//
// 1. The checkpointable job's ranks are answered, on their heartbeats, with
//    CHECKPOINT_AND_HOLD: they checkpoint at the end of the current step,
//    as for `chorus checkpoint`, and then train no further (a rank that
//    trained on would train steps the resumed run trains again). The step
//    they had reported and the newest committed checkpoint give
//    `target_step` (the next one after both). Its slots count as on their
//    way to the waiting job, so nothing else is preempted for it meanwhile.
//    A worker that does not know the directive trains on; the wait then
//    times out (step 2).
// 2. Every Tick (RequeueDueLocked) reads the job's newest committed
//    checkpoint. Once it reaches target_step, or after
//    requeue_checkpoint_timeout (then from the newest one there is, with
//    an event saying how many steps that loses), the ranks are told to stop
//    and the job becomes PENDING (JobManager::Requeue) with a reason naming
//    who preempted it and the step it resumes from, and resume_from set to
//    its own id: the newest complete checkpoint when it is placed again,
//    which a restarted coordinator reads from the state database as for
//    any job. Its place in the queue is its priority, fair share and submit
//    time, none of which changed.
// 3. The stopped ranks' slots stay busy until they exit (stopping_slots_):
//    a process that still holds the device is not a free slot, and the
//    exit of the old run's rank must not be taken for one of the next run
//    on the same slot.
// 4. Placed again, it starts as a new run: generation 1 of the job, whose
//    workers resume from the checkpoint exactly as a job submitted with
//    resume_from does. The worker reads a generation above 1 as an elastic
//    re-formation (survivors keep their memory), which a fresh start is
//    not; so the run restarts the generation count and its store keys get
//    a namespace of their own (`JOB/run-N/gen-G`, from Job.preemptions).
//
// A coordinator restart during step 2 takes the job back as RUNNING (its
// wait was in memory only); the next plan preempts it again and asks for a
// new checkpoint. Ranks that were already holding take no second one: the
// wait then times out and the job resumes from the checkpoint they held
// at, losing nothing but the wait. After step 2 the job is PENDING with its
// resume_from in the state database.
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
  for (const auto& [agent_id, slot] : live) {
    state_.agents.SetBusy(agent_id, slot, true);
    stopping_slots_[{agent_id, slot}] = job_id;
  }
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

bool Scheduler::StoppedRankExitedLocked(const std::string& agent_id, const v1::RankExited& exited) {
  auto it = stopping_slots_.find({agent_id, exited.slot()});
  if (it == stopping_slots_.end() || it->second != exited.job_id()) return false;
  stopping_slots_.erase(it);
  state_.agents.SetBusy(agent_id, exited.slot(), false);
  return true;
}

}  // namespace chorus
