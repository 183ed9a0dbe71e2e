#include "coordinator/scheduling/preemption.h"

#include <algorithm>
#include <map>

namespace chorus {
namespace {

// The ranks `run` gives up towards `needed` (which it lowers): its highest
// ones, above min_ranks, on agents that can hold one of `holder`'s ranks.
std::vector<int> RanksToGive(const QueueEntry& holder, const ElasticRun& run,
                             const std::map<std::string, const AgentSlots*>& agents, int& needed) {
  std::vector<int> ranks;
  int spare = static_cast<int>(run.ranks.size()) - run.min_ranks;
  for (int rank = static_cast<int>(run.ranks.size()) - 1; rank > 0 && spare > 0 && needed > 0;
       --rank) {
    auto agent = agents.find(run.ranks[rank].agent_id);
    if (agent == agents.end() || RanksThatFit(holder.job, *agent->second) == 0) continue;
    ranks.insert(ranks.begin(), rank);
    --spare;
    --needed;
  }
  return ranks;
}

// Note [Preemption by re-queueing]: whole jobs of `runs` that `holder` may
// send back to the queue, lowest priority then newest, until `needed`
// (which it lowers) is covered.
std::vector<Preemption> JobsToRequeue(const QueueEntry& holder, const std::vector<RequeueRun>& runs,
                                      const std::map<std::string, const AgentSlots*>& agents,
                                      int& needed) {
  std::vector<size_t> order;
  for (size_t i = 0; i < runs.size(); ++i) {
    const RequeueRun& run = runs[i];
    if (run.priority < holder.priority && run.device == holder.job.resources.device() &&
        (run.checkpointable || run.preemptible)) {
      order.push_back(i);
    }
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (runs[a].priority != runs[b].priority) return runs[a].priority < runs[b].priority;
    return a > b;
  });
  std::vector<Preemption> plan;
  for (size_t i : order) {
    if (needed <= 0) break;
    int usable = 0;
    for (const RankSlot& slot : runs[i].ranks) {
      auto agent = agents.find(slot.agent_id);
      if (agent != agents.end() && RanksThatFit(holder.job, *agent->second) > 0) ++usable;
    }
    if (usable == 0) continue;
    Preemption& p = plan.emplace_back();
    p.job_id = runs[i].job_id;
    p.requeue = true;
    for (size_t rank = 0; rank < runs[i].ranks.size(); ++rank)
      p.ranks.push_back(static_cast<int>(rank));
    needed -= usable;
  }
  return plan;
}

}  // namespace

std::vector<Preemption> PlanPreemption(const QueueEntry& holder, int needed,
                                       const std::vector<ElasticRun>& runs,
                                       const std::vector<AgentSlots>& agents,
                                       const std::vector<RequeueRun>& requeueable) {
  if (needed <= 0) return {};
  std::map<std::string, const AgentSlots*> by_id;
  for (const AgentSlots& agent : agents) by_id[agent.agent_id] = &agent;
  std::vector<size_t> order;
  for (size_t i = 0; i < runs.size(); ++i) {
    const ElasticRun& run = runs[i];
    if (run.priority < holder.priority && run.device == holder.job.resources.device() &&
        static_cast<int>(run.ranks.size()) > run.min_ranks) {
      order.push_back(i);
    }
  }
  // The lowest priority first; within one, the newest (`runs` is in submit order).
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (runs[a].priority != runs[b].priority) return runs[a].priority < runs[b].priority;
    return a > b;
  });
  std::vector<Preemption> plan;
  for (size_t i : order) {
    if (needed <= 0) break;
    std::vector<int> ranks = RanksToGive(holder, runs[i], by_id, needed);
    if (!ranks.empty()) plan.push_back({runs[i].job_id, std::move(ranks)});
  }
  if (needed > 0) {
    for (Preemption& p : JobsToRequeue(holder, requeueable, by_id, needed))
      plan.push_back(std::move(p));
  }
  if (needed > 0) return {};
  return plan;
}

}  // namespace chorus
