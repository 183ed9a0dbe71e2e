// StateStore: the coordinator's durable state, one SQLite database in
// --state_dir (chorus.db). Jobs and their events are written here before the
// RPC that changed them answers, so a coordinator killed with SIGKILL and
// restarted on the same directory knows every acknowledged job.
//
// Thread-safety: all methods are serialized internally.
//
// Example:
//   ASSIGN_OR_RETURN(auto store, StateStore::Open("/var/lib/chorus"));
//   RETURN_IF_ERROR(store->SaveJob(job));
//   ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store->LoadJobs());
#ifndef CHORUS_COORDINATOR_STATE_STORE_H_
#define CHORUS_COORDINATOR_STATE_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/elastic_record.pb.h"

struct sqlite3;
struct sqlite3_stmt;

namespace chorus {

class StateStore {
 public:
  // Opens (creating if needed) `dir`/chorus.db. FAILED_PRECONDITION naming
  // the file if it cannot be opened or is not a Chorus database.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& dir);
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;
  ~StateStore();

  // Inserts or replaces the job (by job_id), durably.
  absl::Status SaveJob(const v1::Job& job);
  // Appends an event (its job_id and seq set), durably.
  absl::Status AppendEvent(const v1::JobEvent& event);
  // Both in one commit: either both are stored or neither (Note [One commit
  // per change] in state_store.cc).
  absl::Status SaveJobAndEvent(const v1::Job& job, const v1::JobEvent& event);
  // Every job, oldest first.
  absl::StatusOr<std::vector<v1::Job>> LoadJobs();
  // Calls `visit` with every job, oldest first, one at a time (a long
  // history is never all in memory at once). `visit` must not call back
  // into the store.
  absl::Status ForEachJob(const std::function<void(v1::Job)>& visit);
  // The job `job_id`; NOT_FOUND if there is none.
  absl::StatusOr<v1::Job> LoadJob(const std::string& job_id);
  // At most `limit` jobs whose id sorts before `before_id` (bytewise, as
  // std::string compares; every job if it is empty), the greatest first.
  absl::StatusOr<std::vector<v1::Job>> LoadJobsBefore(const std::string& before_id, int limit);
  // The greatest seq of `job_id`'s events, 0 if it has none.
  absl::StatusOr<int64_t> LastEventSeq(const std::string& job_id);
  // Events of `job_id` with seq > after_seq, in order.
  absl::StatusOr<std::vector<v1::JobEvent>> LoadEvents(const std::string& job_id,
                                                       int64_t after_seq);

  // Committed checkpoint manifests, one per (job_id, step).
  absl::Status SaveManifest(const v1::CheckpointManifest& manifest);
  absl::Status DeleteManifest(const std::string& job_id, int64_t step);
  // Of `job_id` (every job if empty), oldest step first.
  absl::StatusOr<std::vector<v1::CheckpointManifest>> LoadManifests(const std::string& job_id);

  // An elastic job's change of generation in progress (one record per job,
  // replaced), and the record of `job_id` (an empty one if none was saved).
  absl::Status SaveElasticRecord(const std::string& job_id,
                                 const coordinator::ElasticRecord& record);
  absl::StatusOr<coordinator::ElasticRecord> LoadElasticRecord(const std::string& job_id);

  const std::string& path() const { return path_; }

  // This state's cluster id: 12 hex digits drawn when the database was
  // created and kept for its life, so it survives restarts. Job ids are
  // only unique within a cluster (every coordinator counts from
  // job-000001); directories shared between clusters are namespaced by it
  // (Note [Shared directories per cluster] in coordinator/job_manager.cc).
  const std::string& cluster_id() const { return cluster_id_; }

 private:
  StateStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SaveJobLocked(const v1::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AppendEventLocked(const v1::JobEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> LoadOrCreateClusterId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The jobs in the rows `stmt` steps through (column 0).
  absl::StatusOr<std::vector<v1::Job>> ReadJobs(sqlite3_stmt* stmt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  const std::string path_;
  std::string cluster_id_;  // set once by Open
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_STATE_STORE_H_
