#include "coordinator/job_manager.h"

#include <algorithm>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "common/output_limits.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace chorus {

void JobManager::StoredJob::Set(v1::Job job) {
  state_ = job.state();
  if (IsTerminal(state_)) {
    packed_ = job.SerializeAsString();
    live_ = v1::Job();  // gives its memory back, unlike Clear()
  } else {
    live_ = std::move(job);
    packed_.clear();
    packed_.shrink_to_fit();
  }
}

v1::Job JobManager::StoredJob::Get() const {
  if (!IsTerminal(state_)) return live_;
  v1::Job job;
  // Packed by Set from a valid message, in this process.
  CHECK(job.ParseFromString(packed_)) << "a packed job record does not parse";
  return job;
}

bool JobManager::IsTerminal(v1::Job::State state) {
  return state == v1::Job::SUCCEEDED || state == v1::Job::FAILED || state == v1::Job::CANCELLED;
}

std::string JobManager::SpecHash(const v1::JobSpec& spec) {
  return Sha256Hex(spec.SerializeAsString());
}

int JobManager::KeepLast(const v1::JobSpec& spec) {
  return spec.checkpoint().has_keep_last() ? spec.checkpoint().keep_last() : kDefaultKeepLast;
}

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(StateStore& state, Clock* clock,
                                                               int max_pending_jobs) {
  if (max_pending_jobs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_pending_jobs must be at least 1, got ", max_pending_jobs));
  }
  std::unique_ptr<JobManager> manager(new JobManager(state, clock, max_pending_jobs));
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, state.LoadJobs());
  absl::MutexLock lock(&manager->mu_);
  for (v1::Job& job : jobs) {
    int64_t number = 0;
    if (absl::SimpleAtoi(absl::StripPrefix(job.job_id(), "job-"), &number)) {
      manager->next_number_ = std::max(manager->next_number_, number + 1);
    }
    ASSIGN_OR_RETURN(std::vector<v1::JobEvent> events, state.LoadEvents(job.job_id(), 0));
    manager->last_event_seq_[job.job_id()] = events.empty() ? 0 : events.back().seq();
    const std::string id = job.job_id();
    manager->jobs_[id].Set(std::move(job));
  }
  return manager;
}

absl::Status JobManager::NotFound(const std::string& job_id) const {
  return absl::NotFoundError(
      absl::StrCat("no job \"", job_id, "\"; `chorus jobs` lists the jobs this coordinator knows"));
}

absl::Status JobManager::Record(v1::Job& job, const std::string& reason) {
  v1::JobEvent event;
  event.set_job_id(job.job_id());
  event.set_seq(last_event_seq_[job.job_id()] + 1);
  event.set_time_us(absl::ToUnixMicros(clock_->Now()));
  event.set_state(job.state());
  event.set_reason(reason);
  RETURN_IF_ERROR(state_.SaveJob(job));
  RETURN_IF_ERROR(state_.AppendEvent(event));
  last_event_seq_[job.job_id()] = event.seq();
  return absl::OkStatus();
}

absl::Status JobManager::AddEvent(const std::string& job_id, v1::JobEvent event) {
  {
    absl::MutexLock lock(&mu_);
    if (!jobs_.count(job_id)) return NotFound(job_id);
    event.set_job_id(job_id);
    event.set_seq(last_event_seq_[job_id] + 1);
    event.set_time_us(absl::ToUnixMicros(clock_->Now()));
    RETURN_IF_ERROR(state_.AppendEvent(event));
    last_event_seq_[job_id] = event.seq();
  }
  Publish(job_id);
  return absl::OkStatus();
}

int64_t JobManager::Subscribe(const std::string& job_id, std::function<void()> wake) {
  absl::MutexLock lock(&subscribers_mu_);
  const int64_t handle = next_subscriber_++;
  subscribers_[handle] = Subscriber{job_id, std::move(wake)};
  return handle;
}

void JobManager::Unsubscribe(int64_t handle) {
  absl::MutexLock lock(&subscribers_mu_);
  subscribers_.erase(handle);
}

void JobManager::Publish(const std::string& job_id) {
  absl::MutexLock lock(&subscribers_mu_);
  for (auto& [handle, subscriber] : subscribers_) {
    if (subscriber.job_id == job_id) subscriber.wake();
  }
}

