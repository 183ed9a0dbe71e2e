// ClusterReads: the coordinator's read side. What the status page, the CLI
// (`chorus status`, `logs`, `queue`, `agents`), /metrics, job submission's
// checks and checkpoint uploads ask of the cluster, answered from the
// ClusterState the Scheduler keeps (and the job records and rank output
// beside it). Nothing here changes the state.
//
// Thread-safety: every method takes the state's lock itself (no durable
// read runs under it); callable from any thread.
//
// Example:
//   const ClusterReads& reads = scheduler.reads();
//   v1::JobStatus status;
//   *status.mutable_job() = job;
//   reads.FillStatus(job.job_id(), status);
#ifndef CHORUS_COORDINATOR_SCHEDULING_CLUSTER_READS_H_
#define CHORUS_COORDINATOR_SCHEDULING_CLUSTER_READS_H_

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chorus/v1/coordinator.pb.h"
#include "common/clock.h"
#include "coordinator/checkpoint/checkpoint_grant.h"
#include "coordinator/http/coordinator_metrics.h"
#include "coordinator/scheduling/cluster_state.h"
#include "coordinator/scheduling/log_store.h"
#include "coordinator/scheduling/running_job.h"
#include "coordinator/state/job_manager.h"

namespace chorus {

class ClusterReads {
 public:
  // All four must outlive this.
  ClusterReads(const ClusterState& state, const JobManager& jobs, const LogStore& logs,
               Clock* clock)
      : state_(state), jobs_(jobs), logs_(logs), clock_(clock) {}
  ClusterReads(const ClusterReads&) = delete;
  ClusterReads& operator=(const ClusterReads&) = delete;

  // Adds a running job's rank summary, its rows for `rows` (and for the
  // ranks its diagnoses name) and its current diagnoses; for a PENDING job,
  // why it is not placed yet (after the reason it was sent back to the
  // queue, if it was).
  void FillStatus(const std::string& job_id, v1::JobStatus& status,
                  const StatusRows& rows = StatusRows()) const;
  // The job's logs per `request`; `complete` once it has ended and none of its
  // ranks is still running. NOT_FOUND for an unknown job.
  absl::StatusOr<v1::GetLogsResponse> GetLogs(const v1::GetLogsRequest& request) const;
  // The PENDING jobs in the order the last plan placed them (jobs submitted
  // since go last), each with its owner, priority, reason, and whether it
  // holds a reservation.
  v1::GetQueueResponse Queue() const;
  // Agents, slots, every running job (job, rank summary, the diagnoses
  // of the last Tick, and its rank rows if it has at most `max_rank_rows`
  // ranks, else only the rows of the ranks its diagnoses name), each user's
  // slots, jobs and fair share, and the queue by wait class into
  // `snapshot`, for /metrics and the status page.
  void Snapshot(ClusterSnapshot& snapshot, int max_rank_rows = INT_MAX) const;

  // Every connected agent, in registration order.
  std::vector<v1::AgentInfo> ListAgents() const;
  // Free slots of every agent.
  int free_slots() const;

  // FAILED_PRECONDITION naming the field and the figures when agents for the
  // spec's device are connected and none has the memory for one of its ranks
  // (common/memory_estimate.h). OK when no such agent is connected (placement
  // then waits for one that fits), when an agent does not report its memory,
  // and for a spec that does not validate (Submit says why).
  absl::Status CheckAgentsCanHold(v1::JobSpec spec) const;
  // Whether `owner` may submit `spec` now (CheckSubmission in
  // scheduling_policy.h): its priority ceiling and queued-job limit.
  absl::Status CheckSubmission(const v1::JobSpec& spec, const std::string& owner) const;
  // Who may upload a checkpoint of `job_id` now (CheckUploader): the job's
  // grant, FAILED_PRECONDITION for a job that is not running, a stale
  // generation or a rank that does not upload.
  absl::StatusOr<UploadGrant> GrantUpload(const std::string& job_id, int64_t generation,
                                          int rank) const;

 private:
  const ClusterState& state_;
  const JobManager& jobs_;
  const LogStore& logs_;
  Clock* const clock_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_CLUSTER_READS_H_
