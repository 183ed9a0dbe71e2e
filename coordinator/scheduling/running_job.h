// RunningJob: the coordinator's bookkeeping of one running job — where each
// rank runs, what it last reported, its generation's rendezvous, its
// diagnoses history and its checkpoint grant.
//
// Thread-safety: none; the Scheduler holds its lock around every use.
//
// Example:
//   RunningJob run(job, placement.ranks.size(), /*generation=*/1);
//   for (const RankSlot& slot : placement.ranks) run.AddRank(RankState::At(slot));
//   int rank = run.RankOn(agent_id, slot);
//
// Its state changes only through its transitions: the ranks, the resume
// point and the wait for ranks are its own; the parts that are controllers
// of their own, with their own transitions and tests (its Rendezvous, its
// ElasticPhase, its RequeueWait, its LeavingRanks, its StagedGrowth), are
// read through x() and changed through mutable_x().
#ifndef CHORUS_COORDINATOR_SCHEDULING_RUNNING_JOB_H_
#define CHORUS_COORDINATOR_SCHEDULING_RUNNING_JOB_H_

#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/checkpoint/checkpoint_grant.h"
#include "coordinator/hang/hang_detector.h"
#include "coordinator/hang/hang_policy.h"
#include "coordinator/scheduling/agent_registry.h"
#include "coordinator/scheduling/elastic_state.h"
#include "coordinator/scheduling/leaving_ranks.h"
#include "coordinator/scheduling/placement.h"
#include "coordinator/scheduling/rendezvous.h"
#include "coordinator/scheduling/requeue_wait.h"
#include "coordinator/scheduling/staged_growth.h"

namespace chorus {

// One rank of a running job.
struct RankState {
  // Empty while a job taken back after a restart waits for the agent.
  std::string agent_id;
  int slot = 0;
  int local_rank = 0;
  int local_world_size = 0;
  v1::RankStatus::State state = v1::RankStatus::LAUNCHING;
  int64_t pid = 0;
  int exit_code = 0;
  // For a job taken back after a restart, or whose agent's stream ended
  // (Note [Agent reconnect grace]): the agent that ran the rank.
  std::string recover_host;
  int64_t recover_agent_pid = 0;
  v1::RankHeartbeat last_heartbeat;
  absl::Time heartbeat_at = absl::InfinitePast();
  // The last heartbeat of the rank's process, of this generation or, for a
  // survivor, of the one before (Note [A survivor that does not join] in
  // hang_restart.h); kept from generation to generation.
  absl::Time heard_at = absl::InfinitePast();
  // Set once the coordinator has had the rank's agent stop it (an elastic
  // job): who evicted it and why ("hang_detection.action RESTART: DEAD ...",
  // Note [A survivor that does not join]), which becomes the cause of the
  // next generation when the rank's exit is reported.
  std::string evicted;
  // Told to stop by a restart-all (Note [Restart-all]): its exit is
  // expected, neither a failure nor a success.
  bool stopping = false;
  // The rank said it finished training: a heartbeat in phase FINISHED or
  // its final report with success (Note [Diagnoses during shutdown]).
  bool finished = false;
  // Its last heartbeat came through its agent's stream (Note [A silent
  // agent's ranks] in hang_detector.h), not its own.
  bool heartbeats_via_agent = false;

