#include "coordinator/state/job_manager.h"

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
    live_.reset();
  } else {
    live_ = std::make_unique<v1::Job>(std::move(job));
    packed_.clear();
    packed_.shrink_to_fit();
  }
}

v1::Job JobManager::StoredJob::Get() const {
  if (live_ != nullptr) return *live_;
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
                                                               int max_pending_jobs,
                                                               int ended_jobs_in_memory) {
  if (max_pending_jobs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_pending_jobs must be at least 1, got ", max_pending_jobs));
  }
  if (ended_jobs_in_memory < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the number of ended jobs kept in memory must be at least 0, got ", ended_jobs_in_memory));
  }
  std::unique_ptr<JobManager> manager(
      new JobManager(state, clock, max_pending_jobs, ended_jobs_in_memory));
  absl::MutexLock lock(&manager->mu_);
  // One job at a time, so that a long history is never all in memory; its
  // last event's seq is read when it is next needed.
  RETURN_IF_ERROR(state.ForEachJob([&](v1::Job job) {
    manager->mu_.AssertHeld();
    int64_t number = 0;
    if (absl::SimpleAtoi(absl::StripPrefix(job.job_id(), "job-"), &number)) {
      manager->next_number_ = std::max(manager->next_number_, number + 1);
    }
    manager->KeepLocked(std::move(job), kUnknownSeq);
  }));
  return manager;
}

absl::Status JobManager::NotFound(const std::string& job_id) const {
  return absl::NotFoundError(
      absl::StrCat("no job \"", job_id, "\"; `chorus jobs` lists the jobs this coordinator knows"));
}

// One job's writer lock (Note [Durable writes outside the lock]), taken
// without mu_ held.
class JobManager::WriterLock {
 public:
  WriterLock(JobManager& manager, const std::string& job_id) : manager_(manager), job_id_(job_id) {
    {
      absl::MutexLock lock(&manager_.mu_);
      writer_ = &manager_.writers_[job_id_];
      ++writer_->users;
    }
    writer_->mu.Lock();
  }
  ~WriterLock() {
    writer_->mu.Unlock();
    absl::MutexLock lock(&manager_.mu_);
    if (--writer_->users == 0) manager_.writers_.erase(job_id_);
  }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  JobManager& manager_;
  const std::string job_id_;
  Writer* writer_ = nullptr;
};

void JobManager::KeepWrittenLocked(v1::Job& job, int64_t last_event_seq) {
  if (auto it = jobs_.find(job.job_id()); it != jobs_.end() && it->second.live_metrics()) {
    *job.mutable_latest_metrics() = *it->second.live_metrics();
  }
  KeepLocked(job, last_event_seq);
}

void JobManager::KeepLocked(v1::Job job, int64_t last_event_seq) {
  const std::string id = job.job_id();
  const v1::Job::State state = job.state();
  const bool ended = IsTerminal(state);
  if (ended && ended_in_memory_.size() >= static_cast<size_t>(ended_jobs_in_memory_) &&
      !jobs_.count(id) && (ended_in_memory_.empty() || id < *ended_in_memory_.begin())) {
    // Older than every ended job kept: it goes straight to the database's keeping.
    evicted_max_ = std::max(evicted_max_, id);
    ++evicted_by_state_[state];
    return;
  }
  StoredJob& stored = jobs_[id];
  stored.Set(std::move(job));
  stored.last_event_seq = last_event_seq;
  if (!ended) return;
  ended_in_memory_.insert(id);
  while (ended_in_memory_.size() > static_cast<size_t>(ended_jobs_in_memory_)) {
    auto oldest = jobs_.find(*ended_in_memory_.begin());
    evicted_max_ = std::max(evicted_max_, oldest->first);
    ++evicted_by_state_[oldest->second.state()];
    jobs_.erase(oldest);
    ended_in_memory_.erase(ended_in_memory_.begin());
  }
}

absl::StatusOr<v1::Job> JobManager::LoadLocked(const std::string& job_id) const {
  if (auto it = jobs_.find(job_id); it != jobs_.end()) return it->second.Get();
  // Only ended jobs that left memory are read back (Note [Only the newest
  // ended jobs in memory]); a job above evicted_max_ is in memory or nowhere.
  if (evicted_max_.empty() || job_id > evicted_max_) return NotFound(job_id);
  absl::StatusOr<v1::Job> job = state_.LoadJob(job_id);
  if (absl::IsNotFound(job.status())) return NotFound(job_id);
  return job;
}

