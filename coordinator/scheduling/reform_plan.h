// Reform plan: what an elastic job does after a change (a lost rank or
// agent, a hang restart, a drain, a growth, a preemption), as a pure
// function of the job's state, the free slots and its spec: fail, wait for
// slots, or form its next generation (PlanNextGeneration's plan). The
// Scheduler applies the answer (ends the job, records the wait, launches
// the newcomers); it decides nothing itself (scheduler_elastic.cc).
//
// Thread-safety: pure functions.
//
// Example:
//   ReformJob job = ...;  // the job as it is now, `lost` its ranks that leave
//   ReformDecision d = PlanReform(job, free_slots, ToQueuedJob(id, spec), clock.Now());
//   if (const auto* form = std::get_if<ReformDecision::Form>(&d.verdict)) {
//     StartGeneration(form->next);
//   }
#ifndef CHORUS_COORDINATOR_SCHEDULING_REFORM_PLAN_H_
#define CHORUS_COORDINATOR_SCHEDULING_REFORM_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/scheduling/elastic_state.h"
#include "coordinator/scheduling/generation_plan.h"
#include "coordinator/scheduling/placement.h"

namespace chorus {

// An elastic job as the plan sees it, after `cause` of `kind`.
struct ReformJob {
  std::string cause;
  ReformKind kind = ReformKind::kRankLost;
  int64_t generation = 0;  // the current one; the plan is for the next
  int restarts = 0;        // failures survived so far
  int max_restarts = 0;    // elastic.max_restarts
  int wait_seconds = 0;    // elastic.wait_seconds
  // Note [Staged growth] in staged_growth.h: a program that re-forms in
  // its own process (a program job that does not restart all): after a
  // failure its survivors form alone while they are enough.
  bool stages_replacements = false;
  std::vector<RankSlot> ranks;  // index = rank
  std::vector<bool> lost;       // same size: the ranks that leave
  // The wait for slots under way (ElasticPhase::Waiting::until), if any.
  std::optional<absl::Time> waiting_until;
  // The job's history, one line per change (RunningJob::history), quoted at
  // the end of a failure's reason; null: none. Not owned.
  const std::vector<std::string>* history = nullptr;
};

struct ReformDecision {
  // The job fails with `reason` (elastic.max_restarts used up, or the wait
  // for slots ran out).
  struct Fail {
    std::string reason;
  };
  // Too few slots for resources.min_ranks: the job waits until `until`.
  // `begins`: this change starts the wait (else it goes on); `why` says
  // what is missing.
  struct Wait {
    absl::Time until;
    bool begins = false;
    std::string why;
  };
  // The next generation forms with `next`; `replacements_owed` when it is
  // the survivors alone and free slots were left for a staged growth.
  struct Form {
    NextGeneration next;
    bool replacements_owed = false;
  };
  std::variant<Fail, Wait, Form> verdict;
};

// The reason `job` fails at once: a failure with elastic.max_restarts used
// up; nullopt otherwise.
std::optional<std::string> RestartsUsedUp(const ReformJob& job);

// What `job` does now: Fail when RestartsUsedUp, else Form with the plan of
// its next generation over `free` (the slots it may take, in the order to
// take them) for `spec` (its resources, capped by its owner's quota), else
// (below spec.resources.min_ranks) Wait up to job.wait_seconds from the
// first time, and Fail once `now` is past the wait.
ReformDecision PlanReform(const ReformJob& job, const std::vector<AgentSlots>& free,
                          const QueuedJob& spec, absl::Time now);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_REFORM_PLAN_H_