  static RankState At(const RankSlot& slot);
};

// Note [Restart-all]
// A program job with an elastic block whose program cannot re-form in its
// own process (an unmodified torchrun script knows nothing of generations:
// its survivors would crash at their next collective, and a newcomer would
// start from scratch without a restart count) gets torchrun's contract
// instead. On a lost rank or agent, a hang restart, a drain or a growth:
//  1. every live rank is told to stop (StopRanks: SIGTERM, SIGKILL after the
//     grace) and marked `stopping`; its exit is expected and counts neither
//     as a failure nor towards success, whatever its code: a survivor that
//     crashes at its next collective before the stop reaches it included;
//  2. once the last has exited (or its agent is gone), the next generation
//     is planned with every rank lost and every rank is launched afresh
//     (generation + 1), with TORCHELASTIC_RESTART_COUNT = `restarts` so far;
//  3. the change counts once: one restart against elastic.max_restarts for
//     a failure, none for a drain or a growth, however many exits it took.
//     A failure heard while a planned change stops the ranks makes it a
//     failure; later ones join the restart in progress.
// Ranks that have not exited elastic.wait_seconds after the stop fail the
// job. While the ranks stop, the hang policy and growth wait.
// Who re-forms in process: a program says so in its progress records
// (v1::RankHeartbeat.reforms_in_process; the C++ SDK's Session sets it once
// the program calls one of its elastic hooks). One rank saying so is
// enough, the ranks running one program. Until then, and for a program that
// never says so, restart-all is the default: a program that restarts whole
// loses the steps since its last checkpoint, while one wrongly left to
// re-form loses its survivors to crashes and every restart with them. The
// built-in trainer always re-forms in process.

// Note [Agent reconnect grace]
// An agent's stream ends when the network between its node and the
// coordinator drops for a moment, not only when the node dies; the agent
// keeps its ranks running and connects again with backoff, its hello
// listing the ranks it still runs and the exits it wrote meanwhile. A job
// without an elastic block (which cannot re-form without them) therefore
// waits --agent_reconnect_grace_seconds for the agent's ranks as it waits
// for every rank after a coordinator restart: they are unbound and LOST,
// known by host, agent pid and slot (AwaitAgent), the agent's slots are
// gone with it, and the job's wait (recovering_until) ends at the later of
// its current deadline and now + grace. The reconnected agent (a new agent
// id, the same host and process) rebinds them (RebindRanks); if the
// coordinator still holds the agent's old stream then (a half-open
// connection), the old registration is taken as lost first, if the hello
// names it (AgentHello.agent_id, the id the agent was last welcomed with)
// and has its host and pid: agents in containers that share a host name
// may share a pid too. An exit it
// tells in its hello counts as after a restart (Note [Exits told again] in
// job_recovery.h); ranks not back by the deadline fail the job with the lost
// agent as the cause (CheckRecovery in job_recovery.h). While the ranks are
// away the hang detector does not see them (HangViews): their heartbeats,
// relayed by the agent, stop with its stream and would make them DEAD; for
// the same reason a rank's heartbeat age starts again when it is rebound.
// An elastic job waits too, briefly, and then re-forms without the agent's
// ranks (Note [An elastic job's lost agent] in agent_departure.h).

// An agent whose contact was lost while the job waits for its ranks.
struct LostAgentWait {
  std::string agent_id;
  std::string host;
  std::vector<int> ranks;  // the ranks it ran that had not exited
  absl::Duration grace;    // how long they were given to come back
};

// Why a job waits for ranks to come back (RunningJob::recovering_until).
struct RankWaitCause {
  bool after_restart = false;              // the coordinator restarted
  std::vector<LostAgentWait> lost_agents;  // oldest first
};

// Rows of a job's status (GetJobStatus, the job page) when the request does
// not say how many: every rank of a job up to this size; a larger job's
// are paged (docs/observability.md, "Large jobs").
inline constexpr int kDefaultStatusRankRows = 1024;

// Which rows a job's status gets: ranks [offset, offset + limit), and those
// in `also` (a diagnosis's culprits) outside it, in rank order after them.
struct StatusRows {
  int offset = 0;
  int limit = INT_MAX;
  std::vector<int> also;
};

// How a job ends.
struct JobEnd {
  v1::Job::State state = v1::Job::FAILED;
  std::string reason;
};

// What a transition of a running job asks the Scheduler to send and record,
// in order: messages to agents (by agent id; one for an agent that is gone
// is dropped), events for the job's history, and lines for the
// coordinator's log only.
struct JobActions {
  std::vector<std::pair<std::string, v1::CoordinatorMessage>> messages;
  std::vector<std::string> events;
  std::vector<std::string> logs;
};

// Note [A bounded history]
// An elastic job's history is saved with its record (ElasticRecord) and
// quoted in its status and in the reason it fails with. A line per
// generation change once named every rank that moved: losing rank 0 of a
// 16,384-rank job renumbers every survivor, and that one line was about
// 450 KB, in a record etcd caps at 1.5 MiB. So a line names at most
// kListedNewcomers ranks and counts the rest, and the history keeps its
// newest kHistoryLines lines after one that counts those dropped.
inline constexpr int kListedNewcomers = 8;
inline constexpr int kHistoryLines = 32;

// "a, b, c and 16381 more": the first kListedNewcomers of `newcomers`.
std::string ListNewcomers(const std::vector<std::string>& newcomers);

// Appends `line` to `history`, dropping the oldest lines past kHistoryLines
// into a first line "(N earlier changes not kept)".
void AppendHistory(std::vector<std::string>& history, std::string line);

struct RunningJob {
  // A job starting (or taken back) with `world_size` ranks in
  // `generation`; the caller adds the ranks.
  RunningJob(const v1::Job& job, int world_size, int64_t generation);