absl::Status JobManager::CheckExistsLocked(const std::string& job_id) const {
  return LoadLocked(job_id).status();
}

absl::StatusOr<int64_t> JobManager::LastEventSeqLocked(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return state_.LastEventSeq(job_id);
  if (it->second.last_event_seq == kUnknownSeq) {
    ASSIGN_OR_RETURN(it->second.last_event_seq, state_.LastEventSeq(job_id));
  }
  return it->second.last_event_seq;
}

absl::StatusOr<int64_t> JobManager::Record(const v1::Job& job, int64_t last_event_seq,
                                           const std::string& reason) {
  v1::JobEvent event;
  event.set_job_id(job.job_id());
  event.set_seq(last_event_seq + 1);
  event.set_time_us(absl::ToUnixMicros(clock_->Now()));
  event.set_state(job.state());
  event.set_reason(reason);
  RETURN_IF_ERROR(state_.SaveJobAndEvent(job, event));
  return event.seq();
}

absl::Status JobManager::AddEvent(const std::string& job_id, v1::JobEvent event) {
  {
    WriterLock writer(*this, job_id);
    {
      absl::MutexLock lock(&mu_);
      RETURN_IF_ERROR(CheckExistsLocked(job_id));
      ASSIGN_OR_RETURN(const int64_t last_seq, LastEventSeqLocked(job_id));
      event.set_job_id(job_id);
      event.set_seq(last_seq + 1);
      event.set_time_us(absl::ToUnixMicros(clock_->Now()));
    }
    RETURN_IF_ERROR(state_.AppendEvent(event));
    absl::MutexLock lock(&mu_);
    if (auto it = jobs_.find(job_id); it != jobs_.end()) it->second.last_event_seq = event.seq();
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

// Note [Shared directories per cluster]
// Job ids are unique only within one coordinator's state (each counts from
// job-000001, as every Slurm allocation's does), so two clusters sharing
// checkpoint.shared_dir would write job-000001's checkpoints into one
// directory, and each one's restart sweep would delete the other's step
// directories as uncommitted. A job's checkpoints are therefore namespaced at
// submission by the cluster id (StateStore::cluster_id) in
// checkpoint.shared_dir_namespace: they go to SHARED_DIR/CLUSTER/JOB/STEP
// (SharedCheckpointRoot), and since the job's spec holds it, ranks, grants and
// recovery all agree on it, across restarts.
absl::StatusOr<v1::Job> JobManager::Submit(v1::JobSpec spec, const std::string& resume_from,
                                           const std::string& owner) {
  NormalizeJobSpec(spec);
  RETURN_IF_ERROR(CheckJobSpec(spec, "submitted"));
  if (spec.checkpoint().storage() == v1::CheckpointSpec::SHARED_DIR) {
    spec.mutable_checkpoint()->set_shared_dir_namespace(state_.cluster_id());
  } else {
    spec.mutable_checkpoint()->clear_shared_dir_namespace();
  }
  // Jobs are numbered in the order their submissions are written.
  absl::MutexLock submitting(&submit_mu_);
  v1::Job job;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(NewJobLocked(std::move(spec), resume_from, owner, job));
  }
  // Nothing is acknowledged before it is on disk.
  ASSIGN_OR_RETURN(const int64_t seq, Record(job, 0, "submitted"));
  absl::MutexLock lock(&mu_);
  ++next_number_;
  KeepLocked(job, seq);
  return job;
}

absl::Status JobManager::NewJobLocked(v1::JobSpec spec, const std::string& resume_from,
                                      const std::string& owner, v1::Job& job) {
  if (!resume_from.empty()) {
    std::vector<std::string> parts = absl::StrSplit(resume_from, absl::MaxSplits(':', 1));
    int64_t step = 0;
    if (parts[0].empty() ||
        (parts.size() == 2 && (!absl::SimpleAtoi(parts[1], &step) || step < 0))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resume_from must be JOB or JOB:STEP (e.g. job-000003:500), got \"", resume_from, "\""));
    }
    RETURN_IF_ERROR(CheckExistsLocked(parts[0]));
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
  job.set_job_id(absl::StrFormat("job-%06d", next_number_));
  *job.mutable_spec() = std::move(spec);
  job.set_state(v1::Job::PENDING);
  job.set_submit_time_us(absl::ToUnixMicros(clock_->Now()));
  job.set_resume_from(resume_from);
  job.set_owner(owner);
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  return LoadLocked(job_id);
}

