// JobManager: the coordinator's jobs — submission, lookup, cancellation — and
// their event history, persisted in a StateStore before any call returns.
//
// Placement onto node agents and rendezvous attach here as they are built;
// until then a submitted job stays PENDING until it is cancelled.
//
// Thread-safety: all methods may be called concurrently. No method holds
// the manager's lock across a durable write (Note [Durable writes outside
// the lock]): one job's slow write holds up neither reads nor other jobs.
//
// Example:
//   ASSIGN_OR_RETURN(auto jobs, JobManager::Create(*state, clock));
//   ASSIGN_OR_RETURN(v1::Job job, jobs->Submit(spec, ""));
//   ASSIGN_OR_RETURN(v1::Job cancelled, jobs->Cancel(job.job_id(), "no longer needed"));
#ifndef CHORUS_COORDINATOR_STATE_JOB_MANAGER_H_
#define CHORUS_COORDINATOR_STATE_JOB_MANAGER_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/coordinator.pb.h"
#include "common/clock.h"
#include "coordinator/state/state_store.h"

namespace chorus {

class JobManager {
 public:
  // Default of the queue limit (--max_pending_jobs).
  static constexpr int kDefaultMaxPendingJobs = 5000;

  // Default of how many ended jobs are kept in memory (Note [Only the
  // newest ended jobs in memory]).
  static constexpr int kDefaultEndedJobsInMemory = 256;

  // Loads the jobs in `state`. `state` and `clock` (null = real time) are
  // not owned and must outlive the manager. At most `max_pending_jobs` jobs
  // wait PENDING at once (jobs loaded from `state` may exceed it; then no
  // new one is taken until enough have started or ended). Of the jobs that
  // have ended, the newest `ended_jobs_in_memory` are kept in memory and
  // the others are read from `state` when asked for.
  static absl::StatusOr<std::unique_ptr<JobManager>> Create(
      StateStore& state, Clock* clock, int max_pending_jobs = kDefaultMaxPendingJobs,
      int ended_jobs_in_memory = kDefaultEndedJobsInMemory);

  // Normalizes and validates `spec` (INVALID_ARGUMENT listing every problem),
  // checks `resume_from` ("JOB" or "JOB:STEP", NOT_FOUND for an unknown job),
  // and stores the new job as PENDING, owned by `owner` (Job.owner).
  // RESOURCE_EXHAUSTED when the queue already holds max_pending_jobs
  // PENDING jobs.
  absl::StatusOr<v1::Job> Submit(v1::JobSpec spec, const std::string& resume_from,
                                 const std::string& owner = "");
  absl::StatusOr<v1::Job> Get(const std::string& job_id) const;
  // The ids of the PENDING jobs, oldest first (they are all in memory: no
  // job is copied and no database read).
  std::vector<std::string> PendingJobIds() const;
  // Newest first; only `states` if not empty; at most `limit` (0 = all).
  // With `older_than` set (a job id), only jobs submitted before that one.
  // Fails only if the state database cannot be read.
  absl::StatusOr<std::vector<v1::Job>> List(const std::vector<v1::Job::State>& states, int limit,
                                            const std::string& older_than = "") const;
  // How many jobs are in each state (every state present, 0 included).
  std::map<v1::Job::State, int64_t> CountByState() const;
  // The FAILED jobs among the ended jobs held in memory (Note [Only the
  // newest ended jobs in memory]), latest end first, at most `limit`; no
  // database read. /metrics shows their reasons.
  std::vector<v1::Job> NewestFailed(int limit) const;
  // How many jobs are held in memory: those that have not ended and at most
  // ended_jobs_in_memory ended ones.
  size_t JobsInMemory() const;
  // FAILED_PRECONDITION if the job already ended.
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const std::string& reason);
  // PENDING -> RUNNING in `generation` with `world_size` ranks.
  absl::StatusOr<v1::Job> MarkRunning(const std::string& job_id, int64_t generation,
                                      int world_size);
  // An elastic job's next generation (RUNNING -> RUNNING): its number, world
  // size and the restarts used so far; `reason` (what happened, which ranks
  // left and joined) becomes the state event's reason.
  absl::StatusOr<v1::Job> MarkReformed(const std::string& job_id, int64_t generation,
                                       int world_size, int restarts, const std::string& reason);
  // RUNNING -> PENDING: a higher-priority job preempted it (Note [Re-queue]
  // in requeue_wait.h). `reason` becomes Job.reason (shown while it
  // waits) and the event's; a non-empty `resume_from` replaces the job's
  // (its own newest checkpoint); preemptions counts one more. Keeps its
  // submit time, and so its place among jobs of its priority.
  // FAILED_PRECONDITION if the job is not running.
  absl::StatusOr<v1::Job> Requeue(const std::string& job_id, const std::string& resume_from,
                                  const std::string& reason);
  // Records where the running job's ranks are (index = rank), durably.
  absl::Status SavePlacements(const std::string& job_id,
                              const std::vector<v1::RankPlacement>& placements);
  // An elastic job's change of generation in progress, durably (Note
  // [Elastic restart] in job_recovery.h); the saved one (empty if none).
  absl::Status SaveElasticRecord(const std::string& job_id,
                                 const coordinator::ElasticRecord& record);
  absl::StatusOr<coordinator::ElasticRecord> LoadElasticRecord(const std::string& job_id);
  // Ends a job that has not ended (SUCCEEDED or FAILED) with `reason`.
  absl::StatusOr<v1::Job> Finish(const std::string& job_id, v1::Job::State state,
                                 const std::string& reason);
  // Fails every RUNNING job with `reason`; returns how many. A restarted
  // coordinator calls it: it no longer knows those jobs' ranks, and agents
  // stop their ranks when they lose the coordinator.
  int FailRunning(const std::string& reason);
  // Replaces the job's latest metrics; `persist` also writes them to disk
  // (final metrics), otherwise they live in memory only.
  absl::Status UpdateMetrics(const std::string& job_id, const v1::Metrics& metrics, bool persist);
  // The job with one row per rank and its diagnoses.
  absl::StatusOr<v1::JobStatus> Status(const std::string& job_id) const;
  absl::StatusOr<std::vector<v1::JobEvent>> Events(const std::string& job_id, int64_t after_seq);
  // Records an event that is not a state change (metrics, a diagnosis, a
  // message): seq and time are set here; persisted before it returns.
  absl::Status AddEvent(const std::string& job_id, v1::JobEvent event);