  int64_t generation() const { return rendezvous_.generation(); }
  // The rank running on the agent's slot, or -1. O(1) while `ranks` is
  // unchanged (Note [Rank index]).
  int RankOn(const std::string& agent_id, int slot) const;
  // The rank a Join from process `pid` on `host` and the agent's slot is
  // for, or -1. A rank taken back after a restart joins with the id its
  // agent had before (its environment's), which may now name another agent:
  // it is known by its host, pid and slot.
  int RankOfJoin(const std::string& agent_id, int slot, int64_t pid, const std::string& host) const;
  // Whether a job taken back after a restart, or whose agent's stream
  // ended, still waits for a rank to come back.
  bool AwaitingRanks() const;
  // Note [Agent reconnect grace]: agent `agent_id` (`host`, process
  // `agent_pid`) is gone; its ranks that have not exited become LOST and
  // unbound, to be bound again by host, agent pid and slot. Returns them.
  std::vector<int> AwaitAgent(const std::string& agent_id, const std::string& host,
                              int64_t agent_pid);
  // Whether a growth, a shrink or a re-queue may start: the generation has
  // formed, no rank is awaited or has exited, and no change of generation
  // is planned, waiting for slots or under way (Note [Elastic phase]).
  bool Steady() const;
  // Where a rank of the current generation stands, as a change of
  // generation sees it: every caller that asks which ranks are lost reads
  // it here (a re-formation, the plan of a planned one, the elastic record).
  enum class Fate {
    kStays,
    kExited,
    kUnbound,    // awaiting its agent's return (Note [Agent reconnect grace])
    kAgentGone,  // its agent is not registered
    // On a draining agent, or yielding its slot to a preemption: it leaves
    // at the step boundary and exits by itself.
    kLeavesAtBoundary,
  };
  // Each rank's Fate (index = rank).
  std::vector<Fate> Fates(const AgentRegistry& agents) const;
  // Whether a rank that has not exited runs on `agent_id` (departing ones
  // included).
  bool RunsOn(const std::string& agent_id) const;
  // The store namespace of `job`'s generation `gen` (JoinResponse).
  static std::string StoreNamespace(const v1::Job& job, int64_t gen);
  // The job ends: frees its slots on the agents still registered (departing
  // ranks' and staged newcomers' included). Returns, by agent, the slots of ranks that have not
  // exited (to be stopped).
  std::map<std::string, std::vector<int>> ReleaseSlots(AgentRegistry& agents) const;
  // Whether `rank` of `generation` is a rank of this job now.
  bool HasRank(int64_t generation, int rank) const;
  // What the hang detector needs: ranks that have sent a heartbeat or exited,
  // less those waiting for their agent to come back (Note [Agent reconnect
  // grace]). The views point at the ranks' recorded heartbeats: use them before
  // `ranks` changes. `agents` says when each relaying agent was last heard
  // (Note [A silent agent's ranks] in hang_detector.h).
  std::vector<RankView> HangViews(const AgentRegistry& agents) const;
  // Whether training is over: a rank of this generation said it finished,
  // or a rank of an earlier one did in its final report while this one
  // formed (Note [Diagnoses during shutdown]).
  bool TrainingFinished() const;
  // The hang detector's diagnoses of the job now, those void during
  // shutdown dropped (Note [Diagnoses during shutdown] in hang_detector.h).
  std::vector<v1::Diagnosis> Diagnose(const AgentRegistry& agents, absl::Time now) const;
  // Diagnoses the job now and keeps them (diagnoses_now); returns the
  // events of the diagnoses that appeared or cleared (DiagnosisHistory).
  std::vector<v1::JobEvent> UpdateDiagnoses(const AgentRegistry& agents, absl::Time now);
  // The diagnoses of the last Tick (for status pages and metrics, which
  // must not run the detector on every request).
  const std::vector<v1::Diagnosis>& diagnoses_now() const { return diagnoses_now_; }
  // Sets each of `current`'s first_seen_us from the diagnoses seen so far,
  // remembering nothing (for status).
  void AnnotateDiagnoses(std::vector<v1::Diagnosis>& current, absl::Time now) const {
    diagnoses_.Annotate(current, now);
  }
  // A new generation: the diagnoses seen so far are forgotten.
  void ForgetDiagnoses() { diagnoses_ = DiagnosisHistory(); }
  // One LaunchRanks message per agent (by agent id) for the ranks of
  // generation(), told to dial `coordinator_address`.
  std::map<std::string, v1::CoordinatorMessage> LaunchMessages(
      const std::string& job_id, const std::string& coordinator_address) const;
  // The same for `slots` of generation `generation`, with the job's limits:
  // a generation's newcomers, or those started before it forms.
  std::map<std::string, v1::CoordinatorMessage> LaunchMessages(
      const std::string& job_id, const std::string& coordinator_address, int64_t generation,
      const std::vector<RankSlot>& slots) const;
  // `job` started at `now` as generation 1 on `slots` (index = rank), taken
  // in `agents`, resuming from `resume`.
  static RunningJob Started(const v1::Job& job, const std::vector<RankSlot>& slots,
                            v1::CheckpointManifest resume, AgentRegistry& agents, absl::Time now);
  // The same for the current generation's newcomers (its ranks LAUNCHING);
  // survivors join by themselves.
  std::map<std::string, v1::CoordinatorMessage> NewcomerLaunchMessages(
      const std::string& job_id, const std::string& coordinator_address) const;
  // Where the ranks run, as recorded for a restart (host and agent pid from
  // `agents`). REQUIRES: every rank's agent is registered.
  std::vector<v1::RankPlacement> Placements(const AgentRegistry& agents) const;
  // Agents numbered in the order their first rank comes (torchrun's
  // GROUP_RANK): `of_rank[rank]` is the rank's, `count` how many. A rank
  // taken back after a restart whose agent has not reconnected is known by
  // its host. O(ranks): compute it once for a whole generation's answers.
  struct Groups {
    std::vector<int> of_rank;
    int count = 0;
  };
  Groups GroupsOfRanks() const;
  // The job's rendezvous answer for `rank` (spec from `job`), with the
  // restarts so far and the rank's group from `groups` (GroupsOfRanks()).
  v1::JoinResponse JoinResponseFor(const v1::Job& job, int rank, const Groups& groups) const;
  // Records that the rank on `agent_id`'s `exited.slot()` ended (an agent
  // back after a restart may report a rank not bound to it yet). Returns the
  // job's end when this exit ends it: FAILED for a non-zero code (naming the
  // rank, host, pid, code or signal and its last error record, else its
  // last stderr line: Note [Rank error record]), SUCCEEDED
  // once every rank exited 0. An exit of no live rank changes nothing, nor
  // does one of a rank a restart-all stopped (Note [Restart-all]).
  std::optional<JobEnd> RecordExit(const std::string& agent_id, const v1::AgentHello& agent,
                                   const v1::RankExited& exited);
  // Fills status.rank_summary over every rank and status.rank_offset, and
  // appends a row per rank of `rows` (host: the agent's, the host of a rank
  // waiting for its agent to come back, or the agent's id once the agent is
  // gone). O(ranks log ranks) for the summary; protos only for the
  // rows asked for.
  void AddStatusRows(const AgentRegistry& agents, absl::Time now, v1::JobStatus& status,
                     const StatusRows& rows = StatusRows()) const;

