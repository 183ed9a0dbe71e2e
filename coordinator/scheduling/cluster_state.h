// ClusterState: what the coordinator holds about the cluster under its one
// lock: the agents and their slots, the running jobs, the scheduling policy
// and fair share, and the last plan of the queue. The Scheduler changes it;
// ClusterReads (cluster_reads.h) answers the status pages, the CLI and
// /metrics from it.
//
// Thread-safety: every field but `mu` is guarded by `mu`.
//
// Example:
//   ClusterState state(policy, clock->Now());
//   absl::MutexLock lock(&state.mu);
//   QueueUsage usage = state.Usage();
#ifndef CHORUS_COORDINATOR_SCHEDULING_CLUSTER_STATE_H_
#define CHORUS_COORDINATOR_SCHEDULING_CLUSTER_STATE_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/scheduling/agent_departure.h"
#include "coordinator/scheduling/agent_registry.h"
#include "coordinator/scheduling/fair_share.h"
#include "coordinator/scheduling/job_resume.h"
#include "coordinator/scheduling/placement.h"
#include "coordinator/scheduling/preemption.h"
#include "coordinator/scheduling/queue_plan.h"
#include "coordinator/scheduling/running_job.h"
#include "coordinator/scheduling/scheduling_policy.h"
#include "coordinator/state/job_manager.h"

namespace chorus {

// What the queue's reservation holders short of slots take from running
// jobs (ClusterState::Preempt), in the order the Scheduler applies it.
struct PreemptionOrders {
  // Events for jobs' histories (job id, text), in order.
  std::vector<std::pair<std::string, std::string>> events;
  // Elastic jobs whose yielding ranks leave at their next step boundary:
  // (job id, the change's cause).
  std::vector<std::pair<std::string, std::string>> shrink;
  // Jobs that go back to the queue now, from scratch: (job id, reason).
  std::vector<std::pair<std::string, std::string>> requeue;
};

struct ClusterState {
  // Fair share starts counting at `now`, with the policy's half-life.
  ClusterState(SchedulingPolicy scheduling_policy, absl::Time now)
      : policy(std::move(scheduling_policy)), fair_share(policy.fair_share_half_life, now) {}

