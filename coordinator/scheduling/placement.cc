#include "coordinator/scheduling/placement.h"

#include <algorithm>
#include <climits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/memory_estimate.h"

namespace chorus {

std::vector<std::pair<size_t, int>> SlotsFor(const QueuedJob& job,
                                             const std::vector<AgentSlots>& agents,
                                             const std::vector<std::vector<int>>& free,
                                             size_t limit) {
  std::vector<std::pair<size_t, int>> candidates;
  for (size_t a = 0; a < agents.size() && candidates.size() < limit; ++a) {
    if (agents[a].device != job.resources.device() || free[a].empty()) continue;
    int room = RanksThatFit(job, agents[a]);
    for (int slot : free[a]) {
      if (room-- <= 0 || candidates.size() >= limit) break;
      candidates.emplace_back(a, slot);
    }
  }
  return candidates;
}

JobPlacement TakeSlots(const std::string& job_id, const std::vector<AgentSlots>& agents,
                       const std::vector<std::pair<size_t, int>>& slots,
                       std::vector<std::vector<int>>& free) {
  std::map<size_t, int> per_agent;
  for (const auto& [a, slot] : slots) ++per_agent[a];
  JobPlacement placement;
  placement.job_id = job_id;
  std::map<size_t, int> next_local;
  for (const auto& [a, slot] : slots) {
    RankSlot& rank = placement.ranks.emplace_back();
    rank.agent_id = agents[a].agent_id;
    rank.slot = slot;
    rank.local_rank = next_local[a]++;
    rank.local_world_size = per_agent[a];
  }
  for (const auto& [a, slot] : slots) {
    free[a].erase(std::find(free[a].begin(), free[a].end(), slot));
  }
  return placement;
}

std::vector<JobPlacement> PlaceJobs(const std::vector<QueuedJob>& queued,
                                    const std::vector<AgentSlots>& agents) {
  // (agent index, slot) still free, in rank order.
  std::vector<std::vector<int>> free;
  for (const AgentSlots& agent : agents) free.push_back(agent.free_slots);
  std::vector<JobPlacement> placed;
  for (const QueuedJob& job : queued) {
    const v1::ResourceSpec& r = job.resources;
    std::vector<std::pair<size_t, int>> candidates = SlotsFor(job, agents, free);
    if (static_cast<int>(candidates.size()) < r.min_ranks()) {
      if (!FitsIdleAgents(job, agents)) continue;  // waits without blocking the queue
      break;                                       // strict FIFO
    }
    candidates.resize(std::min<size_t>(candidates.size(), std::max(0, r.max_ranks())));
    placed.push_back(TakeSlots(job.job_id, agents, candidates, free));
  }
  return placed;
}

QueuedJob ToQueuedJob(const std::string& job_id, const v1::JobSpec& spec) {
  QueuedJob job;
  job.job_id = job_id;
  job.resources = spec.resources();
  job.rank_bytes = EstimateRankMemory(spec).total_bytes();
  job.survivors_first = MayHaveHotSpares(spec);
  return job;
}

namespace {

int AllSlots(const AgentSlots& agent) {
  return std::max(agent.total_slots, static_cast<int>(agent.free_slots.size()));
}

}  // namespace

bool FitsIdleAgents(const QueuedJob& job, const std::vector<AgentSlots>& agents) {
  int64_t usable = 0;
  for (const AgentSlots& agent : agents) {
    if (agent.device != job.resources.device()) continue;
    usable += std::min(AllSlots(agent), RanksThatFit(job, agent));
  }
  return usable >= job.resources.min_ranks();
}

int RanksThatFit(const QueuedJob& job, const AgentSlots& agent) {
  if (job.rank_bytes <= 0 || agent.memory_bytes <= 0) return INT_MAX;
  return static_cast<int>(std::min<int64_t>(INT_MAX, agent.memory_bytes / job.rank_bytes));
}

std::string PendingReason(const QueuedJob& job, const std::vector<AgentSlots>& agents) {
  const v1::ResourceSpec& r = job.resources;
  const std::string device = v1::ResourceSpec::Device_Name(r.device());
  int agents_of_device = 0, free = 0, usable = 0, too_small = 0;
  int64_t largest = 0;
  for (const AgentSlots& agent : agents) {
    if (agent.device != r.device()) continue;
    ++agents_of_device;
    const int n = static_cast<int>(agent.free_slots.size());
    const int fit = RanksThatFit(job, agent);
    free += n;
    usable += std::min(n, fit);
    if (fit == 0) ++too_small;
    largest = std::max(largest, agent.memory_bytes);
  }
  if (agents_of_device == 0) {
    return absl::StrCat("waiting for a node agent with ", device,
                        " slots (none is connected); later jobs start meanwhile");
  }
  if (!FitsIdleAgents(job, agents)) {
    int64_t all = 0;
    for (const AgentSlots& agent : agents) {
      if (agent.device == r.device()) all += std::min(AllSlots(agent), RanksThatFit(job, agent));
    }
    return absl::StrCat(
        "waiting for agents that can hold ", r.min_ranks(), " ", device, " rank",
        r.min_ranks() == 1 ? "" : "s", ": the ", agents_of_device, " connected could hold ", all,
        " even when idle",
        job.rank_bytes > 0
            ? absl::StrCat(" (about ", FormatBytes(static_cast<double>(job.rank_bytes)), " a rank)")
            : "",
        "; later jobs start meanwhile");
  }
  if (usable >= r.min_ranks()) {
    return "waiting for older queued jobs to start first (placement is first in, first out)";
  }
  std::string reason = absl::StrCat("waiting for ", r.min_ranks(), " free ", device, " slot",
                                    r.min_ranks() == 1 ? "" : "s", "; ", agents_of_device, " agent",
                                    agents_of_device == 1 ? " has " : "s have ", free, " free");
  if (job.rank_bytes > 0 && usable < free) {
    absl::StrAppend(&reason, ", of which ", usable, " can hold a rank of about ",
                    FormatBytes(static_cast<double>(job.rank_bytes)));
    if (too_small == agents_of_device) {
      absl::StrAppend(&reason, " (the largest agent has ",
                      FormatBytes(static_cast<double>(largest)), ")");
    }
  }
  return reason;
}

}  // namespace chorus