std::vector<std::string> JobManager::PendingJobIds() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> ids;
  for (const auto& [id, job] : jobs_) {
    if (job.state() == v1::Job::PENDING) ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::vector<v1::Job>> JobManager::List(const std::vector<v1::Job::State>& states,
                                                      int limit,
                                                      const std::string& older_than) const {
  const auto wanted = [&](v1::Job::State state) {
    return states.empty() || std::find(states.begin(), states.end(), state) != states.end();
  };
  const auto full = [&](const std::vector<v1::Job>& out) {
    return limit > 0 && static_cast<int>(out.size()) >= limit;
  };
  // Only ended jobs leave memory, so memory alone answers for states that
  // have not ended.
  const bool any_ended = states.empty() || std::any_of(states.begin(), states.end(), IsTerminal);
  absl::MutexLock lock(&mu_);
  const bool memory_has_all = evicted_max_.empty() || !any_ended;
  std::vector<v1::Job> out;
  std::string next = older_than;  // the database is read below this id ("" = all)
  for (auto it = older_than.empty() ? jobs_.end() : jobs_.lower_bound(older_than);
       it != jobs_.begin();) {
    --it;
    // Above evicted_max_, memory holds every job (Note [Only the newest
    // ended jobs in memory]); below it the database is the index.
    if (!memory_has_all && it->first <= evicted_max_) break;
    next = it->first;
    if (!wanted(it->second.state())) continue;
    out.push_back(it->second.Get());
    if (full(out)) return out;
  }
  if (memory_has_all) return out;
  constexpr int kPage = 256;
  for (;;) {
    ASSIGN_OR_RETURN(std::vector<v1::Job> page, state_.LoadJobsBefore(next, kPage));
    for (v1::Job& stored : page) {
      next = stored.job_id();
      auto in_memory = jobs_.find(next);
      v1::Job job = in_memory == jobs_.end() ? std::move(stored) : in_memory->second.Get();
      if (!wanted(job.state())) continue;
      out.push_back(std::move(job));
      if (full(out)) return out;
    }
    if (static_cast<int>(page.size()) < kPage) return out;
  }
}

std::map<v1::Job::State, int64_t> JobManager::CountByState() const {
  std::map<v1::Job::State, int64_t> out;
  for (int state = v1::Job::PENDING; state <= v1::Job::CANCELLED; ++state) {
    out[static_cast<v1::Job::State>(state)] = 0;
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [id, job] : jobs_) ++out[job.state()];
  for (const auto& [state, count] : evicted_by_state_) out[state] += count;
  return out;
}

std::vector<v1::Job> JobManager::NewestFailed(int limit) const {
  std::vector<v1::Job> failed;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : ended_in_memory_) {
      auto it = jobs_.find(id);
      if (it != jobs_.end() && it->second.state() == v1::Job::FAILED) {
        failed.push_back(it->second.Get());
      }
    }
  }
  const size_t keep = std::min(failed.size(), static_cast<size_t>(std::max(0, limit)));
  std::partial_sort(failed.begin(), failed.begin() + keep, failed.end(),
                    [](const v1::Job& a, const v1::Job& b) {
                      if (a.end_time_us() != b.end_time_us()) {
                        return a.end_time_us() > b.end_time_us();
                      }
                      return a.job_id() > b.job_id();
                    });
  failed.resize(keep);
  return failed;
}

size_t JobManager::JobsInMemory() const {
  absl::MutexLock lock(&mu_);
  return jobs_.size();
}

