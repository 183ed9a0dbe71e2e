#include "coordinator/placement.h"

#include <algorithm>
#include <map>
#include <utility>

namespace chorus {

std::vector<JobPlacement> PlaceJobs(const std::vector<QueuedJob>& queued,
                                    const std::vector<AgentSlots>& agents) {
  // (agent index, slot) still free, in rank order.
  std::vector<std::vector<int>> free;
  for (const AgentSlots& agent : agents) free.push_back(agent.free_slots);
  std::vector<JobPlacement> placed;
  for (const QueuedJob& job : queued) {
    const v1::ResourceSpec& r = job.resources;
    std::vector<std::pair<size_t, int>> candidates;
    for (size_t a = 0; a < agents.size(); ++a) {
      if (agents[a].device != r.device()) continue;
      for (int slot : free[a]) candidates.emplace_back(a, slot);
    }
    if (static_cast<int>(candidates.size()) < r.min_ranks()) break;  // strict FIFO
    candidates.resize(std::min<size_t>(candidates.size(), std::max(0, r.max_ranks())));
    std::map<size_t, int> per_agent;
    for (const auto& [a, slot] : candidates) ++per_agent[a];
    JobPlacement& job_placement = placed.emplace_back();
    job_placement.job_id = job.job_id;
    std::map<size_t, int> next_local;
    for (const auto& [a, slot] : candidates) {
      RankSlot& rank = job_placement.ranks.emplace_back();
      rank.agent_id = agents[a].agent_id;
      rank.slot = slot;
      rank.local_rank = next_local[a]++;
      rank.local_world_size = per_agent[a];
      free[a].erase(std::find(free[a].begin(), free[a].end(), slot));
    }
  }
  return placed;
}

}  // namespace chorus