  const v1::HangDetectionSpec hang_detection;
  // The current generation's rendezvous.
  const Rendezvous& rendezvous() const { return rendezvous_; }
  Rendezvous& mutable_rendezvous() { return rendezvous_; }
  // The current generation's ranks (index = rank).
  const std::vector<RankState>& ranks() const { return ranks_; }
  // Adds the next rank of a job being built (RunningJob::Started,
  // RecoveredJob); `joined`: it has joined the generation already (a job
  // taken back after a restart, its generation formed).
  void AddRank(RankState rank, bool joined = false);

  // What a rank's messages change:
  // A heartbeat of `rank`, a survivor of the generation before, which has
  // not joined this one yet (Note [A survivor that does not join] in
  // hang_restart.h): it was heard at `now`.
  void HeardFrom(int rank, absl::Time now);
  // `heartbeat` of a rank of this generation came at `now`, through its
  // agent's stream if `via_agent`. A heartbeat in phase FINISHED counts as
  // the rank's FinishedTraining.
  void OnHeartbeat(const v1::RankHeartbeat& heartbeat, absl::Time now, bool via_agent);
  // `rank` said it finished training (its final report with success):
  // taken as such unless it was told to stop or evicted, whose programs may
  // exit 0 on SIGTERM.
  void FinishedTraining(int rank);
  // `rank` joins from process `pid`.
  void OnJoining(int rank, int64_t pid);
  // The generation formed: every rank trains.
  void OnTraining();
  // The coordinator has `rank`'s agent stop it: `why` (who and why) is
  // kept. False (nothing changes) if it was evicted already or has exited.
  bool MarkEvicted(int rank, std::string why);
  // Note [Restart-all]: every rank that has not exited is told to stop;
  // returns how many.
  int MarkStopping();
  // The same for one rank (an elastic job taken back mid-restart).
  void MarkStopping(int rank);
  // `rank` was lost before a coordinator restart (its elastic record says
  // so): exited, and no agent binds it again.
  void MarkLost(int rank);

