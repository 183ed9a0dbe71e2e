#include "coordinator/scheduling/queue_plan.h"

#include <algorithm>
#include <climits>
#include <numeric>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

using Device = v1::ResourceSpec::Device;

// The indices of `queued` in plan order (see the header).
std::vector<size_t> PlanOrder(const std::vector<QueueEntry>& queued, const QueueUsage& usage) {
  std::vector<double> share(queued.size(), 0);
  for (size_t i = 0; i < queued.size(); ++i) {
    auto it = usage.fair_share.find(queued[i].owner);
    if (it != usage.fair_share.end()) share[i] = it->second;
  }
  std::vector<bool> held(queued.size(), false);
  for (size_t i = 0; i < queued.size(); ++i) {
    held[i] = usage.reservations_held.count(queued[i].job.job_id) > 0;
  }
  std::vector<size_t> order(queued.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (queued[a].priority != queued[b].priority) return queued[a].priority > queued[b].priority;
    if (held[a] != held[b]) return static_cast<bool>(held[a]);  // Note [Reservation]
    return share[a] < share[b];
  });
  return order;
}

// Who may take the reservation from a holder of `priority`: only a job of
// higher priority (Note [Reservation]).
std::string WhoMayPass(v1::JobSpec::Priority priority) {
  switch (priority) {
    case v1::JobSpec::HIGH:
      return "no job can come before it";
    case v1::JobSpec::LOW:
      return "only a NORMAL or HIGH job can come before it";
    default:
      return "only a HIGH job can come before it";
  }
}

// The plan being made: what is still free, what each owner holds.
class Planner {
 public:
  Planner(const std::vector<AgentSlots>& agents, const QueueUsage& usage,
          const SchedulingPolicy& policy)
      : agents_(agents), usage_(usage), policy_(policy) {
    for (const AgentSlots& agent : agents) {
      free_.push_back(agent.free_slots);
      free_by_device_[agent.device] += static_cast<int>(agent.free_slots.size());
    }
  }

  // Places `entry`, or adds it to the waiting jobs with its reason.
  void Plan(const QueueEntry& entry, QueuePlan& plan);

 private:
  // How many slots of its device the owner may still take; INT_MAX without
  // a quota. Sets `reason` when fewer than the job's min_ranks.
  int QuotaLeft(const QueueEntry& entry, std::string& reason) const;
  // FitsIdleAgents and PendingReason, computed once per kind of job.
  const std::pair<bool, std::string>& IdleFit(const QueuedJob& job);
  void Reserve(const QueueEntry& entry, const std::vector<std::pair<size_t, int>>& slots,
               QueuePlan& plan);

  const std::vector<AgentSlots>& agents_;
  const QueueUsage& usage_;
  const SchedulingPolicy& policy_;
  std::vector<std::vector<int>> free_;  // per agent, ascending
  std::map<Device, int> free_by_device_;
  std::map<std::string, std::map<Device, int>> placed_;  // by this plan, per owner
  std::map<std::tuple<Device, int, int64_t>, std::pair<bool, std::string>> idle_fit_;
};

int Planner::QuotaLeft(const QueueEntry& entry, std::string& reason) const {
  const Device device = entry.job.resources.device();
  const UserLimits& limits = policy_.For(entry.owner);
  auto quota = limits.max_slots.find(device);
  if (quota == limits.max_slots.end()) return INT_MAX;
  int used = 0;
  if (auto it = usage_.slots_in_use.find(entry.owner); it != usage_.slots_in_use.end()) {
    if (auto d = it->second.find(device); d != it->second.end()) used += d->second;
  }
  if (auto it = placed_.find(entry.owner); it != placed_.end()) {
    if (auto d = it->second.find(device); d != it->second.end()) used += d->second;
  }
  const int left = std::max(0, quota->second - used);
  const int min_ranks = entry.job.resources.min_ranks();
  const std::string name = v1::ResourceSpec::Device_Name(device);
  if (quota->second < min_ranks) {
    reason = absl::StrCat("the job needs ", min_ranks, " ", name, " slots, more than ",
                          OwnerName(entry.owner), "'s quota of ", quota->second,
                          " (scheduling policy); it starts only if the quota is raised");
  } else if (left < min_ranks) {
    reason = absl::StrCat(OwnerName(entry.owner), " uses ", used, " of ", quota->second, " ", name,
                          " slots (quota); the job needs ", min_ranks);
  }
  return left;
}

const std::pair<bool, std::string>& Planner::IdleFit(const QueuedJob& job) {
  const auto key =
      std::make_tuple(job.resources.device(), job.resources.min_ranks(), job.rank_bytes);
  auto it = idle_fit_.find(key);
  if (it == idle_fit_.end()) {
    const bool fits = FitsIdleAgents(job, agents_);
    it =
        idle_fit_.emplace(key, std::make_pair(fits, fits ? "" : PendingReason(job, agents_))).first;
  }
  return it->second;
}

