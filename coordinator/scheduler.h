// Scheduler: node agents, placement of queued jobs onto their slots, and
// generation-based rendezvous of the ranks. gRPC-free; the AgentService and
// RankService adapters call it.
//
// Placement is strict FIFO: the oldest PENDING job starts as soon as at least
// its min_ranks slots of its device are free, taking up to max_ranks; later
// jobs wait behind it (no starvation). Ranks are numbered in a stable order:
// agents by registration, then slots. A job's ranks join generation 1; Join
// answers every rank at once when the last one arrives. A rank exiting with a
// non-zero code, or its agent vanishing, fails the job and stops its other
// ranks; all ranks exiting 0 is success. Elastic re-formation (generation 2+)
// comes later: a stale generation is refused with the current one.
//
// Thread-safety: all methods may be called concurrently. Senders and Join
// callbacks run without the scheduler's lock held.
//
// Example:
//   Scheduler scheduler(jobs, &clock, "127.0.0.1:29650");
//   std::string agent = scheduler.AddAgent(hello, [&](const v1::CoordinatorMessage& m) {...});
//   scheduler.Join(request, deadline, [](absl::StatusOr<v1::JoinResponse> r) {...});
#ifndef CHORUS_COORDINATOR_SCHEDULER_H_
#define CHORUS_COORDINATOR_SCHEDULER_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/coordinator.pb.h"
#include "common/clock.h"
#include "coordinator/job_manager.h"
#include "coordinator/log_store.h"

namespace chorus {

class Scheduler {
 public:
  using Sender = std::function<void(const v1::CoordinatorMessage&)>;
  using JoinDone = std::function<void(absl::StatusOr<v1::JoinResponse>)>;

  // `jobs` and `clock` (null = real time) must outlive the scheduler.
  // `coordinator_address` is what launched ranks are told to dial.
  Scheduler(JobManager& jobs, Clock* clock, std::string coordinator_address);

  // Registers an agent and places whatever now fits. Returns its id.
  // INVALID_ARGUMENT for a hello without slots.
  absl::StatusOr<std::string> AddAgent(const v1::AgentHello& hello, Sender send);
  // The agent's stream ended: its running jobs fail, its slots are gone.
  void RemoveAgent(const std::string& agent_id);
  // An agent reports that a rank process ended.
  void RankExited(const std::string& agent_id, const v1::RankExited& exited);

  // Answers when every rank of the generation has joined, or with
  // DEADLINE_EXCEEDED (naming the missing ranks) once `deadline` passes
  // (checked by Tick), FAILED_PRECONDITION for a stale generation or
  // a job that is not running, NOT_FOUND for an unknown job or slot.
  void Join(const v1::JoinRequest& request, absl::Time deadline, JoinDone done);
  // Fails joins whose deadline has passed, and applies each running job's
  // hang_detection.action to its diagnoses (ABORT and RESTART fail the job
  // with the diagnosis; RESTART says that restarting needs elastic
  // generations, which are not built yet). The server calls it periodically.
  void Tick();

  // A rank's metrics: rank 0's become the job's latest (final ones are
  // persisted). NOT_FOUND / FAILED_PRECONDITION for unknown or stale ranks.
  absl::Status Report(const v1::ReportRequest& report);
  // Records a rank's heartbeat (progress, phase, flight recorder) for status.
  // Returns false when the rank is not part of a running generation (the
  // stream should end).
  bool Heartbeat(const v1::RankHeartbeat& heartbeat);
  // Makes the job's ranks checkpoint soon: their agents signal them (a
  // CheckpointRanks message). Returns the highest step a rank has reported.
  // NOT_FOUND for an unknown job, FAILED_PRECONDITION if it is not running.
  absl::StatusOr<int64_t> RequestCheckpoint(const std::string& job_id);
  // Cancels a job (through JobManager) and stops its running ranks.
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const std::string& reason);
  // Places queued jobs that fit. Called after every change; public for tests.
  void Schedule();
  // Adds one row per rank of a running job and its current diagnoses.
  void FillStatus(const std::string& job_id, v1::JobStatus& status) const;
  // Resolves a job's resume_from ("JOB" or "JOB:STEP") to the checkpoint it
  // starts from; unusable checkpoints it skipped go to `skipped`.
  using ResumeResolver = std::function<absl::StatusOr<v1::CheckpointManifest>(
      const std::string& resume_from, std::vector<std::string>* skipped)>;
  void set_resume_resolver(ResumeResolver resolver);