  // What agents coming and going change (Note [Agent reconnect grace]):
  // The rank awaited on `host`'s agent process `agent_pid` at `slot`
  // (unbound, not exited), or -1.
  int AwaitedRank(const std::string& host, int64_t agent_pid, int slot) const;
  // Awaited `rank` is back on `agent_id`, run by process `pid`.
  void Rebind(int rank, const std::string& agent_id, int64_t pid);
  // A rank back on its agent: its heartbeat age starts again (if it had
  // sent one).
  void RestartHeartbeatClock(int rank, absl::Time now);
  // Awaited `rank` is not coming back: it counts as on `agent_id`, which is
  // gone, so that a re-formation counts it as lost, not awaited. False if
  // it is not awaited.
  bool GiveUpRank(int rank, const std::string& agent_id);
  // The job's bookkeeping for its next generation `generation` of `ranks`,
  // begun at `now` after a change of `kind`: a new rendezvous and upload
  // grant, no rank exited yet, the diagnoses forgotten, whether training
  // had finished kept (Note [Diagnoses during shutdown]), the phase
  // Forming. `rank_of_survivor`: index, a rank of the generation before;
  // value, its rank now, -1 if it left.
  void BeginGeneration(const v1::Job& job, std::vector<RankState> ranks, int64_t generation,
                       ReformKind kind, absl::Time now, std::vector<int> rank_of_survivor);
  // Rank `rank` of the current generation finished (its exit of 0 was
  // recorded before a coordinator restart): it is not waited for, and counts
  // towards the job's success.
  void MarkFinished(int rank);
  // A rank's final report of success came from a generation the job has
  // left (Note [Diagnoses during shutdown]).
  void NoteFinishedBeforeReform() { finished_before_reform_ = true; }
  bool finished_before_reform() const { return finished_before_reform_; }
  // Ranks that exited 0 in this generation.
  int exited_ok() const { return exited_ok_; }
  // Index: a rank of the generation before; value: its rank now, -1 if it
  // is not in this one (Note [A survivor that does not join]).
  const std::vector<int>& rank_of_survivor() const { return rank_of_survivor_; }
  // When the generation's ranks were launched (its rendezvous began).
  absl::Time generation_started_at() const { return generation_started_at_; }
  // Who may store a checkpoint of this generation.
  const UploadGrant& upload_grant() const { return upload_grant_; }

