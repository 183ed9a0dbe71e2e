// StateStore: the coordinator's durable state: jobs and their events,
// checkpoint manifests, elastic records and the cluster id. Everything is
// written before the RPC that changed it answers, so a coordinator killed
// with SIGKILL and restarted (or, with etcd, another coordinator taking
// over) knows every acknowledged job.
//
// Two implementations: SqliteStateStore (below), one SQLite database in
// --state_dir, the default; and EtcdStateStore
// (coordinator/etcd/etcd_state_store.h), shared by coordinators that elect a
// leader through etcd, every write fenced on that leadership.
//
// Thread-safety: all methods are safe to call from any thread.
//
// Example:
//   ASSIGN_OR_RETURN(auto store, StateStore::Open("/var/lib/chorus"));
//   RETURN_IF_ERROR(store->SaveJob(job));
//   ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store->LoadJobs());
#ifndef CHORUS_COORDINATOR_STATE_STATE_STORE_H_
#define CHORUS_COORDINATOR_STATE_STATE_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/coordinator.pb.h"
#include "common/job_credentials.h"
#include "coordinator/state/elastic_record.pb.h"

struct sqlite3;
struct sqlite3_stmt;

namespace chorus {

class StateStore {
 public:
  // The SQLite state in `dir` (SqliteStateStore::Open).
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& dir);
  virtual ~StateStore() = default;

  // Inserts or replaces the job (by job_id), durably.
  virtual absl::Status SaveJob(const v1::Job& job) = 0;
  // Appends an event (its job_id and seq set), durably.
  virtual absl::Status AppendEvent(const v1::JobEvent& event) = 0;
  // Both in one commit: either both are stored or neither (Note [One commit
  // per change] in state_store.cc).
  virtual absl::Status SaveJobAndEvent(const v1::Job& job, const v1::JobEvent& event) = 0;
  // Every job, oldest first.
  absl::StatusOr<std::vector<v1::Job>> LoadJobs();
  // Calls `visit` with every job, oldest first (by submit_time_us, then
  // job_id), one at a time (a long history is never all in memory at once).
  // `visit` must not call back into the store.
  virtual absl::Status ForEachJob(const std::function<void(v1::Job)>& visit) = 0;
  // The job `job_id`; NOT_FOUND if there is none.
  virtual absl::StatusOr<v1::Job> LoadJob(const std::string& job_id) = 0;
  // At most `limit` jobs whose id sorts before `before_id` (bytewise, as
  // std::string compares; every job if it is empty), the greatest first.
  virtual absl::StatusOr<std::vector<v1::Job>> LoadJobsBefore(const std::string& before_id,
                                                              int limit) = 0;
  // The greatest seq of `job_id`'s events, 0 if it has none.
  virtual absl::StatusOr<int64_t> LastEventSeq(const std::string& job_id) = 0;
  // Events of `job_id` with seq > after_seq, in order.
  virtual absl::StatusOr<std::vector<v1::JobEvent>> LoadEvents(const std::string& job_id,
                                                               int64_t after_seq) = 0;

  // Committed checkpoint manifests, one per (job_id, step).
  virtual absl::Status SaveManifest(const v1::CheckpointManifest& manifest) = 0;
  virtual absl::Status DeleteManifest(const std::string& job_id, int64_t step) = 0;
  // Of `job_id` (every job if empty), by job_id, then oldest step first.
  virtual absl::StatusOr<std::vector<v1::CheckpointManifest>> LoadManifests(
      const std::string& job_id) = 0;

  // An elastic job's change of generation in progress (one record per job,
  // replaced), and the record of `job_id` (an empty one if none was saved).
  virtual absl::Status SaveElasticRecord(const std::string& job_id,
                                         const coordinator::ElasticRecord& record) = 0;
  virtual absl::StatusOr<coordinator::ElasticRecord> LoadElasticRecord(
      const std::string& job_id) = 0;

  // Where the state is, for messages: a file, or etcd's endpoints and prefix.
  virtual const std::string& path() const = 0;

  // This state's cluster id: 12 hex digits drawn when the state was
  // created and kept for its life, so it survives restarts. Job ids are
  // only unique within a cluster (every coordinator counts from
  // job-000001); directories shared between clusters are namespaced by it
  // (Note [Shared directories per cluster] in coordinator/state/job_manager.cc).
  virtual const std::string& cluster_id() const = 0;

  // The secret this cluster's job credentials are made with (Note [Job
  // credentials] in common/job_credentials.h). `local_path` is this
  // coordinator's own file, --state_dir/job_credentials.key. Here: that file,
  // created on first use. A state that several coordinators share shares the
  // secret too (EtcdStateStore).
  virtual absl::StatusOr<JobCredentials> LoadJobCredentials(const std::string& local_path) {
    return JobCredentials::LoadOrCreate(local_path);
  }
};

// 12 random hex digits, a new cluster id.
std::string NewClusterId();

// The state in one SQLite database, `dir`/chorus.db.
class SqliteStateStore : public StateStore {
 public:
  // Opens (creating if needed) `dir`/chorus.db. FAILED_PRECONDITION naming
  // the file if it cannot be opened or is not a Chorus database.
  static absl::StatusOr<std::unique_ptr<SqliteStateStore>> Open(const std::string& dir);
  SqliteStateStore(const SqliteStateStore&) = delete;
  SqliteStateStore& operator=(const SqliteStateStore&) = delete;
  ~SqliteStateStore() override;

  absl::Status SaveJob(const v1::Job& job) override;
  absl::Status AppendEvent(const v1::JobEvent& event) override;
  absl::Status SaveJobAndEvent(const v1::Job& job, const v1::JobEvent& event) override;
  absl::Status ForEachJob(const std::function<void(v1::Job)>& visit) override;
  absl::StatusOr<v1::Job> LoadJob(const std::string& job_id) override;
  absl::StatusOr<std::vector<v1::Job>> LoadJobsBefore(const std::string& before_id,
                                                      int limit) override;
  absl::StatusOr<int64_t> LastEventSeq(const std::string& job_id) override;
  absl::StatusOr<std::vector<v1::JobEvent>> LoadEvents(const std::string& job_id,
                                                       int64_t after_seq) override;
  absl::Status SaveManifest(const v1::CheckpointManifest& manifest) override;
  absl::Status DeleteManifest(const std::string& job_id, int64_t step) override;
  absl::StatusOr<std::vector<v1::CheckpointManifest>> LoadManifests(
      const std::string& job_id) override;
  absl::Status SaveElasticRecord(const std::string& job_id,
                                 const coordinator::ElasticRecord& record) override;
  absl::StatusOr<coordinator::ElasticRecord> LoadElasticRecord(const std::string& job_id) override;

  const std::string& path() const override { return path_; }
  const std::string& cluster_id() const override { return cluster_id_; }

 private:
  SqliteStateStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SaveJobLocked(const v1::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AppendEventLocked(const v1::JobEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> LoadOrCreateClusterId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The jobs in the rows `stmt` steps through (column 0).
  absl::StatusOr<std::vector<v1::Job>> ReadJobs(sqlite3_stmt* stmt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  const std::string path_;
  std::string cluster_id_;  // set once by Open
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_STATE_STATE_STORE_H_