  // Calls `wake` after every new event of `job_id` (on the recording thread,
  // with no lock of this class held except the subscribers' own, so `wake`
  // may call Events but must not Subscribe or Unsubscribe). Unsubscribe waits
  // for a running `wake` to return, so after it `wake`'s captures may go.
  int64_t Subscribe(const std::string& job_id, std::function<void()> wake);
  void Unsubscribe(int64_t handle);

  static bool IsTerminal(v1::Job::State state);
  // Facts derived from a job's stored spec. They live here, beside the spec
  // the manager normalizes and keeps, rather than as normalization defaults:
  // filling keep_last in would change the stored spec and so its hash, and
  // jobs stored before would still lack it.
  //
  // The SHA-256 (hex) of the serialized spec, recorded in its checkpoints.
  static std::string SpecHash(const v1::JobSpec& spec);
  // checkpoint.keep_last, or its documented default (3) when unset.
  static int KeepLast(const v1::JobSpec& spec);
  static constexpr int kDefaultKeepLast = 3;

 private:
  JobManager(StateStore& state, Clock* clock, int max_pending_jobs, int ended_jobs_in_memory)
      : state_(state),
        clock_(clock ? clock : &real_clock_),
        max_pending_jobs_(max_pending_jobs),
        ended_jobs_in_memory_(ended_jobs_in_memory) {}
  // Note [Ended jobs are kept packed]
  // A coordinator keeps the jobs it ran, and a job that has ended no longer
  // changes, so it is kept serialized (a few hundred bytes instead of a few
  // kilobytes of message objects: a soak of 2,000 jobs grew the coordinator by
  // 3 MB per 1,000) and parsed when it is read.
  class StoredJob {
   public:
    // Keeps `job`, packed when it has ended.
    void Set(v1::Job job);
    v1::Job Get() const;
    v1::Job::State state() const { return state_; }
    // The metrics of a job that has not ended, if it has any; else null.
    const v1::Metrics* live_metrics() const {
      return live_ != nullptr && live_->has_latest_metrics() ? &live_->latest_metrics() : nullptr;
    }
    int64_t last_event_seq = 0;  // kUnknownSeq: not read from the database yet

