// Scheduler: the coordinator's running side. It routes what agents, ranks,
// users and the coordinator's own Tick say to the units that decide
// (placement, the queue's plan, a running job's transitions: each returns
// what to do) and applies their actions under one lock: the state it holds
// is a ClusterState (cluster_state.h), the durable writes are JobRecords'
// (job_records.h) and run after the lock, and the messages and answers go
// out after them (call_outbox.h). docs/architecture.md, "The coordinator",
// maps the units.
//
// A rank exiting with a non-zero code fails its job and stops the other
// ranks; so does its agent vanishing and not coming back within
// SchedulerOptions::agent_reconnect_grace. All ranks exiting 0 is success.
// An elastic job instead forms its next generation with the survivors and
// newcomers on free slots (docs/elastic.md).
//
// Thread-safety: all methods may be called concurrently. Senders and Join
// callbacks run without the scheduler's lock held.
//
// Example:
//   SchedulerOptions options;
//   options.coordinator_address = "127.0.0.1:29650";
//   Scheduler scheduler(jobs, &clock, std::move(options));
//   absl::StatusOr<std::string> agent = scheduler.AddAgent(hello, send);
//   scheduler.Join(request, deadline, [](absl::StatusOr<v1::JoinResponse> r) {...});
#ifndef CHORUS_COORDINATOR_SCHEDULING_SCHEDULER_H_
#define CHORUS_COORDINATOR_SCHEDULING_SCHEDULER_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "common/clock.h"
#include "coordinator/http/coordinator_metrics.h"
#include "coordinator/scheduling/agent_join_outbox.h"
#include "coordinator/scheduling/call_outbox.h"
#include "coordinator/scheduling/cluster_reads.h"
#include "coordinator/scheduling/cluster_state.h"
#include "coordinator/scheduling/job_records.h"
#include "coordinator/scheduling/job_resume.h"
#include "coordinator/scheduling/log_store.h"
#include "coordinator/scheduling/placement.h"
#include "coordinator/scheduling/queue_plan.h"
#include "coordinator/scheduling/rendezvous.h"
#include "coordinator/scheduling/running_job.h"
#include "coordinator/scheduling/scheduling_policy.h"
#include "coordinator/state/job_manager.h"
#include "coordinator/state/job_writes.h"

namespace chorus {

// What a Scheduler is built with (Scheduler::Configure replaces it).
struct SchedulerOptions {
  // What launched ranks are told to dial (set_coordinator_address once the
  // server has bound).
  std::string coordinator_address;
  // Where generations, rendezvous and diagnoses are counted; null =
  // nowhere. Must outlive the scheduler.
  CoordinatorMetrics* metrics = nullptr;
  // The administrator's limits and the fair-share half-life (default: none
  // and 1 h).
  SchedulingPolicy scheduling_policy;
  // Resolves a job's resume_from ("JOB" or "JOB:STEP") to the checkpoint it
  // starts from, checking it; empty: no checkpoints are kept (a job with
  // resume_from fails).
  using ResumeResolver = JobResume::Resolver;
  ResumeResolver resume_resolver;
  // A job's newest committed checkpoint (by job id), its files not read
  // (Note [A generation's checkpoint] in job_resume.h): it runs under the
  // scheduler's lock at every re-formation. Empty: resume_resolver is asked.
  ResumeResolver newest_committed;
  // How long a job preempted by re-queueing waits for its checkpoint to
  // commit before it goes back to the queue anyway (Note [Re-queue] in
  // requeue_wait.h).
  absl::Duration requeue_checkpoint_timeout = absl::Seconds(60);
  // How long a job without an elastic block waits for the ranks of an agent
  // whose stream ended to come back with it before it fails (Note [Agent
  // reconnect grace] in running_job.h); zero: it fails at once. An elastic
  // job waits the shorter of this and kElasticAgentGrace, then re-forms
  // without them (Note [An elastic job's lost agent] in agent_departure.h).
  absl::Duration agent_reconnect_grace = absl::Seconds(10);
};

class Scheduler {
 public:
  using Sender = AgentSender;
  using JoinDone = Rendezvous::Done;
  using ResumeResolver = SchedulerOptions::ResumeResolver;

  // `jobs` and `clock` (null = real time) must outlive the scheduler.
  Scheduler(JobManager& jobs, Clock* clock, SchedulerOptions options);

  // What the status pages, the CLI and /metrics read.
  const ClusterReads& reads() const { return reads_; }

  // Node agents (AgentService): an agent's stream opens with its hello,
  // carries its messages and ends.
  //
  // Registers an agent and places whatever now fits. Returns its id.
  // INVALID_ARGUMENT for a hello without slots.
  absl::StatusOr<std::string> AddAgent(const v1::AgentHello& hello, Sender send);
  // A message on the stream of agent `agent_id` after its hello: a rank's
  // exit, its ranks' output, heartbeats or joins (these wait until
  // `join_deadline`), or a ping (the agent is alive). A message from an
  // unknown agent (its stream is ending) is ignored; so is a second hello.
  void OnAgentMessage(const std::string& agent_id, const v1::AgentMessage& message,
                      absl::Time join_deadline);
  // The agent's stream ended: its slots are gone; its running jobs wait
  // agent_reconnect_grace for it to come back with their ranks (Note [Agent
  // reconnect grace] in running_job.h), or fail at once when that is zero;
  // elastic ones wait at most kElasticAgentGrace and then re-form without
  // them (Note [An elastic job's lost agent] in agent_departure.h).
  void RemoveAgent(const std::string& agent_id);

