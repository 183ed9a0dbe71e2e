#include "coordinator/scheduling/cluster_state.h"

#include <algorithm>

namespace chorus {

QueueUsage ClusterState::Usage() const {
  QueueUsage usage;
  for (const auto& [job_id, run] : running) {
    usage.slots_in_use[run.owner][run.device] += static_cast<int>(run.ranks.size());
  }
  usage.fair_share = fair_share.usage();
  usage.reservations_held = plan.reservations_held;  // Note [Reservation]
  return usage;
}

v1::AgentInfo ClusterState::AgentInfo(const std::string& agent_id) const {
  v1::AgentInfo info;
  const AgentRegistry::Agent* agent = agents.Find(agent_id);
  if (agent == nullptr) return info;
  info.set_agent_id(agent_id);
  info.set_host(agent->hello.host());
  info.set_device(agent->hello.device());
  info.set_slots(static_cast<int>(agent->busy.size()));
  const int busy = static_cast<int>(std::count(agent->busy.begin(), agent->busy.end(), true));
  info.set_busy_slots(busy);
  for (const auto& [job_id, run] : running) {
    if (run.RunsOn(agent_id)) info.add_jobs(job_id);
  }
  info.set_state(!agent->draining ? v1::AgentInfo::ACTIVE
                 : busy > 0       ? v1::AgentInfo::DRAINING
                                  : v1::AgentInfo::DRAINED);
  return info;
}

}  // namespace chorus
