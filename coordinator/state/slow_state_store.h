// SlowStateStore: a StateStore for tests whose writes of chosen jobs are
// slow (Note [Durable writes outside the lock] in job_manager.h).
//
// Example:
//   SlowStateStore state(*StateStore::Open(dir), absl::Seconds(2));
//   state.SlowDown("job-000001");
//   std::thread t([&] { jobs->Cancel("job-000001", ""); });
//   state.slow_write_began().WaitForNotification();
#ifndef CHORUS_COORDINATOR_STATE_SLOW_STATE_STORE_H_
#define CHORUS_COORDINATOR_STATE_SLOW_STATE_STORE_H_

#include <atomic>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/state/state_store.h"

namespace chorus {

// A state store whose writes of the chosen jobs take `delay`, as on a slow
// disk or a slow etcd; everything else goes straight to the inner store.
class SlowStateStore : public StateStore {
 public:
  SlowStateStore(std::unique_ptr<StateStore> inner, absl::Duration delay)
      : inner_(std::move(inner)), delay_(delay) {}

  // The next `writes` writes of `job_id` are slow (every one by default).
  void SlowDown(const std::string& job_id, int writes = std::numeric_limits<int>::max()) {
    absl::MutexLock lock(&mu_);
    slow_[job_id] = writes;
  }
  // Notified when a slow write has begun (and is sleeping).
  absl::Notification& slow_write_began() { return began_; }
  // How many slow writes have ended their delay.
  int slow_writes_done() const { return done_.load(); }

  absl::Status SaveJob(const v1::Job& job) override {
    Delay(job.job_id());
    return inner_->SaveJob(job);
  }
  absl::Status AppendEvent(const v1::JobEvent& event) override {
    Delay(event.job_id());
    return inner_->AppendEvent(event);
  }
  absl::Status SaveJobAndEvent(const v1::Job& job, const v1::JobEvent& event) override {
    Delay(job.job_id());
    return inner_->SaveJobAndEvent(job, event);
  }
  absl::Status ForEachJob(const std::function<void(v1::Job)>& visit) override {
    return inner_->ForEachJob(visit);
  }
  absl::StatusOr<v1::Job> LoadJob(const std::string& job_id) override {
    return inner_->LoadJob(job_id);
  }
  absl::StatusOr<std::vector<v1::Job>> LoadJobsBefore(const std::string& before_id,
                                                      int limit) override {
    return inner_->LoadJobsBefore(before_id, limit);
  }
  absl::StatusOr<int64_t> LastEventSeq(const std::string& job_id) override {
    return inner_->LastEventSeq(job_id);
  }
  absl::StatusOr<std::vector<v1::JobEvent>> LoadEvents(const std::string& job_id,
                                                       int64_t after_seq) override {
    return inner_->LoadEvents(job_id, after_seq);
  }
  absl::Status SaveManifest(const v1::CheckpointManifest& manifest) override {
    return inner_->SaveManifest(manifest);
  }
  absl::Status DeleteManifest(const std::string& job_id, int64_t step) override {
    return inner_->DeleteManifest(job_id, step);
  }
  absl::StatusOr<std::vector<v1::CheckpointManifest>> LoadManifests(
      const std::string& job_id) override {
    return inner_->LoadManifests(job_id);
  }
  absl::Status SaveElasticRecord(const std::string& job_id,
                                 const coordinator::ElasticRecord& record) override {
    return inner_->SaveElasticRecord(job_id, record);
  }
  absl::StatusOr<coordinator::ElasticRecord> LoadElasticRecord(const std::string& job_id) override {
    return inner_->LoadElasticRecord(job_id);
  }
  const std::string& path() const override { return inner_->path(); }
  const std::string& cluster_id() const override { return inner_->cluster_id(); }

 private:
  void Delay(const std::string& job_id) {
    {
      absl::MutexLock lock(&mu_);
      auto it = slow_.find(job_id);
      if (it == slow_.end() || it->second == 0) return;
      --it->second;
    }
    if (!began_.HasBeenNotified()) began_.Notify();
    absl::SleepFor(delay_);
    ++done_;
  }

  std::unique_ptr<StateStore> inner_;
  const absl::Duration delay_;
  absl::Mutex mu_;
  std::map<std::string, int> slow_ ABSL_GUARDED_BY(mu_);  // writes left to slow
  absl::Notification began_;
  std::atomic<int> done_{0};
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_STATE_SLOW_STATE_STORE_H_
