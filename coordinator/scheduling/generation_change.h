// GenerationChange: what one elastic job does after a lost rank, a lost
// agent, a hang restart or a planned change (docs/elastic.md). Its
// transition, ChangeGeneration, moves the job's own state (its phase, ranks,
// rendezvous, history, staged growth and leaving ranks, and the slots it
// frees and takes in the agent registry) and returns what the Scheduler is to
// do: fail the job, record events, stop ranks, answer aborted joins, and for
// a generation begun, record it, resolve its checkpoint and launch its
// newcomers.
//
// Thread-safety: none; the Scheduler holds its lock around every call.
//
// Example:
//   ChangeInputs in{job, agents, clock.Now(), free_slots, capped};
//   GenerationChange change = ChangeGeneration(run, "rank 1 exited", ReformKind::kRankLost, in);
//   if (change.fail.has_value()) End(*change.fail);
//   else if (change.begun.has_value()) Launch(change.begun->generation);
#ifndef CHORUS_COORDINATOR_SCHEDULING_GENERATION_CHANGE_H_
#define CHORUS_COORDINATOR_SCHEDULING_GENERATION_CHANGE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/scheduling/agent_registry.h"
#include "coordinator/scheduling/elastic_state.h"
#include "coordinator/scheduling/generation_plan.h"
#include "coordinator/scheduling/placement.h"
#include "coordinator/scheduling/queue_plan.h"
#include "coordinator/scheduling/rendezvous.h"
#include "coordinator/scheduling/running_job.h"
#include "coordinator/scheduling/staged_growth.h"

namespace chorus {

// What a change reads from outside the job.
struct ChangeInputs {
  const v1::Job& job;
  // Where the slots of ranks that exited are freed and the newcomers' taken.
  AgentRegistry& agents;
  absl::Time now;
  // The free slots the next generation may take, in the order to take them
  // (asked once the lost ranks' slots are free).
  std::function<std::vector<AgentSlots>()> free_slots;
  // The job as a plan sees it, max_ranks capped by its owner's quota.
  std::function<QueuedJob()> capped;
};

// Generation `generation` of `world` ranks was begun after a change of
// `kind`; `change` is its history line. Its newcomers are the ranks in state
// LAUNCHING; `staged` is what its staged growth asks
// (StagedGrowth::OnGenerationBegun; the adopted are JOINING already).
// (Defined outside GenerationChange, as RequeueWaitState in requeue_wait.h.)
struct GenerationBegun {
  int64_t generation = 0;
  int world = 0;
  ReformKind kind = ReformKind::kRankLost;
  std::string change;
  StagedGrowth::Actions staged;
};

// What the Scheduler is to do after a change.
struct GenerationChange {
  // The job ends FAILED with this reason (past elastic.max_restarts, below
  // resources.min_ranks past elastic.wait_seconds).
  std::optional<std::string> fail;
  // Events for the job's history, in order.
  std::vector<std::string> events;
  // Ranks to stop, by agent id (Note [Restart-all] in running_job.h).
  std::map<std::string, std::vector<int>> stop;
  std::string stop_reason;
  // Joins of a generation that will not form, answered ABORTED.
  Rendezvous::Answers joins;
  // The generation begun, if one was.
  using Begun = GenerationBegun;
  std::optional<Begun> begun;
};

// After `cause` of `kind` (a failure, IsFailure, counts against
// elastic.max_restarts): ranks that exited, whose agent is gone or draining
// leave; survivors keep their slots; newcomers take free slots up to
// resources.max_ranks (PlanReform in reform_plan.h). Past
// elastic.max_restarts the job fails with the history in its reason. Below
// resources.min_ranks it waits (ElasticPhase::Waiting; the Scheduler
// retries on every change and Tick) and fails once elastic.wait_seconds
// have passed. A job that restarts all (RunningJob::RestartsAll) first has
// every live rank stopped (the phase Restarting); the exit of the last one
// changes it again, and the next generation launches every rank.
GenerationChange ChangeGeneration(RunningJob& run, const std::string& cause, ReformKind kind,
                                  const ChangeInputs& in);

// The size of `run`'s next generation were its planned change made now:
// ranks that exited or whose agent is gone or draining leave, and `free`
// slots are taken up to `capped`'s max_ranks; nullopt when it could not
// form (PlanNextGeneration's plan).
std::optional<int> PlannedWorld(const RunningJob& run, const AgentRegistry& agents,
                                const std::vector<AgentSlots>& free, const QueuedJob& capped);

// The generation `run` is forming has formed at `now`: the event that says
// so, with how long it took; a failure's time is the job's
// recovery_seconds. Nullopt when no change was forming.
std::optional<std::string> OnGenerationFormed(RunningJob& run, absl::Time now);

// A growth of an elastic job onto free slots (docs/elastic.md): its next
// generation, its cause, and whether it is staged (Note [Staged growth] in
// staged_growth.h: a program that re-forms in its own process).
struct Growth {
  NextGeneration next;
  std::string cause;
  bool staged = false;
};
// Whether `run` may grow at `now`: elastic and steady with no staged growth
// under way, and owing replacements (taken at once) or
// elastic.scale_up_interval_seconds past its last growth.
bool MayGrow(const RunningJob& run, absl::Time now);
// `run`'s growth onto `free` (the unreserved slots) up to `max_ranks`, as
// `capped` (its owner's quota) allows; nullopt when no newcomer fits.
std::optional<Growth> PlanGrowth(const RunningJob& run, int max_ranks,
                                 const std::vector<AgentSlots>& free, const QueuedJob& capped);
// Note [Staged growth]: launches `growth`'s newcomers for `run`'s next
// generation before it forms (their slots busy in `agents`, told to dial
// `coordinator_address`) and stages them (StagedGrowth::Start).
JobActions StageGrowth(RunningJob& run, const std::string& job_id, const Growth& growth,
                       AgentRegistry& agents, const std::string& coordinator_address,
                       absl::Time now);
// Applies what run.staged()'s transition asks: frees the slots of newcomers
// that exited, and stops those it drops (they depart: their slots stay busy
// until they exit).
JobActions ApplyStaged(RunningJob& run, const std::string& job_id,
                       const StagedGrowth::Actions& staged, AgentRegistry& agents);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_GENERATION_CHANGE_H_