// Note [Shared directories per cluster]: job ids are unique only within one
// coordinator's state (each counts from job-000001, as every Slurm
// allocation's does), so two clusters sharing checkpoint.shared_dir would
// write job-000001's checkpoints into one directory, and each one's restart
// sweep would delete the other's step directories as uncommitted. A job's
// checkpoints are therefore namespaced at submission by the cluster id
// (StateStore::cluster_id) in checkpoint.shared_dir_namespace: they go to
// SHARED_DIR/CLUSTER/JOB/STEP (SharedCheckpointRoot), and since the job's
// spec holds it, ranks, grants and recovery all agree on it, across restarts.
absl::StatusOr<v1::Job> JobManager::Submit(v1::JobSpec spec, const std::string& resume_from) {
  NormalizeJobSpec(spec);
  RETURN_IF_ERROR(CheckJobSpec(spec, "submitted"));
  if (spec.checkpoint().storage() == v1::CheckpointSpec::SHARED_DIR) {
    spec.mutable_checkpoint()->set_shared_dir_namespace(state_.cluster_id());
  } else {
    spec.mutable_checkpoint()->clear_shared_dir_namespace();
  }
  absl::MutexLock lock(&mu_);
  if (!resume_from.empty()) {
    std::vector<std::string> parts = absl::StrSplit(resume_from, absl::MaxSplits(':', 1));
    int64_t step = 0;
    if (parts[0].empty() ||
        (parts.size() == 2 && (!absl::SimpleAtoi(parts[1], &step) || step < 0))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resume_from must be JOB or JOB:STEP (e.g. job-000003:500), got \"", resume_from, "\""));
    }
    if (!jobs_.count(parts[0])) return NotFound(parts[0]);
  }
  // The queue limit: every pending job costs the scheduler a look on each
  // placement round and a row in `chorus jobs`.
  const auto pending = std::count_if(jobs_.begin(), jobs_.end(), [](const auto& entry) {
    return entry.second.state() == v1::Job::PENDING;
  });
  if (pending >= max_pending_jobs_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator's queue is full: ", pending, " jobs are pending, the limit is ",
        max_pending_jobs_,
        " (coordinator flag --max_pending_jobs). Submit again once some have started or "
        "ended, or cancel the ones you no longer need (`chorus jobs`, `chorus cancel JOB`)"));
  }
  v1::Job job;
  job.set_job_id(absl::StrFormat("job-%06d", next_number_));
  *job.mutable_spec() = std::move(spec);
  job.set_state(v1::Job::PENDING);
  job.set_submit_time_us(absl::ToUnixMicros(clock_->Now()));
  job.set_resume_from(resume_from);
  // Nothing is acknowledged before it is on disk.
  RETURN_IF_ERROR(Record(job, "submitted"));
  ++next_number_;
  jobs_[job.job_id()].Set(job);
  return job;
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NotFound(job_id);
  return it->second.Get();
}

std::vector<v1::Job> JobManager::List(const std::vector<v1::Job::State>& states, int limit,
                                      const std::string& older_than) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> out;
  auto from = older_than.empty() ? jobs_.rbegin() : std::make_reverse_iterator(jobs_.lower_bound(older_than));
  for (auto it = from; it != jobs_.rend(); ++it) {
    if (!states.empty() &&
        std::find(states.begin(), states.end(), it->second.state()) == states.end()) {
      continue;
    }
    out.push_back(it->second.Get());
    if (limit > 0 && static_cast<int>(out.size()) >= limit) break;
  }
  return out;
}

std::map<v1::Job::State, int64_t> JobManager::CountByState() const {
  std::map<v1::Job::State, int64_t> out;
  for (int state = v1::Job::PENDING; state <= v1::Job::CANCELLED; ++state) {
    out[static_cast<v1::Job::State>(state)] = 0;
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [id, job] : jobs_) ++out[job.state()];
  return out;
}