absl::StatusOr<v1::Job> JobManager::Transition(const std::string& job_id,
                                               const std::function<std::string(v1::Job&)>& change) {
  v1::Job job;
  {
    WriterLock writer(*this, job_id);
    std::string reason;
    int64_t last_seq = 0;
    {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(job_id);
      if (it == jobs_.end() || IsTerminal(it->second.state())) {
        ASSIGN_OR_RETURN(const v1::Job ended, LoadLocked(job_id));
        return absl::FailedPreconditionError(
            absl::StrCat("job ", job_id, " already ended: ", v1::Job::State_Name(ended.state()),
                         ended.reason().empty() ? "" : absl::StrCat(" (", ended.reason(), ")")));
      }
      job = it->second.Get();
      // Reasons may quote a user's job (Note [Bounded job output]).
      reason = BoundReason(change(job));
      job.set_reason(BoundReason(job.reason()));
      ASSIGN_OR_RETURN(last_seq, LastEventSeqLocked(job_id));
    }
    ASSIGN_OR_RETURN(const int64_t seq, Record(job, last_seq, reason));
    absl::MutexLock lock(&mu_);
    KeepWrittenLocked(job, seq);
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
    job.clear_reason();  // why it waited after a preemption
    job.set_generation(generation);
    job.set_world_size(world_size);
    if (job.start_time_us() == 0) job.set_start_time_us(absl::ToUnixMicros(clock_->Now()));
    return absl::StrCat("generation ", generation, " placed with ", world_size, " ranks");
  });
}

absl::StatusOr<v1::Job> JobManager::Requeue(const std::string& job_id,
                                            const std::string& resume_from,
                                            const std::string& reason) {
  // Only the scheduler moves a job out of RUNNING, under its own lock: the
  // state read here still holds when Transition runs.
  ASSIGN_OR_RETURN(const v1::Job current, Get(job_id));
  if (current.state() != v1::Job::RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", v1::Job::State_Name(current.state()),
                     "; only a running job can be sent back to the queue"));
  }
  return Transition(job_id, [&](v1::Job& job) {
    job.set_state(v1::Job::PENDING);
    job.set_generation(0);
    job.set_world_size(0);
    job.clear_placements();
    job.set_preemptions(job.preemptions() + 1);
    if (!resume_from.empty()) job.set_resume_from(resume_from);
    job.set_reason(reason);
    return reason;
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
  WriterLock writer(*this, job_id);
  v1::Job job;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(job, LoadLocked(job_id));
  }
  job.clear_placements();
  for (const v1::RankPlacement& p : placements) *job.add_placements() = p;
  RETURN_IF_ERROR(state_.SaveJob(job));
  absl::MutexLock lock(&mu_);
  if (auto it = jobs_.find(job_id); it != jobs_.end()) {
    int64_t seq = it->second.last_event_seq;
    KeepWrittenLocked(job, seq);
  }
  return absl::OkStatus();
}

absl::Status JobManager::SaveElasticRecord(const std::string& job_id,
                                           const coordinator::ElasticRecord& record) {
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckExistsLocked(job_id));
  }
  return state_.SaveElasticRecord(job_id, record);
}

absl::StatusOr<coordinator::ElasticRecord> JobManager::LoadElasticRecord(
    const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckExistsLocked(job_id));
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
  if (!persist) {
    // In memory only: no writer lock (Note [Durable writes outside the lock]).
    absl::MutexLock lock(&mu_);
    if (auto it = jobs_.find(job_id); it != jobs_.end()) {
      v1::Job job = it->second.Get();
      *job.mutable_latest_metrics() = metrics;
      it->second.Set(std::move(job));
      return absl::OkStatus();
    }
  }
  // Persisted, or of a job only the database holds, which keeps its metrics there.
  WriterLock writer(*this, job_id);
  v1::Job job;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(job, LoadLocked(job_id));
  }
  *job.mutable_latest_metrics() = metrics;
  RETURN_IF_ERROR(state_.SaveJob(job));
  absl::MutexLock lock(&mu_);
  if (auto it = jobs_.find(job_id); it != jobs_.end()) {
    v1::Job kept = it->second.Get();
    *kept.mutable_latest_metrics() = metrics;
    it->second.Set(std::move(kept));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobStatus> JobManager::Status(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  v1::JobStatus status;
  ASSIGN_OR_RETURN(*status.mutable_job(), LoadLocked(job_id));
  return status;
}

absl::StatusOr<std::vector<v1::JobEvent>> JobManager::Events(const std::string& job_id,
                                                             int64_t after_seq) {
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckExistsLocked(job_id));
  }
  return state_.LoadEvents(job_id, after_seq);
}

}  // namespace chorus
