// What a running job makes of its ranks' messages, as transitions of its
// own state that return what the Scheduler is to do:
//   RecordHeartbeat  a heartbeat is recorded on its rank; the answer says
//                    whether the rank's stream stays and which directive it
//                    gets (RE_RENDEZVOUS, REFORM_AT_STEP_BOUNDARY,
//                    CHECKPOINT_AND_HOLD);
//   AnswerJoin       a Join is refused (and why), told to leave, or joins
//                    as a rank of the current generation;
//   StartsPlannedChange
//                    the Join that reaches a planned change's step boundary
//                    first, which starts the change;
//   RecordReport     a rank's metrics are checked and completed, and a
//                    final report of success marks the rank finished.
// The Scheduler finds the job, applies the answer (records metrics, sends
// directives, joins the rendezvous) and handles messages for jobs that do
// not run here.
//
// Thread-safety: none; the Scheduler holds its lock around every call.
//
// Example:
//   HeartbeatAnswer answer = RecordHeartbeat(run, heartbeat, clock.Now(), false);
//   if (answer.directive.kind() != v1::Directive::KIND_UNSPECIFIED) ...
#ifndef CHORUS_COORDINATOR_SCHEDULING_RANK_MESSAGES_H_
#define CHORUS_COORDINATOR_SCHEDULING_RANK_MESSAGES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/scheduling/running_job.h"

namespace chorus {

// Note [Aggregated heartbeats]
// At 16,384 ranks, one stream and one message per rank per second is
// most of a coordinator core (docs/benchmarks.md). An agent may instead
// collect its ranks' heartbeats and send them as one RankHeartbeats
// message per interval on its own stream: the coordinator then takes its
// lock and wakes once per agent, not per rank. Each heartbeat in it is
// recorded exactly as one on the rank's stream (Scheduler::Heartbeat), so a
// rank's liveness stays its own: the agent forwards only what a rank sent
// since the last interval, and a rank that stopped sending is absent and
// ages into DEAD after dead_after_seconds while its agent is alive. A
// directive for a rank goes back to the agent in one RankDirectives
// message, with the slot to hand it to. A heartbeat for a rank that does
// not run on the agent is ignored: an agent speaks only for its ranks.
// The per-rank Heartbeat stream stays: ranks started by an older agent,
// and a rank whose agent does not collect heartbeats, use it unchanged.

struct HeartbeatAnswer {
  // The rank is one of the current generation: its heartbeat was recorded
  // and its stream stays open.
  bool live = false;
  // KIND_UNSPECIFIED: none.
  v1::Directive directive;
  // Rank 0 of a program job past step 0: the heartbeat carries the
  // program's progress, which becomes the job's latest metrics.
  bool progress = false;
};

// `heartbeat` from a rank of `run` at `now`; `via_agent`: it came in its
// agent's batch (Note [A silent agent's ranks] in hang_detector.h).
// - A survivor of the previous generation that has not joined the current
//   one yet is heard (Note [A survivor that does not join]) and, for an
//   elastic job, told to RE_RENDEZVOUS to the current generation.
// - A rank of the current generation has its heartbeat recorded: a FINISHED
//   phase marks it finished unless it was told to stop; one of a program
//   that re-forms in its own process says so (Note [Restart-all]). It is
//   told to REFORM_AT_STEP_BOUNDARY while a planned change waits for its
//   step boundary, and to CHECKPOINT_AND_HOLD while the job waits for a
//   checkpoint to go back to the queue (Note [Re-queue]).
// - Any other heartbeat is not live and gets no directive.
HeartbeatAnswer RecordHeartbeat(RunningJob& run, const v1::RankHeartbeat& heartbeat, absl::Time now,
                                bool via_agent);

struct JoinAnswer {
  enum class Kind {
    kJoin,    // `rank` joins the current generation's rendezvous
    kLeave,   // a departing rank at its step boundary: answered with `leave`
    kRefuse,  // answered with `refusal`
  };
  Kind kind = Kind::kRefuse;
  int rank = -1;
  absl::Status refusal;
  v1::JoinResponse leave;  // leave set, with the current generation
};

// A Join of `request` for `run` (staged newcomers and planned changes are
// handled before): a departing rank leaves; a survivor asking for a
// generation not formed yet, a rank the job is still taking back after a
// restart or a lost agent (UNAVAILABLE: join again), a stale generation of
// a job that is not elastic (FAILED_PRECONDITION), and a slot where the job
// has no rank (NOT_FOUND) are refused; any other joins as its rank.
JoinAnswer AnswerJoin(const RunningJob& run, const v1::JoinRequest& request);

// Whether `request` is the first Join at the step boundary of `run`'s
// planned change: the job is elastic and formed, a change is planned and
// not waiting for slots, no rank is being taken back, and the Join is for
// the next generation.
bool StartsPlannedChange(const RunningJob& run, const v1::JoinRequest& request);

// Note [Reports are written outside the scheduler's lock]
// A report ends in database writes (the job's metrics, a metrics event,
// synchronous commits), and every agent's stream, heartbeat and join waits for
// the scheduler's lock. So Scheduler::Report checks the rank under the lock, takes the
// job's `report_writes` mutex while still holding it, and writes after letting
// it go. Whoever records the job's end (Scheduler::EndLocked) takes `report_writes` first,
// so a report that was accepted is written before the job's final event, and
// readers of the events see the final metrics before the end.

// A report of `run`'s rank. Returns the metrics to record: the report's,
// with an elastic job's "restarts" and "recovery_seconds" (what only the
// coordinator knows). A final report of success marks the rank finished,
// unless it was told to stop (a restart-all's SIGTERM, an eviction); one
// from a generation an elastic job (not a restart-all) has left since
// marks the job finished_before_reform (Note [Diagnoses during shutdown])
// and returns its metrics as they are. FAILED_PRECONDITION for any other
// rank that is not one of the current generation.
absl::StatusOr<v1::Metrics> RecordReport(RunningJob& run, const v1::ReportRequest& report);

// `latest` moved forward to a program's progress at `step` (its epoch, and
// its loss and samples/s when they are not 0); `latest` as it is when the
// progress is behind it. A program job's rank 0 heartbeats and its final
// report carry the progress record of its program.
v1::Metrics WithProgress(v1::Metrics latest, int64_t step, int64_t epoch, double loss,
                         double samples_per_second);

// What a staged newcomer's chorus-rank is answered (Note [Staged growth]
// in staged_growth.h): the planned membership of the staged generation of
// `job` (running as `run`), so that it starts its program at once.
v1::JoinResponse StagedJoinResponse(const v1::Job& job, const RunningJob& run,
                                    const StagedNewcomer& newcomer);

// The directive for a rank still heartbeating for `job`, which does not run
// here: ABORT with its reason when it FAILED or was CANCELLED (its agent
// was lost, or has not stopped it yet); nullopt otherwise.
std::optional<v1::Directive> AbortDirective(const v1::Job& job);

// Adds to `directives` (an agent's answer to its batch of heartbeats) the
// `directive` for the rank that sent `heartbeat` from `slot` (-1: a rank of
// an older generation or an ended job).
void AddDirective(v1::RankDirectives& directives, const v1::RankHeartbeat& heartbeat, int slot,
                  const v1::Directive& directive);

// Why a request about `job` is refused when the job does not run here:
// FAILED_PRECONDITION "job ID is STATE" and `then`, or `job`'s own error
// (NOT_FOUND for an unknown job).
absl::Status NotRunning(const absl::StatusOr<v1::Job>& job,
                        const std::string& then = ", not running");

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_RANK_MESSAGES_H_