  // The checkpoint the job resumes from (empty job_id: none).
  const v1::CheckpointManifest& resume() const { return resume_; }
  void ResumeFrom(v1::CheckpointManifest resume) { resume_ = std::move(resume); }
  // Set while a job taken back after a restart, or whose agent's stream
  // ended, waits for its ranks (InfinitePast: it does not); `wait_cause`
  // says which.
  absl::Time recovering_until() const { return recovering_until_; }
  const RankWaitCause& wait_cause() const { return wait_cause_; }
  // The job was taken back after a coordinator restart: it waits for its
  // ranks until `until`.
  void AwaitAfterRestart(absl::Time until);
  // The job waits for the ranks `wait` lists, of an agent whose contact was
  // lost, until `until` or the later deadline it already had.
  void AwaitLostAgent(LostAgentWait wait, absl::Time until);
  // The wait is over (the ranks are back, or given up).
  void StopAwaiting();

  // Who submitted the job ("" anonymous), its priority and device: the
  // queue plan's quotas and fair share count its slots (queue_plan.h), and
  // preemption picks by priority (preemption.h).
  const std::string owner;
  const v1::JobSpec::Priority priority;  // PRIORITY_UNSPECIFIED is NORMAL
  const v1::ResourceSpec::Device device;
  const int min_ranks;  // resources.min_ranks: preemption shrinks no further

  // What each rank's cgroup enforces (Note [Rank cgroups] in
  // worker/agent/rank_cgroup.cc): RankMemoryLimitBytes and
  // RankProcessLimit of the spec; sent with every launch.
  const int64_t memory_limit_bytes;
  const int max_processes;
  // Sets those limits on `launch`.
  void SetLimits(v1::LaunchRanks& launch) const;