void Planner::Reserve(const QueueEntry& entry, const std::vector<std::pair<size_t, int>>& slots,
                      QueuePlan& plan) {
  const Device device = entry.job.resources.device();
  plan.reservation_holders[device] = entry.job.job_id;
  // Its reason is PendingReason on what is free now, before the slots are held.
  std::vector<AgentSlots> now = agents_;
  for (size_t a = 0; a < now.size(); ++a) now[a].free_slots = free_[a];
  std::string reason = PendingReason(entry.job, now);
  const std::string name = v1::ResourceSpec::Device_Name(device);
  if (slots.empty()) {
    absl::StrAppend(&reason, "; it is first in line for the ", name, " slots that free next");
  } else {
    absl::StrAppend(&reason, "; it is first in line for ", name, " slots and holds the ",
                    slots.size(), " free that it can use");
  }
  absl::StrAppend(&reason, " (reservation): ", WhoMayPass(entry.priority));
  plan.waiting.push_back({entry.job.job_id, std::move(reason), WaitClass::kFreeSlots});
  for (const auto& [a, slot] : slots) {
    plan.reserved[agents_[a].agent_id].push_back(slot);
    free_[a].erase(std::find(free_[a].begin(), free_[a].end(), slot));
  }
  free_by_device_[device] -= static_cast<int>(slots.size());
}

void Planner::Plan(const QueueEntry& entry, QueuePlan& plan) {
  const QueuedJob& job = entry.job;
  const Device device = job.resources.device();
  const int min_ranks = job.resources.min_ranks();
  std::string quota_reason;
  const int quota_left = QuotaLeft(entry, quota_reason);
  if (!quota_reason.empty()) {
    plan.waiting.push_back({job.job_id, std::move(quota_reason), WaitClass::kQuota});
    return;
  }
  std::vector<std::pair<size_t, int>> slots;
  if (free_by_device_[device] >= min_ranks) {
    const int most = std::min(std::max(0, job.resources.max_ranks()), quota_left);
    slots = SlotsFor(job, agents_, free_, static_cast<size_t>(most));
    if (static_cast<int>(slots.size()) >= min_ranks) {
      plan.placed.push_back(TakeSlots(job.job_id, agents_, slots, free_));
      free_by_device_[device] -= static_cast<int>(slots.size());
      placed_[entry.owner][device] += static_cast<int>(slots.size());
      return;
    }
  }
  const std::pair<bool, std::string>& idle = IdleFit(job);
  if (!idle.first) {
    plan.waiting.push_back({job.job_id, idle.second, WaitClass::kNoAgent});
    return;
  }
  auto holder = plan.reservation_holders.find(device);
  if (holder == plan.reservation_holders.end()) {
    if (slots.empty() && free_by_device_[device] > 0) slots = SlotsFor(job, agents_, free_);
    Reserve(entry, slots, plan);
    return;
  }
  plan.waiting.push_back(
      {job.job_id,
       absl::StrCat("waiting for ", min_ranks, " ", v1::ResourceSpec::Device_Name(device), " slot",
                    min_ranks == 1 ? "" : "s", " behind ", holder->second,
                    ", which comes first and holds the reservation of free ",
                    v1::ResourceSpec::Device_Name(device), " slots"),
       WaitClass::kReservation});
}

}  // namespace

const char* WaitClassName(WaitClass wait) {
  switch (wait) {
    case WaitClass::kQuota:
      return "quota";
    case WaitClass::kFreeSlots:
      return "free_slots";
    case WaitClass::kReservation:
      return "reservation";
    case WaitClass::kNoAgent:
      return "no_agent";
  }
  return "free_slots";
}

QueuePlan PlanQueue(const std::vector<QueueEntry>& queued, const std::vector<AgentSlots>& agents,
                    const QueueUsage& usage, const SchedulingPolicy& policy) {
  QueuePlan plan;
  Planner planner(agents, usage, policy);
  for (size_t i : PlanOrder(queued, usage)) {
    plan.order.push_back(queued[i].job.job_id);
    planner.Plan(queued[i], plan);
  }
  for (auto& [agent, slots] : plan.reserved) std::sort(slots.begin(), slots.end());
  // Note [Reservation]: the holders, and earlier ones still waiting behind a
  // holder (of higher priority), keep their claim; the others give it up.
  for (const auto& [device, holder] : plan.reservation_holders) {
    plan.reservations_held.insert(holder);
  }
  for (const WaitingJob& waiting : plan.waiting) {
    if (waiting.wait == WaitClass::kReservation && usage.reservations_held.count(waiting.job_id)) {
      plan.reservations_held.insert(waiting.job_id);
    }
  }
  return plan;
}

}  // namespace chorus