  // Who may upload a checkpoint of `job_id` now: rank 0 of its current
  // generation (DDP replicas are identical). Returns the manifest fields the
  // coordinator fills in (world size, strategy, spec hash, generation) and
  // the job's keep_last. FAILED_PRECONDITION for a stale generation or
  // another rank, NOT_FOUND/FAILED_PRECONDITION if the job is not running.
  struct UploadGrant {
    v1::CheckpointManifest manifest;
    int keep_last = 0;
    // checkpoint.storage SHARED_DIR: the job's shared directory; else empty.
    std::string shared_dir;
  };
  absl::StatusOr<UploadGrant> GrantUpload(const std::string& job_id, int64_t generation, int rank) const;

  // After a restart: takes back jobs that were RUNNING (with their recorded
  // placements). Their ranks are expected to come back with their agents;
  // a job whose ranks are not all back within `grace` fails with the reason.
  void Recover(const std::vector<v1::Job>& running, absl::Duration grace);

  // Output lines of a rank process, relayed by its agent.
  void Logs(const std::string& agent_id, const v1::RankLogs& logs);
  // The job's logs per `request`; `complete` once it has ended and none of its
  // ranks is still running. NOT_FOUND for an unknown job.
  absl::StatusOr<v1::GetLogsResponse> GetLogs(const v1::GetLogsRequest& request) const;

  int free_slots() const;
  // What launched ranks are told to dial (known once the server has bound).
  void set_coordinator_address(std::string address);

 private:
  struct Agent {
    v1::AgentHello hello;
    Sender send;
    std::vector<bool> busy;  // per slot
    int64_t order = 0;       // registration order
  };
  struct Placement {
    std::string agent_id;
    int slot = 0;
    int local_rank = 0;
    int local_world_size = 0;
    v1::RankStatus::State state = v1::RankStatus::LAUNCHING;
    int64_t pid = 0;
    int exit_code = 0;
    bool joined = false;
    // For a job taken back after a restart, until its agent reconnects.
    std::string recover_host;
    int64_t recover_agent_pid = 0;
    JoinDone pending;  // the join waiting for the others
    absl::Time join_deadline;
    v1::RankHeartbeat last_heartbeat;
    absl::Time heartbeat_at = absl::InfinitePast();
  };
  struct Running {
    v1::HangDetectionSpec hang_detection;
    int64_t generation = 1;
    std::vector<Placement> ranks;  // index = rank
    int exited_ok = 0;
    // When each current diagnosis (by DiagnosisKey) was first seen; a
    // diagnosis becomes a job event when it first appears.
    std::map<std::string, int64_t> diagnoses_seen_us;
    // The checkpoint the job resumes from (empty job_id: none).
    v1::CheckpointManifest resume;
    v1::CheckpointManifest upload_template;
    int keep_last = 0;
    std::string shared_dir;  // checkpoint.storage SHARED_DIR
    // Set while a job taken back after a restart waits for its ranks.
    absl::Time recovering_until = absl::InfinitePast();
  };
  // Work to do once the lock is released.
  struct Outbox {
    std::vector<std::pair<Sender, v1::CoordinatorMessage>> messages;
    std::vector<std::pair<JoinDone, absl::StatusOr<v1::JoinResponse>>> joins;
    void Flush();
  };

  // The bookkeeping of a job starting (or taken back) with `world` ranks in
  // `generation`; ranks are added by the caller.
  static Running NewRunning(const v1::Job& job, int world, int64_t generation);
  void ScheduleLocked(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a running job: frees its slots, stops its other ranks, fails its
  // pending joins, records the state.
  void EndLocked(const std::string& job_id, v1::Job::State state, const std::string& reason,
                 Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> AgentsInOrder() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<v1::Diagnosis> DiagnoseLocked(const Running& run) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireJoinsLocked(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Records new diagnoses of every running job as job events; returns the
  // current diagnoses per job.
  std::map<std::string, std::vector<v1::Diagnosis>> TrackDiagnosesLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobManager& jobs_;
  LogStore logs_;
  ResumeResolver resolve_resume_ ABSL_GUARDED_BY(mu_);
  RealClock real_clock_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::string coordinator_address_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Agent> agents_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Running> running_ ABSL_GUARDED_BY(mu_);
  int64_t next_agent_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULER_H_