  // A program job (spec.program present; docs/programs.md): a failed rank's
  // reason quotes its last output lines, not only the last one.
  const bool program;
  // Elastic jobs (spec.elastic present; docs/elastic.md).
  const bool elastic;
  const v1::ElasticSpec elastic_spec;
  // A program rank said its program re-forms in its own process (Note
  // [Restart-all]); sticky.
  bool reforms_in_process() const { return reforms_in_process_; }
  void NoteReformsInProcess() { reforms_in_process_ = true; }
  // Whether a change of generation stops every rank and starts them all
  // again (Note [Restart-all]).
  bool RestartsAll() const { return program && elastic && !reforms_in_process_; }
  // Where the job is in a change of generation, and the planned change it
  // waits to make (Note [Elastic phase] in elastic_state.h). A restart-all
  // whose ranks are being stopped is its Restarting phase.
  const ElasticPhase& phase() const { return phase_; }
  ElasticPhase& mutable_phase() { return phase_; }
  // resources.preemptible (preemption.h): may go back to the queue without
  // a checkpoint.
  const bool preemptible;
  // Note [Re-queue] in requeue_wait.h: a higher-priority job preempted
  // this one, which checkpoints before it goes back to the queue.
  const RequeueWait& requeue() const { return requeue_; }
  RequeueWait& mutable_requeue() { return requeue_; }
  // Rank failures survived so far, and one line per generation change: the
  // newest kHistoryLines, after a first line that counts the earlier ones
  // (AppendHistory; Note [A bounded history]).
  int restarts() const { return restarts_; }
  const std::vector<std::string>& history() const { return history_; }
  // Seconds from the last failure to its generation forming (0: none yet).
  double recovery_seconds() const { return recovery_seconds_; }
  // When the job last started or grew (elastic.scale_up_interval_seconds
  // counts from it).
  absl::Time last_growth_at() const { return last_growth_at_; }
  // The generation formed without the replacements of ranks lost in a
  // failure: free slots are taken at once (Note [Staged growth] in
  // staged_growth.h).
  bool replacements_owed() const { return replacements_owed_; }
  // A change of generation is decided at `now`: a `failure` counts a
  // restart, a generation that `grew` restarts the scale-up interval, and
  // one formed without its replacements (`owes`) owes them; `line` (built
  // after the count) goes into the history.
  void CountChange(bool failure, bool grew, bool owes, absl::Time now);
  void AddHistory(std::string line) { AppendHistory(history_, std::move(line)); }
  // The last failure's generation formed `seconds` after it.
  void NoteRecovery(double seconds) { recovery_seconds_ = seconds; }
  // What a restarted coordinator takes back of an elastic job (Note
  // [Elastic restart] in job_recovery.h).
  void Restore(std::vector<std::string> history, double recovery_seconds, absl::Time last_growth_at,
               bool reforms_in_process);
  // Ranks that leave without a failure: yielding to a preemption until the
  // next change of generation, then departing (as do ranks that leave with
  // a drain and stopped staged newcomers) until their exit is reported.
  const LeavingRanks& leaving() const { return leaving_; }
  LeavingRanks& mutable_leaving() { return leaving_; }
  // Note [Staged growth] in staged_growth.h: newcomers started before
  // their generation forms; not ranks of the job until it does.
  const StagedGrowth& staged() const { return staged_; }
  StagedGrowth& mutable_staged() { return staged_; }
  // Whether `record` (a serialized coordinator::ElasticRecord) differs from
  // the one last saved to the state database; it is taken as saved from
  // now on (Scheduler::SaveElasticLocked, RecoveredJob).
  bool RecordChanged(std::string record) {
    if (record == saved_record_) return false;
    saved_record_ = std::move(record);
    return true;
  }
  // Held while a report of the job is written to the state database
  // outside the scheduler's lock (Note [Reports are written outside the
  // scheduler's lock] in rank_messages.h). Shared: the writer keeps it
  // even if the job ends meanwhile.
  const std::shared_ptr<std::mutex> report_writes = std::make_shared<std::mutex>();
  // Whether every rank of the current generation has joined.
  bool Formed() const { return rendezvous_.complete(); }
  // Where the current ranks run (index = rank).
  std::vector<RankSlot> Slots() const;
  // The highest step a rank has reported.
  int64_t ReportedStep() const;
  // One CheckpointRanks message per agent (by agent id) for the ranks that
  // run there now (`chorus checkpoint`).
  std::map<std::string, v1::CoordinatorMessage> CheckpointMessages(
      const std::string& job_id, const AgentRegistry& agents) const;

 private:
  friend class RunningJobTestPeer;  // running_job_test_peer.h: tests only
  // Note [Rank index] in running_job.cc.
  void IndexRanks() const;
  Rendezvous rendezvous_;
  std::vector<RankState> ranks_;
  v1::CheckpointManifest resume_;
  absl::Time recovering_until_ = absl::InfinitePast();
  RankWaitCause wait_cause_;
  ElasticPhase phase_;
  RequeueWait requeue_;
  LeavingRanks leaving_;
  StagedGrowth staged_;
  bool reforms_in_process_ = false;
  int restarts_ = 0;
  std::vector<std::string> history_;
  double recovery_seconds_ = 0;
  absl::Time last_growth_at_ = absl::InfinitePast();
  bool replacements_owed_ = false;
  int exited_ok_ = 0;
  std::vector<int> rank_of_survivor_;
  bool finished_before_reform_ = false;
  absl::Time generation_started_at_ = absl::InfinitePast();
  UploadGrant upload_grant_;
  DiagnosisHistory diagnoses_;
  std::vector<v1::Diagnosis> diagnoses_now_;
  std::string saved_record_;
  mutable absl::flat_hash_map<std::pair<std::string, int>, int> rank_index_;
  mutable std::vector<int> recovered_ranks_;  // ranks with a recover_host
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_RUNNING_JOB_H_
