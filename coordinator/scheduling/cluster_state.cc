#include "coordinator/scheduling/cluster_state.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace chorus {
namespace {

bool OnDevice(const AgentRegistry& agents, const std::string& agent_id,
              v1::ResourceSpec::Device device) {
  const AgentRegistry::Agent* agent = agents.Find(agent_id);
  return agent != nullptr && agent->hello.device() == device;
}

}  // namespace

QueueUsage ClusterState::Usage() const {
  QueueUsage usage;
  for (const auto& [job_id, run] : running) {
    usage.slots_in_use[run.owner][run.device] += static_cast<int>(run.ranks().size());
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

std::vector<QueueEntry> ClusterState::RefreshQueue(const JobManager& jobs) {
  const std::vector<std::string> ids = jobs.PendingJobIds();
  std::vector<QueueEntry> queued;
  queued.reserve(ids.size());
  auto cached = queue_entries.begin();
  std::map<std::string, QueueEntry> kept;
  for (const std::string& id : ids) {
    // Note [The scheduler's writes after its lock]: the store may not show
    // yet that it started or ended.
    if (running.count(id) != 0 || settling.count(id) != 0) continue;
    // Both are sorted by id: walk the cache alongside.
    while (cached != queue_entries.end() && cached->first < id) ++cached;
    if (cached != queue_entries.end() && cached->first == id) {
      queued.push_back(cached->second);
    } else {
      absl::StatusOr<v1::Job> job = jobs.Get(id);
      if (!job.ok()) continue;  // ended since it was listed
      QueueEntry& entry = queued.emplace_back();
      entry.job = ToQueuedJob(id, job->spec());
      entry.owner = job->owner();
      entry.priority = PriorityOf(job->spec());
    }
    kept.emplace_hint(kept.end(), id, queued.back());
  }
  queue_entries = std::move(kept);
  return queued;
}

std::vector<std::string> ClusterState::JobsOn(const std::string& agent_id) const {
  std::vector<std::string> on;
  for (const auto& [job_id, run] : running) {
    if (run.RunsOn(agent_id)) on.push_back(job_id);
  }
  return on;
}

std::vector<std::string> ClusterState::RetryableWaits(absl::Time now) const {
  std::vector<std::string> waiting;
  for (const auto& [job_id, run] : running) {
    const ElasticPhase::Waiting* wait = run.phase().waiting();
    if (wait != nullptr && (!run.AwaitingRanks() || now >= wait->until)) waiting.push_back(job_id);
  }
  return waiting;
}

void ClusterState::AdvanceFairShare(absl::Time now) {
  std::map<std::string, int> held;
  for (const auto& [job_id, run] : running) held[run.owner] += static_cast<int>(run.ranks().size());
  fair_share.Advance(now, held);
}

std::vector<AgentSlots> ClusterState::UnreservedSlots() const {
  std::vector<AgentSlots> free = agents.FreeSlots();
  for (AgentSlots& agent : free) {
    auto reserved = plan.reserved.find(agent.agent_id);
    if (reserved == plan.reserved.end()) continue;
    std::vector<int> left;
    std::set_difference(agent.free_slots.begin(), agent.free_slots.end(), reserved->second.begin(),
                        reserved->second.end(), std::back_inserter(left));
    agent.free_slots = std::move(left);
  }
  return free;
}

QueuedJob ClusterState::QuotaCapped(const std::string& job_id, const v1::JobSpec& spec,
                                    const RunningJob& run) const {
  QueuedJob job = ToQueuedJob(job_id, spec);
  const UserLimits& limits = policy.For(run.owner);
  auto quota = limits.max_slots.find(run.device);
  if (quota == limits.max_slots.end()) return job;
  int others = 0;  // the owner's slots in other jobs
  for (const auto& [id, other] : running) {
    if (id != job_id && other.owner == run.owner && other.device == run.device) {
      others += static_cast<int>(other.ranks().size());
    }
  }
  // Never below what it runs with now (a quota lowered meanwhile does not
  // shrink it), nor below min_ranks.
  const int most = std::max(
      {job.resources.min_ranks(), quota->second - others, static_cast<int>(run.ranks().size())});
  job.resources.set_max_ranks(std::min(job.resources.max_ranks(), most));
  return job;
}

std::vector<ElasticRun> ClusterState::Preemptible() const {
  std::vector<ElasticRun> runs;
  for (const auto& [job_id, run] : running) {
    if (!run.elastic || run.RestartsAll() || !run.Steady() || !run.leaving().empty()) {
      continue;
    }
    ElasticRun& e = runs.emplace_back();
    e.job_id = job_id;
    e.priority = run.priority;
    e.device = run.device;
    e.min_ranks = run.min_ranks;
    e.ranks = run.Slots();
  }
  return runs;
}

std::vector<RequeueRun> ClusterState::Requeueable() const {
  std::vector<RequeueRun> runs;
  for (const auto& [job_id, run] : running) {
    if (run.elastic || run.requeue().active() || !run.Steady()) continue;
    RequeueRun& r = runs.emplace_back();
    r.job_id = job_id;
    r.priority = run.priority;
    r.device = run.device;
    r.checkpointable = !run.program;
    r.preemptible = run.preemptible;
    r.ranks = run.Slots();
  }
  return runs;
}

void ClusterState::Replan(const JobManager& jobs) {
  plan = PlanQueue(RefreshQueue(jobs), agents.FreeSlots(), Usage(), policy);
}

void ClusterState::Settled(const std::string& job_id) {
  auto it = settling.find(job_id);
  if (it != settling.end() && --it->second <= 0) settling.erase(it);
}

void ClusterState::StopForRequeue(const std::string& job_id,
                                  const std::map<std::string, std::vector<int>>& slots) {
  for (const auto& [agent_id, on_agent] : slots) {
    for (int slot : on_agent) {
      agents.SetBusy(agent_id, slot, true);
      stopping[{agent_id, slot}] = job_id;
    }
  }
}

std::vector<std::pair<std::string, RequeueWait::Due>> ClusterState::RequeuesDue(
    absl::Time now, const JobResume& resume) {
  std::vector<std::pair<std::string, RequeueWait::Due>> due;
  for (auto& [job_id, run] : running) {
    if (!run.requeue().active()) continue;
    if (std::optional<RequeueWait::Due> d =
            run.mutable_requeue().OnTick(resume.NewestStep(job_id), now)) {
      due.emplace_back(job_id, *std::move(d));
    }
  }
  return due;
}

bool ClusterState::StoppedRankExited(const std::string& agent_id, int slot,
                                     const std::string& job_id) {
  auto it = stopping.find({agent_id, slot});
  if (it == stopping.end() || it->second != job_id) return false;
  stopping.erase(it);
  agents.SetBusy(agent_id, slot, false);
  return true;
}

void ClusterState::RemoveAgent(const std::string& agent_id) {
  agents.Remove(agent_id);
  for (auto it = stopping.begin(); it != stopping.end();) {
    it = it->first.first == agent_id ? stopping.erase(it) : std::next(it);
  }
}

std::vector<std::pair<std::string, AgentDrain>> ClusterState::Drain(const std::string& agent_id) {
  std::vector<std::pair<std::string, AgentDrain>> drained;
  const AgentRegistry::Agent* agent = agents.Find(agent_id);
  if (agent == nullptr) return drained;
  agents.SetDraining(agent_id);
  const std::string who = absl::StrCat("agent ", agent_id, " (", agent->hello.host(), ")");
  for (const auto& [job_id, run] : running) {
    AgentDrain drain = OnAgentDrained(run, agent_id, who);
    if (drain.kind != AgentDrain::Kind::kNone) drained.emplace_back(job_id, std::move(drain));
  }
  return drained;
}

int ClusterState::SlotsComing(v1::ResourceSpec::Device device) const {
  int coming = 0;
  for (const auto& [agent_id, slots] : plan.reserved) {
    if (OnDevice(agents, agent_id, device)) coming += static_cast<int>(slots.size());
  }
  for (const auto& [job_id, run] : running) {
    if (run.device != device) continue;
    coming += static_cast<int>(run.leaving().size());
    if (run.requeue().active()) coming += static_cast<int>(run.ranks().size());
  }
  for (const auto& [slot, job_id] : stopping) {
    if (OnDevice(agents, slot.first, device)) ++coming;
  }
  return coming;
}

PreemptionOrders ClusterState::Preempt(absl::Time now, const JobResume& resume,
                                       absl::Duration requeue_timeout) {
  PreemptionOrders orders;
  for (const auto& [device, holder_id] : plan.reservation_holders) {
    auto entry = queue_entries.find(holder_id);
    if (entry == queue_entries.end()) continue;
    const QueueEntry& holder = entry->second;
    const int needed = holder.job.resources.min_ranks() - SlotsComing(device);
    const std::string by = absl::StrCat(holder_id, " (", PriorityName(holder.priority), ", ",
                                        OwnerName(holder.owner), ")");
    for (const Preemption& p :
         PlanPreemption(holder, needed, Preemptible(), agents.FreeSlots(), Requeueable())) {
      RunningJob& run = running.at(p.job_id);
      const std::string priority = PriorityName(run.priority);
      if (!p.requeue) {
        for (int rank : p.ranks)
          run.mutable_leaving().Yield(run.ranks()[rank].agent_id, run.ranks()[rank].slot);
        const std::string ranks = absl::StrJoin(p.ranks, ",");
        orders.shrink.emplace_back(
            p.job_id, absl::StrCat(holder_id, " (priority ", PriorityName(holder.priority), ", ",
                                   OwnerName(holder.owner), ") preempted rank(s) ", ranks,
                                   " of this ", priority, " job: they leave, nothing is lost"));
        orders.events.emplace_back(
            holder_id,
            absl::StrCat("preempting rank(s) ", ranks, " of ", p.job_id, " (priority ", priority,
                         ") at its next step boundary to make room for this job"));
        continue;
      }
      orders.events.emplace_back(
          holder_id, absl::StrCat("preempting ", p.job_id, " (priority ", priority,
                                  "): it goes back to the queue to make room for this job"));
      const std::string cause = "preempted by " + by;
      if (run.program) {  // resources.preemptible without checkpoints
        orders.requeue.emplace_back(p.job_id,
                                    cause + "; starts again from scratch (resources.preemptible)");
        continue;
      }
      // Its ranks' heartbeats are answered with CHECKPOINT_AND_HOLD from now on.
      run.mutable_requeue().Begin(cause, run.ReportedStep(), resume.NewestStep(p.job_id), now,
                                  requeue_timeout);
      orders.events.emplace_back(
          p.job_id,
          absl::StrCat(cause, ": checkpointing at the next step boundary (step ",
                       run.requeue().target_step(), " or later), then back to the queue"));
    }
  }
  return orders;
}

}  // namespace chorus
