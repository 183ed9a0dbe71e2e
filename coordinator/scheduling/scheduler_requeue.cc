// Preemption by re-queueing: a running job that is not elastic is
// checkpointed, stopped and sent back to the queue so that a higher-priority
// job can start (preemption.h, docs/scheduling.md; Note [Re-queue] in
// requeue_wait.h).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduling/preemption.h"
#include "coordinator/scheduling/scheduler.h"
#include "coordinator/scheduling/scheduling_policy.h"
#include "glog/logging.h"

namespace chorus {

bool Scheduler::RequeueDueLocked(absl::Time now, Outbox& out) {
  std::vector<std::pair<std::string, RequeueWait::Due>> due;
  for (auto& [job_id, run] : state_.running) {
    if (!run.requeue.active()) continue;
    if (std::optional<RequeueWait::Due> d = run.requeue.OnTick(resume_.NewestStep(job_id), now)) {
      due.emplace_back(job_id, *std::move(d));
    }
  }
  for (const auto& [job_id, d] : due) {
    if (d.warning.has_value()) {
      RecordEvent(job_id, *d.warning, out);
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
  // Placed once its write made it PENDING (out.requeued).
  records_.Requeued(out.writes, job_id, resume_step, reason, writes, &out.requeued);
  LOG(INFO) << job_id << ": " << reason;
}

}  // namespace chorus
