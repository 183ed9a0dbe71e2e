// Generation plan: who the ranks of an elastic job's next generation are,
// as a pure function of the current ranks, the ones lost and the free slots.
//
// Survivors keep their slots (and their processes). A lost rank's number goes
// to a newcomer on a free slot of the job's device when there is one, so a
// replaced rank keeps its number; without one the rank is dropped and the
// ranks after it move down. A job with hot spares (job.survivors_first)
// numbers every survivor first, in rank order, and newcomers after them: a
// spare (a high rank) then takes a lost trainer's place at once, and the
// newcomer, still starting, becomes the spare (Note [Hot spares] in
// sdk/decentralized_data_parallel.h). The generation holds at most max_ranks
// ranks; fewer than min_ranks is an error naming the figures. local_rank and local_world_size are
// counted again over the new generation.
//
// Thread-safety: a pure function.
//
// Example:
//   ASSIGN_OR_RETURN(NextGeneration next,
//                    PlanNextGeneration(current, /*lost=*/{false, true, false, false},
//                                       agents.FreeSlots(), ToQueuedJob(id, spec)));
//   for (size_t rank = 0; rank < next.ranks.size(); ++rank)
//     if (next.old_rank[rank] < 0) Launch(next.ranks[rank]);
#ifndef CHORUS_COORDINATOR_SCHEDULING_GENERATION_PLAN_H_
#define CHORUS_COORDINATOR_SCHEDULING_GENERATION_PLAN_H_

#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/scheduling/placement.h"

namespace chorus {

struct NextGeneration {
  std::vector<RankSlot> ranks;  // index = rank in the next generation
  // Index = rank in the next generation: its rank in the current one, or -1
  // for a newcomer (a process to launch).
  std::vector<int> old_rank;
  int newcomers() const;
};

// `current` (index = rank) with `lost` (same size) marking the ranks that are
// gone; `free` are the agents' free slots in registration order (slots of the
// lost ranks included once they are released). FAILED_PRECONDITION when fewer
// than job.resources.min_ranks ranks can be had.
absl::StatusOr<NextGeneration> PlanNextGeneration(const std::vector<RankSlot>& current,
                                                  const std::vector<bool>& lost,
                                                  const std::vector<AgentSlots>& free,
                                                  const QueuedJob& job);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_GENERATION_PLAN_H_