  // Each owner's slots in use per device (running jobs), fair share, and
  // the reservations the last plan kept.
  QueueUsage Usage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The agent's slots, state (ACTIVE, DRAINING, DRAINED) and the running
  // jobs with ranks on it; empty for an unknown agent.
  v1::AgentInfo AgentInfo(const std::string& agent_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The agents' free slots less those the queue's reservations hold (Note
  // [Reservation] in queue_plan.h): what running elastic jobs may grow onto.
  std::vector<AgentSlots> UnreservedSlots() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // `job_id` (running as `run`) as a re-formation plans it: its max_ranks
  // capped so that its owner's quota on its device holds, counting its own
  // current ranks as in use; never below its current ranks or min_ranks.
  QueuedJob QuotaCapped(const std::string& job_id, const v1::JobSpec& spec,
                        const RunningJob& run) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Running elastic jobs that may give up ranks now (Note [Preemption by
  // shrinking] in preemption.h): steady, none leaving, not a restart-all.
  std::vector<ElasticRun> Preemptible() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Running jobs that are not elastic and may go back to the queue now
  // (Note [Re-queue] in requeue_wait.h): steady, none on its way.
  std::vector<RequeueRun> Requeueable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The running jobs with a rank on agent `agent_id` that has not exited.
  std::vector<std::string> JobsOn(const std::string& agent_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Elastic jobs waiting below resources.min_ranks that may try to form
  // again at `now`: all but those still awaiting ranks after a restart
  // before their wait is over (Note [Elastic restart] in job_recovery.h: a
  // survivor not back yet would count as lost).
  std::vector<std::string> RetryableWaits(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Counts every running job's slots into its owner's fair share up to
  // `now`.
  void AdvanceFairShare(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The PENDING jobs in submit order as the plan sees them, from `jobs`
  // less those running here or `settling`. Entries are kept in
  // queue_entries between calls, so a job's record is read once while it
  // waits.
  std::vector<QueueEntry> RefreshQueue(const JobManager& jobs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Plans the queue afresh (PlanQueue over RefreshQueue, the free slots,
  // Usage and the policy) into `plan`.
  void Replan(const JobManager& jobs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A write that ends or starts `job_id` is on its way (Settle) or done
  // (Settled: once per Settle).
  void Settle(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { ++settling[job_id]; }
  void Settled(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Note [Re-queue] in requeue_wait.h: the ranks of a re-queued job, at
  // (agent id, slot), were told to stop; their slots stay busy until they
  // exit.
  void StopForRequeue(const std::string& job_id,
                      const std::map<std::string, std::vector<int>>& slots)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The jobs whose wait for a checkpoint is over at `now` (RequeueWait::
  // OnTick, `resume` giving a job's newest committed step): what each goes
  // back to the queue with.
  std::vector<std::pair<std::string, RequeueWait::Due>> RequeuesDue(absl::Time now,
                                                                    const JobResume& resume)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A rank of `job_id` on (agent, slot) exited: if a re-queue stopped it,
  // its slot is free and this returns true.
  bool StoppedRankExited(const std::string& agent_id, int slot, const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The agent's stream ended: it is gone, with its stopping ranks' slots.
  void RemoveAgent(const std::string& agent_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // `chorus drain`: agent `agent_id` takes no new ranks; for each running
  // job with ranks there, what OnAgentDrained (agent_departure.h) says it
  // does with them (an elastic job re-forms without them, any other keeps
  // them there).
  std::vector<std::pair<std::string, AgentDrain>> Drain(const std::string& agent_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Slots of `device` already on their way to the job waiting for it
  // (Note [Preemption by shrinking] in preemption.h): those the last plan
  // reserved, those of ranks leaving at a planned re-formation, of jobs
  // checkpointing before they go back to the queue, and of re-queued jobs'
  // ranks that have not exited.
  int SlotsComing(v1::ResourceSpec::Device device) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Each reservation holder of the last plan that lacks slots takes them
  // from lower-priority running jobs (PlanPreemption): an elastic job's
  // ranks yield (Note [Preemption by shrinking] in preemption.h); a
  // checkpointable job begins its wait for a checkpoint (Note [Re-queue] in
  // requeue_wait.h: `resume` gives a job's newest committed step, the wait
  // lasts `requeue_timeout` from `now`); a preemptible program goes back to
  // the queue at once.
  PreemptionOrders Preempt(absl::Time now, const JobResume& resume, absl::Duration requeue_timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  mutable absl::Mutex mu;
  AgentRegistry agents ABSL_GUARDED_BY(mu);
  std::map<std::string, RunningJob> running ABSL_GUARDED_BY(mu);
  SchedulingPolicy policy ABSL_GUARDED_BY(mu);
  FairShare fair_share ABSL_GUARDED_BY(mu);
  QueuePlan plan ABSL_GUARDED_BY(mu);  // the last one (reasons, reservations)
  // Each PENDING job as the plan sees it, kept between passes: a pass with
  // 10,000 queued jobs then copies none of them (docs/scheduling.md).
  std::map<std::string, QueueEntry> queue_entries ABSL_GUARDED_BY(mu);
  // Jobs whose end (or start) is being written: the store may still list
  // them PENDING (Note [The scheduler's writes after its lock] in
  // call_outbox.h). A count: several calls may write one job's changes.
  std::map<std::string, int> settling ABSL_GUARDED_BY(mu);
  // (agent, slot) -> job: ranks of re-queued jobs that were told to stop and
  // have not exited yet. Their exits are not taken for the exits of the
  // job's next run.
  std::map<std::pair<std::string, int>, std::string> stopping ABSL_GUARDED_BY(mu);
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_CLUSTER_STATE_H_
