// Elastic state: the kinds of change that move an elastic job to its next
// generation, and the phase of the change a running job is in (Note
// [Elastic phase]; docs/elastic.md).
//
// Thread-safety: plain values and pure functions; the Scheduler holds its
// lock around every use of a job's ElasticPhase.
//
// Example:
//   ElasticPhase phase;                                   // steady
//   phase.Plan({"agent a1 was drained", ReformKind::kDrain, /*world=*/3});
//   phase.BeginForming(ReformKind::kDrain, now, now + absl::Seconds(60));
//   if (std::optional<ElasticPhase::Forming> formed = phase.GenerationFormed()) {
//     metrics.GenerationStarted(std::string(ReformKindName(formed->kind)));
//   }
#ifndef CHORUS_COORDINATOR_SCHEDULING_ELASTIC_STATE_H_
#define CHORUS_COORDINATOR_SCHEDULING_ELASTIC_STATE_H_

#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "absl/time/time.h"

namespace chorus {

// Why an elastic job changes generation.
enum class ReformKind {
  // Failures: they count against elastic.max_restarts.
  kRankLost,     // a rank exited with a non-zero code
  kAgentLost,    // the agent of a rank is gone
  kHangRestart,  // hang_detection.action RESTART with no rank to evict
  // Planned changes, at a step boundary: not restarts.
  kDrain,    // an agent the job runs on is drained
  kScaleUp,  // free slots let the job grow (or take replacements owed)
  kPreempt,  // a higher-priority job takes some of its ranks
};

// Whether a change of `kind` was not planned (counts as a restart).
bool IsFailure(ReformKind kind);

// The kind's name: the `cause` label of chorus_generations_total, and what
// the state database keeps (coordinator::ElasticRecord). These strings are
// part of the metrics and the saved records: never change one.
std::string_view ReformKindName(ReformKind kind);

// The kind ReformKindName names; nullopt for any other string (a record
// written by a newer coordinator, say).
std::optional<ReformKind> ParseReformKind(std::string_view name);

// Note [Elastic phase]
// Where an elastic job is in its change of generation. One phase at a time:
//
//   phase       holds                        entered by           left by
//   Steady      nothing                      the job's start,     a change
//                                            GenerationFormed
//   Forming     kind, started, deadline      BeginForming         GenerationFormed,
//                                            (g+1 started)        another change
//   Waiting     cause, kind, started, until  BeginWaiting (below  BeginForming (slots
//                                            min_ranks)           came), or the job fails
//   Restarting  cause, kind, started,        BeginRestarting      BeginForming,
//               deadline                     (Note [Restart-all]) BeginWaiting
//
// `started` is when the change began (the failure heard, the step boundary
// reached, the restart-all begun); it carries over from phase to phase
// until the generation forms, so that recovery_seconds counts the whole
// change. Each deadline is elastic.wait_seconds from its phase's start;
// past it the job fails (ReformOverdue in hang_restart.h, and PlanReform in
// reform_plan.h for a wait).
// Steady holds no deadline: the first generation (or one taken back after a
// coordinator restart) gathers its ranks under the Join deadlines.
//
// A planned change (a drain, a growth, a preemption) is not a phase but a
// request beside it: the ranks are told on their heartbeats to re-form at
// their next step boundary, and their first Join of g+1 makes the change.
// It may be requested while a generation forms (it waits for it to form:
// the directive needs a formed generation) and stays recorded while the job
// waits for slots; BeginForming fulfils it. A drain is not replaced by any
// other planned change (its ranks must leave).
//
// A wait for slots can begin while generation g still forms (a further
// failure, no free slot): g keeps its own deadline (Waiting::unformed),
// and it may still form, its lost rank having joined before it was lost.
//
// A restart-all stops every rank, so it does not wait for the generation
// that was forming: that generation will not form.
class ElasticPhase {
 public:
  struct Steady {};
  struct Forming {
    ReformKind kind = ReformKind::kRankLost;
    absl::Time started;
    absl::Time deadline;
  };
  struct Waiting {
    std::string cause;
    ReformKind kind = ReformKind::kRankLost;
    absl::Time started;
    absl::Time until;
    std::optional<Forming> unformed;  // generation g, still forming
  };
  struct Restarting {
    std::string cause;
    ReformKind kind = ReformKind::kRankLost;
    absl::Time started;
    absl::Time deadline;  // the stopped ranks must have exited by then
  };
  using Phase = std::variant<Steady, Forming, Waiting, Restarting>;

  // A planned change: `world` is the world size it is expected to give
  // (sent with REFORM_AT_STEP_BOUNDARY to pick the step boundary), nullopt
  // when no plan could be made when it was requested.
  struct Planned {
    std::string cause;
    ReformKind kind = ReformKind::kScaleUp;
    std::optional<int> world;
  };

  ElasticPhase() = default;
  // As a saved record restores it (job_recovery.cc).
  explicit ElasticPhase(Phase phase, std::optional<Planned> planned = std::nullopt)
      : phase_(std::move(phase)), planned_(std::move(planned)) {}

  const Phase& phase() const { return phase_; }
  bool steady() const { return std::holds_alternative<Steady>(phase_); }
  const Forming* forming() const { return std::get_if<Forming>(&phase_); }
  const Waiting* waiting() const { return std::get_if<Waiting>(&phase_); }
  const Restarting* restarting() const { return std::get_if<Restarting>(&phase_); }
  Restarting* restarting() { return std::get_if<Restarting>(&phase_); }
  // When the change under way began; nullopt when steady.
  std::optional<absl::Time> started() const;
  const std::optional<Planned>& planned() const { return planned_; }

  // Transitions (Note [Elastic phase]).
  // Generation g+1 was started after a change of `kind` and must form by
  // `deadline`. Fulfils the planned change.
  void BeginForming(ReformKind kind, absl::Time now, absl::Time deadline);
  // Below resources.min_ranks with no free slot: waits until `until`.
  // REQUIRES: not waiting already.
  void BeginWaiting(std::string cause, ReformKind kind, absl::Time now, absl::Time until);
  // Every rank is told to stop (Note [Restart-all]) for `cause` of `kind`.
  // REQUIRES: not restarting already.
  void BeginRestarting(std::string cause, ReformKind kind, absl::Time now, absl::Time deadline);
  // The generation that was forming has formed: returns its Forming
  // (Forming becomes Steady; a wait keeps waiting). nullopt when none was.
  std::optional<Forming> GenerationFormed();
  // Requests a planned change, replacing one requested before; a drain is
  // kept against anything but a drain. Returns whether `planned` was taken.
  bool Plan(Planned planned);

 private:
  Phase phase_;
  std::optional<Planned> planned_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_ELASTIC_STATE_H_