absl::StatusOr<v1::Job> JobManager::Transition(const std::string& job_id,
                                               const std::function<std::string(v1::Job&)>& change) {
  v1::Job job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return NotFound(job_id);
    if (IsTerminal(it->second.state())) {
      const v1::Job ended = it->second.Get();
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " already ended: ", v1::Job::State_Name(ended.state()),
          ended.reason().empty() ? "" : absl::StrCat(" (", ended.reason(), ")")));
    }
    job = it->second.Get();
    // Reasons may quote a user's job (Note [Bounded job output]).
    const std::string reason = BoundReason(change(job));
    job.set_reason(BoundReason(job.reason()));
    RETURN_IF_ERROR(Record(job, reason));
    it->second.Set(job);
  }
  Publish(job_id);
  return job;
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& job_id, const std::string& reason) {
  return Transition(job_id, [&](v1::Job& job) {
    job.set_state(v1::Job::CANCELLED);
    job.set_reason(reason.empty() ? "cancelled by the user" : reason);
    job.set_end_time_us(absl::ToUnixMicros(clock_->Now()));
    return job.reason();
  });
}

absl::StatusOr<v1::Job> JobManager::MarkRunning(const std::string& job_id, int64_t generation,
                                                int world_size) {
  return Transition(job_id, [&](v1::Job& job) {
    job.set_state(v1::Job::RUNNING);
    job.set_generation(generation);
    job.set_world_size(world_size);
    if (job.start_time_us() == 0) job.set_start_time_us(absl::ToUnixMicros(clock_->Now()));
    return absl::StrCat("generation ", generation, " placed with ", world_size, " ranks");
  });
}

absl::StatusOr<v1::Job> JobManager::MarkReformed(const std::string& job_id, int64_t generation,
                                                 int world_size, int restarts,
                                                 const std::string& reason) {
  return Transition(job_id, [&](v1::Job& job) {
    job.set_generation(generation);
    job.set_world_size(world_size);
    job.set_restarts(restarts);
    return reason;
  });
}

absl::Status JobManager::SavePlacements(const std::string& job_id,
                                        const std::vector<v1::RankPlacement>& placements) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NotFound(job_id);
  v1::Job job = it->second.Get();
  job.clear_placements();
  for (const v1::RankPlacement& p : placements) *job.add_placements() = p;
  RETURN_IF_ERROR(state_.SaveJob(job));
  it->second.Set(std::move(job));
  return absl::OkStatus();
}

absl::Status JobManager::SaveElasticRecord(const std::string& job_id,
                                           const coordinator::ElasticRecord& record) {
  {
    absl::MutexLock lock(&mu_);
    if (!jobs_.count(job_id)) return NotFound(job_id);
  }
  return state_.SaveElasticRecord(job_id, record);
}

absl::StatusOr<coordinator::ElasticRecord> JobManager::LoadElasticRecord(
    const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    if (!jobs_.count(job_id)) return NotFound(job_id);
  }
  return state_.LoadElasticRecord(job_id);
}

absl::StatusOr<v1::Job> JobManager::Finish(const std::string& job_id, v1::Job::State state,
                                           const std::string& reason) {
  return Transition(job_id, [&](v1::Job& job) {
    job.set_state(state);
    job.set_reason(reason);
    job.set_end_time_us(absl::ToUnixMicros(clock_->Now()));
    return reason;
  });
}

int JobManager::FailRunning(const std::string& reason) {
  std::vector<std::string> running;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) {
      if (job.state() == v1::Job::RUNNING) running.push_back(id);
    }
  }
  int failed = 0;
  for (const std::string& id : running) failed += Finish(id, v1::Job::FAILED, reason).ok();
  return failed;
}

absl::Status JobManager::UpdateMetrics(const std::string& job_id, const v1::Metrics& metrics,
                                       bool persist) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NotFound(job_id);
  v1::Job job = it->second.Get();
  *job.mutable_latest_metrics() = metrics;
  if (persist) RETURN_IF_ERROR(state_.SaveJob(job));
  it->second.Set(std::move(job));
  return absl::OkStatus();
}

absl::StatusOr<v1::JobStatus> JobManager::Status(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NotFound(job_id);
  v1::JobStatus status;
  *status.mutable_job() = it->second.Get();
  return status;
}

absl::StatusOr<std::vector<v1::JobEvent>> JobManager::Events(const std::string& job_id,
                                                             int64_t after_seq) {
  {
    absl::MutexLock lock(&mu_);
    if (!jobs_.count(job_id)) return NotFound(job_id);
  }
  return state_.LoadEvents(job_id, after_seq);
}

}  // namespace chorus