   private:
    v1::Job::State state_ = v1::Job::STATE_UNSPECIFIED;
    std::unique_ptr<v1::Job> live_;  // while it has not ended
    std::string packed_;             // once it has
  };
  static constexpr int64_t kUnknownSeq = -1;
  // Submit's checks and the new job (numbered next_number_), not yet stored.
  absl::Status NewJobLocked(v1::JobSpec spec, const std::string& resume_from,
                            const std::string& owner, v1::Job& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job in memory, or else in the database; NOT_FOUND if neither has it.
  absl::StatusOr<v1::Job> LoadLocked(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the job exists (NOT_FOUND if not, another error if the
  // database cannot be read).
  absl::Status CheckExistsLocked(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The seq of the job's newest event.
  absl::StatusOr<int64_t> LastEventSeqLocked(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps `job` in memory (or updates it there); an ended job beyond the
  // newest ended_jobs_in_memory_ leaves memory.
  void KeepLocked(v1::Job job, int64_t last_event_seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies `change` (which returns the event's reason) to a copy of a job
  // that has not ended, persists it, then publishes it. FAILED_PRECONDITION
  // if the job already ended.
  absl::StatusOr<v1::Job> Transition(const std::string& job_id,
                                     const std::function<std::string(v1::Job&)>& change);
  // Persists a state change of `job` and its event; returns the event's seq.
  absl::StatusOr<int64_t> Record(const v1::Job& job, int64_t last_event_seq,
                                 const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps `job`, just written, in memory with the metrics memory holds now
  // (newer than the copy's if UpdateMetrics ran during the write).
  void KeepWrittenLocked(v1::Job& job, int64_t last_event_seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NotFound(const std::string& job_id) const;
  // Wakes the subscribers of `job_id`; call without mu_ held.
  void Publish(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);

  StateStore& state_;
  RealClock real_clock_;
  Clock* const clock_;
  const int max_pending_jobs_;
  const int ended_jobs_in_memory_;

  // Note [Only the newest ended jobs in memory]
  // Packing (above) still left a long-running coordinator growing by ~1 KB per
  // job it ever ran. What users read of old jobs (`chorus jobs` pages, `chorus
  // status OLD-JOB`) is rare and can wait for a read of the state database,
  // which holds every job anyway. So memory holds every job that has not ended
  // and only the newest ended ones; when more have ended, the one with the
  // smallest id leaves. Every job whose id is above `evicted_max_` (the
  // greatest id that left) is therefore in memory, which is what List relies
  // on; below it, the database is the index and a job still in memory (one that
  // has not ended) is taken from memory, whose metrics are newer.
  //
  // Note [Durable writes outside the lock]
  // A durable write is an fsync'd SQLite commit or an etcd transaction: on a
  // slow disk or a slow etcd it takes seconds. Every heartbeat, status call and
  // placement round reads jobs here, so mu_ guards memory only and is never
  // held across a write: a change reads the job under mu_, writes without it,
  // then publishes the written job under mu_ again. Readers meanwhile see the
  // job as it was, so nothing is shown before it is durable. One job's changes
  // stay in order, each holding that job's writer lock (WriterLock) from its
  // read to its publication; submissions hold submit_mu_, which numbers jobs
  // in order. Metrics that are not persisted (UpdateMetrics without
  // `persist`) take no writer lock, so that a heartbeat never waits for a
  // write, and a change publishes the metrics memory holds when it ends.
  class WriterLock;
  struct Writer {
    absl::Mutex mu;
    int users = 0;  // holding or waiting for `mu`; the entry goes at 0
  };
  absl::Mutex submit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::map<std::string, Writer> writers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, StoredJob> jobs_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> ended_in_memory_ ABSL_GUARDED_BY(mu_);
  std::string evicted_max_ ABSL_GUARDED_BY(mu_);  // empty while none left
  std::map<v1::Job::State, int64_t> evicted_by_state_ ABSL_GUARDED_BY(mu_);
  int64_t next_number_ ABSL_GUARDED_BY(mu_) = 1;

  struct Subscriber {
    std::string job_id;
    std::function<void()> wake;
  };
  absl::Mutex subscribers_mu_;
  std::map<int64_t, Subscriber> subscribers_ ABSL_GUARDED_BY(subscribers_mu_);
  int64_t next_subscriber_ ABSL_GUARDED_BY(subscribers_mu_) = 1;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_STATE_JOB_MANAGER_H_
