#include "coordinator/scheduling/cluster_reads.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/memory_estimate.h"
#include "common/status_macros.h"
#include "coordinator/scheduling/placement.h"
#include "coordinator/scheduling/queue_plan.h"
#include "coordinator/scheduling/scheduling_policy.h"

namespace chorus {
namespace {

// Each user's slots, jobs and fair share, and the queue by wait class, from
// the running jobs and the last queue plan (its entries and waiting jobs).
void AddUsers(const QueueUsage& usage, const std::map<std::string, RunningJob>& running,
              const std::map<std::string, QueueEntry>& queued, const QueuePlan& plan,
              ClusterSnapshot& snapshot) {
  for (const auto& [owner, slots] : usage.slots_in_use) {
    for (const auto& [device, count] : slots) snapshot.users[owner].slots_in_use[device] = count;
  }
  for (const auto& [owner, share] : usage.fair_share) {
    snapshot.users[owner].fair_share_slot_seconds = share;
  }
  for (const auto& [job_id, run] : running) ++snapshot.users[run.owner].running_jobs;
  // The jobs the last plan left waiting (the entries also hold those it
  // placed until the next plan).
  for (WaitClass wait : kAllWaitClasses) snapshot.queued_by_wait[WaitClassName(wait)] = 0;
  for (const WaitingJob& w : plan.waiting) {
    ++snapshot.queued_by_wait[WaitClassName(w.wait)];
    if (auto it = queued.find(w.job_id); it != queued.end()) {
      ++snapshot.users[it->second.owner].queued_jobs;
    }
  }
}

}  // namespace

void ClusterReads::FillStatus(const std::string& job_id, v1::JobStatus& status,
                              const StatusRows& rows) const {
  absl::MutexLock lock(&state_.mu);
  auto it = state_.running.find(job_id);
  if (it == state_.running.end()) {
    if (status.job().state() == v1::Job::PENDING) {
      auto waiting = std::find_if(state_.plan.waiting.begin(), state_.plan.waiting.end(),
                                  [&](const WaitingJob& w) { return w.job_id == job_id; });
      // A job submitted since the last plan has no reason there yet.
      const std::string reason =
          waiting != state_.plan.waiting.end()
              ? waiting->reason
              : PendingReason(ToQueuedJob(job_id, status.job().spec()), state_.agents.FreeSlots());
      // A job sent back to the queue (Note [Re-queue]) says by whom first.
      status.set_pending_reason(status.job().reason().empty()
                                    ? reason
                                    : absl::StrCat(status.job().reason(), "; ", reason));
    }
    return;
  }
  const absl::Time now = clock_->Now();
  std::vector<v1::Diagnosis> diagnoses = it->second.Diagnose(state_.agents, now);
  it->second.AnnotateDiagnoses(diagnoses, now);
  StatusRows with_culprits = rows;
  for (const v1::Diagnosis& d : diagnoses) {
    with_culprits.also.insert(with_culprits.also.end(), d.ranks().begin(), d.ranks().end());
  }
  it->second.AddStatusRows(state_.agents, now, status, with_culprits);
  for (v1::Diagnosis& d : diagnoses) *status.add_diagnoses() = std::move(d);
}

void ClusterReads::Snapshot(ClusterSnapshot& snapshot, int max_rank_rows) const {
  absl::MutexLock lock(&state_.mu);
  snapshot.agents = state_.agents.size();
  for (const auto& [device, count] : state_.agents.SlotsByDevice()) {
    snapshot.slots_by_device[device] = {count.free, count.used};
  }
  const absl::Time now = clock_->Now();
  for (const auto& [job_id, run] : state_.running) {
    v1::JobStatus& status = snapshot.running.emplace_back();
    if (absl::StatusOr<v1::Job> job = jobs_.Get(job_id); job.ok()) {
      *status.mutable_job() = *std::move(job);
    }
    status.mutable_job()->set_job_id(job_id);
    StatusRows rows;
    if (static_cast<int>(run.ranks().size()) > max_rank_rows) {
      rows.limit = 0;
      for (const v1::Diagnosis& d : run.diagnoses_now()) {
        rows.also.insert(rows.also.end(), d.ranks().begin(), d.ranks().end());
      }
    }
    run.AddStatusRows(state_.agents, now, status, rows);
    for (const v1::Diagnosis& d : run.diagnoses_now()) *status.add_diagnoses() = d;
  }
  AddUsers(state_.Usage(), state_.running, state_.queue_entries, state_.plan, snapshot);
}

absl::StatusOr<v1::GetLogsResponse> ClusterReads::GetLogs(const v1::GetLogsRequest& request) const {
  ASSIGN_OR_RETURN(v1::Job job, jobs_.Get(request.job_id()));
  v1::GetLogsResponse response = logs_.Get(request);
  absl::MutexLock lock(&state_.mu);
  response.set_complete(JobManager::IsTerminal(job.state()) &&
                        !state_.running.count(request.job_id()));
  return response;
}

v1::GetQueueResponse ClusterReads::Queue() const {
  absl::StatusOr<std::vector<v1::Job>> listed = jobs_.List({v1::Job::PENDING}, 0);
  absl::MutexLock lock(&state_.mu);
  v1::GetQueueResponse queue;
  if (!listed.ok()) return queue;
  std::map<std::string, const v1::Job*> pending;
  for (const v1::Job& job : *listed) pending[job.job_id()] = &job;
  std::map<std::string, const std::string*> reasons;
  for (const WaitingJob& w : state_.plan.waiting) reasons[w.job_id] = &w.reason;
  std::set<std::string> holders;
  for (const auto& [device, holder] : state_.plan.reservation_holders) holders.insert(holder);
  // The plan's order; jobs submitted since it was made go last.
  std::vector<std::string> order = state_.plan.order;
  for (auto it = listed->rbegin(); it != listed->rend(); ++it) {
    if (!reasons.count(it->job_id())) order.push_back(it->job_id());
  }
  for (const std::string& job_id : order) {
    auto job = pending.find(job_id);
    if (job == pending.end()) continue;  // started or ended since
    const v1::Job& j = *job->second;
    v1::QueuedJobInfo& info = *queue.add_jobs();
    info.set_job_id(job_id);
    info.set_name(j.spec().name());
    info.set_owner(j.owner());
    info.set_priority(PriorityOf(j.spec()));
    auto reason = reasons.find(job_id);
    info.set_reason(reason != reasons.end()
                        ? *reason->second
                        : PendingReason(ToQueuedJob(job_id, j.spec()), state_.agents.FreeSlots()));
    info.set_holds_reservation(holders.count(job_id) > 0);
    info.set_min_ranks(j.spec().resources().min_ranks());
    info.set_device(j.spec().resources().device());
    info.set_submit_time_us(j.submit_time_us());
    pending.erase(job);
  }
  return queue;
}

std::vector<v1::AgentInfo> ClusterReads::ListAgents() const {
  absl::MutexLock lock(&state_.mu);
  std::vector<v1::AgentInfo> list;
  for (const std::string& id : state_.agents.Ids()) list.push_back(state_.AgentInfo(id));
  return list;
}

int ClusterReads::free_slots() const {
  absl::MutexLock lock(&state_.mu);
  return state_.agents.free_slots();
}

absl::Status ClusterReads::CheckAgentsCanHold(v1::JobSpec spec) const {
  NormalizeJobSpec(spec);
  if (!ValidateJobSpec(spec).empty()) return absl::OkStatus();
  const RankMemoryEstimate memory = EstimateRankMemory(spec);
  int64_t largest = 0;
  std::string host;
  {
    absl::MutexLock lock(&state_.mu);
    for (const AgentSlots& agent : state_.agents.FreeSlots()) {
      if (agent.device != spec.resources().device()) continue;
      if (agent.memory_bytes <= 0) return absl::OkStatus();  // an agent that does not say
      if (agent.memory_bytes > largest) {
        largest = agent.memory_bytes;
        host = agent.host;
      }
    }
  }
  if (largest == 0 || memory.total() <= static_cast<double>(largest)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "job spec: ", memory.field, ": ",
      RankMemoryMessage(memory, static_cast<double>(largest),
                        absl::StrCat("of memory on the largest connected agent (", host, ")"))));
}

absl::Status ClusterReads::CheckSubmission(const v1::JobSpec& spec,
                                           const std::string& owner) const {
  absl::StatusOr<std::vector<v1::Job>> pending = jobs_.List({v1::Job::PENDING}, 0);
  if (!pending.ok()) return pending.status();
  const int queued = static_cast<int>(std::count_if(
      pending->begin(), pending->end(), [&](const v1::Job& job) { return job.owner() == owner; }));
  absl::MutexLock lock(&state_.mu);
  return chorus::CheckSubmission(state_.policy, owner, spec, queued);
}

absl::StatusOr<UploadGrant> ClusterReads::GrantUpload(const std::string& job_id, int64_t generation,
                                                      int rank) const {
  absl::MutexLock lock(&state_.mu);
  auto it = state_.running.find(job_id);
  if (it == state_.running.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint upload for ", job_id, ", which is not running"));
  }
  return CheckUploader(it->second.upload_grant(), generation, rank);
}

}  // namespace chorus
