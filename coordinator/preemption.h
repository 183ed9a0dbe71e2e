// Preemption: which ranks of running lower-priority elastic jobs leave so
// that the job holding a reservation can start, as a pure function
// (docs/scheduling.md).
//
// Note [Preemption by shrinking]
// A queued job holding its device's reservation (queue_plan.h) that still
// lacks `needed` slots may take them from running elastic jobs of a lower
// priority: each gives up ranks at its next step boundary, the way a drain
// takes ranks away (a planned re-formation without them, Scheduler::
// RequestReformLocked), never going below its resources.min_ranks. Nothing
// is lost: the survivors keep the model in memory and the step they agreed
// on; the ranks that leave exit once the next generation has formed, and
// their slots, reserved, go to the waiting job. Jobs of the lowest priority
// give first, then the newest; within a job the highest ranks leave (rank 0
// stays), skipping ranks on agents whose memory cannot hold one of the
// waiting job's ranks. Either enough ranks to cover `needed` are found, or
// none is taken: shrinking jobs that would not let it start helps nobody.
// The shrunk jobs grow back, by the usual growth, onto slots no reservation
// holds.
//
// Thread-safety: a pure function.
//
// Example:
//   for (const Preemption& p : PlanPreemption(holder, needed, elastic_runs, agents))
//     ShrinkAtStepBoundary(p.job_id, p.ranks);
#ifndef CHORUS_COORDINATOR_PREEMPTION_H_
#define CHORUS_COORDINATOR_PREEMPTION_H_

#include <string>
#include <vector>

#include "chorus/v1/job.pb.h"
#include "coordinator/placement.h"
#include "coordinator/queue_plan.h"

namespace chorus {

// A running elastic job that may give up ranks now (formed, no change of
// generation planned or under way).
struct ElasticRun {
  std::string job_id;
  v1::JobSpec::Priority priority = v1::JobSpec::NORMAL;
  v1::ResourceSpec::Device device = v1::ResourceSpec::CPU;
  int min_ranks = 1;
  std::vector<RankSlot> ranks;  // index = rank
};

// Ranks of one job that leave at its next step boundary.
struct Preemption {
  std::string job_id;
  std::vector<int> ranks;  // ascending
};

// Ranks of `runs` (job ids in submit order) whose slots, `needed` of them,
// `holder` could use; empty when they do not add up to `needed`.
std::vector<Preemption> PlanPreemption(const QueueEntry& holder, int needed,
                                       const std::vector<ElasticRun>& runs,
                                       const std::vector<AgentSlots>& agents);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_PREEMPTION_H_
