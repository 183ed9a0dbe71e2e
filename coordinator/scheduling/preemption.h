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
// Note [Preemption by re-queueing]
// When shrinking elastic jobs cannot free `needed` slots, whole running
// jobs that are not elastic give theirs: those of a lower priority that can
// be checkpointed (RequeueRun::checkpointable) or that their spec declares
// resources.preemptible, the lowest priority first, then the newest. A job
// is counted with its ranks on agents that can hold one of the waiting
// job's ranks. Still all or none: when the elastic ranks and these jobs
// together do not cover `needed`, nothing is taken. Such a job is
// checkpointed at its next step boundary, stopped and sent back to the
// queue, where it resumes from that checkpoint when placed again (Note
// [Re-queue] in requeue_wait.h); a preemptible one without
// checkpoints starts again from scratch.
//
// Thread-safety: a pure function.
//
// Example:
//   for (const Preemption& p : PlanPreemption(holder, needed, elastic_runs, agents))
//     ShrinkAtStepBoundary(p.job_id, p.ranks);
#ifndef CHORUS_COORDINATOR_SCHEDULING_PREEMPTION_H_
#define CHORUS_COORDINATOR_SCHEDULING_PREEMPTION_H_

#include <string>
#include <vector>

#include "chorus/v1/job.pb.h"
#include "coordinator/scheduling/placement.h"
#include "coordinator/scheduling/queue_plan.h"

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

// A running job that is not elastic, with no re-queue under way.
struct RequeueRun {
  std::string job_id;
  v1::JobSpec::Priority priority = v1::JobSpec::NORMAL;
  v1::ResourceSpec::Device device = v1::ResourceSpec::CPU;
  // It honours a checkpoint request at its next step boundary and resumes
  // from a checkpoint (the built-in trainer).
  bool checkpointable = false;
  // resources.preemptible: it may be stopped and started again from scratch.
  bool preemptible = false;
  std::vector<RankSlot> ranks;  // index = rank
};

// Ranks of one job that leave at its next step boundary, or (requeue) a
// whole job that goes back to the queue.
struct Preemption {
  std::string job_id;
  std::vector<int> ranks;  // ascending; every rank when `requeue`
  bool requeue = false;
};

// Ranks of `runs` (job ids in submit order) whose slots, `needed` of them,
// `holder` could use, then whole jobs of `requeueable` (submit order) when
// those are not enough; empty when they do not add up to `needed`.
std::vector<Preemption> PlanPreemption(const QueueEntry& holder, int needed,
                                       const std::vector<ElasticRun>& runs,
                                       const std::vector<AgentSlots>& agents,
                                       const std::vector<RequeueRun>& requeueable = {});

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_PREEMPTION_H_
