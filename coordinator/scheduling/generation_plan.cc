#include "coordinator/scheduling/generation_plan.h"

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"

namespace chorus {

int NextGeneration::newcomers() const {
  return static_cast<int>(std::count(old_rank.begin(), old_rank.end(), -1));
}

absl::StatusOr<NextGeneration> PlanNextGeneration(const std::vector<RankSlot>& current,
                                                  const std::vector<bool>& lost,
                                                  const std::vector<AgentSlots>& free,
                                                  const QueuedJob& job) {
  int survivors = 0;
  for (size_t rank = 0; rank < current.size(); ++rank) {
    if (!lost.at(rank)) ++survivors;
  }
  std::vector<RankSlot> candidates;
  for (const AgentSlots& agent : free) {
    if (agent.device != job.resources.device()) continue;
    const int fit = std::min<int>(RanksThatFit(job, agent), agent.free_slots.size());
    for (int i = 0; i < fit; ++i) {
      RankSlot slot;
      slot.agent_id = agent.agent_id;
      slot.slot = agent.free_slots[i];
      candidates.push_back(slot);
    }
  }
  const int wanted = std::max(0, job.resources.max_ranks() - survivors);
  const int taken = std::min<int>(wanted, candidates.size());
  if (survivors + taken < job.resources.min_ranks()) {
    return absl::FailedPreconditionError(
        absl::StrCat(survivors, " surviving rank(s) and ", candidates.size(), " free ",
                     v1::ResourceSpec::Device_Name(job.resources.device()),
                     " slot(s) are fewer than resources.min_ranks ", job.resources.min_ranks()));
  }
  NextGeneration next;
  size_t used = 0;
  for (size_t rank = 0; rank < current.size(); ++rank) {
    if (!lost[rank]) {
      next.ranks.push_back(current[rank]);
      next.old_rank.push_back(static_cast<int>(rank));
    } else if (!job.survivors_first && used < static_cast<size_t>(taken)) {
      next.ranks.push_back(candidates[used++]);
      next.old_rank.push_back(-1);
    }
  }
  while (used < static_cast<size_t>(taken)) {
    next.ranks.push_back(candidates[used++]);
    next.old_rank.push_back(-1);
  }
  // Ranks on one agent, counted in rank order.
  std::map<std::string, int> per_agent;
  for (RankSlot& r : next.ranks) r.local_rank = per_agent[r.agent_id]++;
  for (RankSlot& r : next.ranks) r.local_world_size = per_agent[r.agent_id];
  return next;
}

}  // namespace chorus