  // Rank processes (RankService).
  //
  // Answers when every rank of the generation has joined, or with
  // DEADLINE_EXCEEDED (naming the missing ranks) once `deadline` passes
  // (checked by Tick), FAILED_PRECONDITION for a stale generation or
  // a job that is not running, NOT_FOUND for an unknown job or slot.
  void Join(const v1::JoinRequest& request, absl::Time deadline, JoinDone done);
  // Records a rank's heartbeat (progress, phase, flight recorder) for status
  // and fills `directive` (if not null) with what the rank is to do
  // (RecordHeartbeat in rank_messages.h: RE_RENDEZVOUS, REFORM_AT_STEP_
  // BOUNDARY, CHECKPOINT_AND_HOLD; ABORT for a job that FAILED or was
  // CANCELLED). Returns false when the rank is not part of a running
  // generation (the stream should end). A program job's rank 0 heartbeat
  // carries its progress: the job's latest metrics move forward.
  bool Heartbeat(const v1::RankHeartbeat& heartbeat, v1::Directive* directive = nullptr);
  // A rank's metrics: rank 0's become the job's latest (final ones are
  // persisted); an elastic job's gain values "restarts" and
  // "recovery_seconds" (of the last failure). NOT_FOUND / FAILED_PRECONDITION for unknown or stale
  // ranks.
  absl::Status Report(const v1::ReportRequest& report);

  // Users (JobService).
  //
  // `chorus drain`: the agent (its id, or a host only one agent has) takes
  // no new ranks; every elastic job with ranks on it re-forms without them
  // at its next step boundary; other jobs keep running there until they end.
  // Idempotent: returns the agent's state (DRAINED once no rank runs on it).
  // NOT_FOUND / INVALID_ARGUMENT (an ambiguous host) naming the agents.
  absl::StatusOr<v1::AgentInfo> DrainAgent(const std::string& agent);
  // Cancels a job (through JobManager) and stops its running ranks.
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const std::string& reason);
  // Makes the job's ranks checkpoint soon: their agents signal them (a
  // CheckpointRanks message). Returns the highest step a rank has reported.
  // NOT_FOUND for an unknown job, FAILED_PRECONDITION if it is not running.
  absl::StatusOr<int64_t> RequestCheckpoint(const std::string& job_id);

  // The coordinator process.
  //
  // After a restart: takes back jobs that were RUNNING (with their recorded
  // placements). Their ranks are expected to come back with their agents;
  // a job whose ranks are not all back within `grace` fails with the reason.
  void Recover(const std::vector<v1::Job>& running, absl::Duration grace);
  // Fails joins whose deadline has passed, acts on each running job's
  // deadlines and diagnoses (CheckDeadlines and CheckDiagnoses in
  // hang_restart.h), retries elastic jobs waiting below min_ranks, lets
  // elastic jobs grow and sends re-queued jobs back to the queue. The server
  // calls it periodically.
  void Tick();
  // Places queued jobs that fit. Called after every change, and by
  // JobService after a submission.
  void Schedule();
  // Replaces the options; fair-share usage recorded so far restarts from
  // zero.
  void Configure(SchedulerOptions options);
  // What launched ranks are told to dial: known once the server has bound,
  // after the services that hold the scheduler were built.
  void set_coordinator_address(std::string address);

 private:
  // One per call (Note [The scheduler's writes after its lock] in
  // call_outbox.h); its after-writes step is AfterWrites.
  struct Outbox : CallOutbox {
    explicit Outbox(Scheduler& s)
        : CallOutbox(s.agent_joins_, s.writes_,
                     [&s](const auto& settled, const auto& unrecorded, bool requeued) {
                       s.AfterWrites(settled, unrecorded, requeued);
                     }) {}
  };

  // What an agent's stream carries after its hello (OnAgentMessage): a
  // rank's exit; its ranks' joins and heartbeats gathered into one message
  // (Note [Joins through the agent] in agent_join_outbox.h, Note [Aggregated
  // heartbeats] in rank_messages.h), each handled as Join's and Heartbeat's;
  // its ranks' output. (A ping says only that it is alive, with its node's
  // CPU pressure: Note [A starved node] in hang_detector.h.)
  void RankExited(const std::string& agent_id, const v1::RankExited& exited);
  void AgentJoins(const std::string& agent_id, const v1::RankJoins& batch, absl::Time deadline);
  void AgentHeartbeats(const std::string& agent_id, const v1::RankHeartbeats& batch,
                       double cpu_pressure);
  void Logs(const std::string& agent_id, const v1::RankLogs& logs);
  // After an Outbox's writes: the jobs it settled are settled, starts that
  // were not recorded are undone (their slots freed, the job left queued),
  // and re-queued jobs are placed.
  void AfterWrites(const std::vector<std::string>& settled,
                   const std::vector<std::string>& unrecorded, bool requeued);

  // The entry points' work under the lock, what they say going to `out`.
  absl::StatusOr<std::string> AddAgentLocked(const v1::AgentHello& hello, Sender send, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // False if the agent is unknown. With `rebinding` (the agent's process
  // connected again: Note [An agent back before its stream ended] in
  // agent_departure.h), the elastic jobs whose ranks there wait to be
  // rebound by the new hello are added to it instead of re-formed.
  bool RemoveAgentLocked(const std::string& agent_id, Outbox& out,
                         std::vector<std::string>* rebinding = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  void RankExitedLocked(const std::string& agent_id, const v1::RankExited& exited, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  void JoinLocked(const v1::JoinRequest& request, absl::Time deadline, JoinDone done, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // Join's part once `rank` of `run` is known (Note [Rendezvous is O(ranks)]
  // in rendezvous.h).
  void JoinRankLocked(const v1::JoinRequest& request, int rank, absl::Time deadline, JoinDone done,
                      RunningJob& run, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // A Join from a staged newcomer's slot (Note [Staged growth] in
  // staged_growth.h) is answered (`done` moved) and true; false for any other.
  bool StagedJoinLocked(const v1::JoinRequest& request, JoinDone& done, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // `via_agent`: it came in an agent's batch (Note [A silent agent's ranks]
  // in hang_detector.h).
  bool HeartbeatLocked(const v1::RankHeartbeat& heartbeat, v1::Directive* directive,
                       bool via_agent = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // Elastic jobs waiting below min_ranks retry, queued jobs are placed, a
  // reservation holder short of slots preempts, elastic jobs grow.
  void ScheduleLocked(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);

  // Placement and ends. Queued jobs that fit are started; false if a queued job could not be
  // read (nothing more is placed then).
  bool PlaceQueuedLocked(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // Its launches go out once its start is written.
  void StartLocked(const v1::Job& job, const JobPlacement& placement, v1::CheckpointManifest resume,
                   Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // Frees its slots, stops its other ranks (returned by agent), fails its
  // pending joins and records the end (not for CANCELLED: Cancel has).
  std::map<std::string, std::vector<int>> EndLocked(const std::string& job_id, v1::Job::State state,
                                                    const std::string& reason, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // A job with no running ranks here fails.
  void RecordFailure(const std::string& job_id, const std::string& reason, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // JobResume::ForStart, checkpoints it skipped recorded as warning events.
  absl::StatusOr<v1::CheckpointManifest> ResumeLocked(const v1::Job& job, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);

  // Elastic jobs (scheduler_elastic.cc). After `cause` of `kind` the job changes generation
  // (ChangeGeneration in generation_change.h), and this applies what the change returns.
  void ReformLocked(const std::string& job_id, const std::string& cause, ReformKind kind,
                    Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // A planned change: the ranks re-form at their next step boundary (a
  // restart-all at once).
  void RequestReformLocked(const std::string& job_id, RunningJob& run, const std::string& cause,
                           ReformKind kind, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  void RetryWaitingLocked(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  void GrowLocked(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // Note [Preemption by shrinking] in preemption.h, and Note [Re-queue] in
  // requeue_wait.h.
  void PreemptLocked(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // True if a job went back to the queue.
  bool RequeueDueLocked(absl::Time now, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  void RequeueLocked(const std::string& job_id, int64_t resume_step, const std::string& reason,
                     Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // Saves what a restart needs to take back each running elastic job (or
  // `run`) whose record changed (Note [Elastic restart] in job_recovery.h).
  void SaveElasticLocked(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  void SaveElasticLocked(const std::string& job_id, RunningJob& run, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);

  // Sends and records what a transition of `job_id` asks.
  void ApplyLocked(const std::string& job_id, JobActions actions, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // Logs `message` and records it as an event of the job.
  void RecordEvent(const std::string& job_id, std::string message, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);

  JobManager& jobs_;
  LogStore logs_;
  AgentJoinOutbox agent_joins_;  // has its own lock
  JobWrites writes_;             // has its own lock
  const JobRecords records_{jobs_};
  JobResume resume_ ABSL_GUARDED_BY(state_.mu){nullptr, nullptr};
  RealClock real_clock_;
  Clock* const clock_;
  ClusterState state_;  // its lock, state_.mu, is the scheduler's
  ClusterReads reads_{state_, jobs_, logs_, clock_};
  std::string coordinator_address_ ABSL_GUARDED_BY(state_.mu);
  CoordinatorMetrics* metrics_ ABSL_GUARDED_BY(state_.mu) = nullptr;
  absl::Duration requeue_timeout_ ABSL_GUARDED_BY(state_.mu);
  absl::Duration reconnect_grace_ ABSL_GUARDED_BY(state_.mu);
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_SCHEDULER_H_
