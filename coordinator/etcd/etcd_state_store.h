// EtcdStateStore: the coordinator's durable state (StateStore) in etcd,
// shared by every coordinator started with the same --state
// etcd://.../PREFIX, and written only by the leader.
//
// Keys (values are serialized protos unless said otherwise):
//   PREFIX/cluster_id                   the cluster id (text)
//   PREFIX/jobs/JOB_ID                  chorus.v1.Job
//   PREFIX/job_order/SUBMIT_US/JOB_ID   empty: jobs by submission (ForEachJob)
//   PREFIX/events/JOB_ID/SEQ            chorus.v1.JobEvent
//   PREFIX/manifests/JOB_ID/STEP        chorus.v1.CheckpointManifest
//   PREFIX/elastic/JOB_ID               chorus.coordinator.ElasticRecord
//   PREFIX/checkpoint_dir_marker        token of the shared checkpoint directory
//   PREFIX/job_credentials_secret       the job-credential secret (text)
// Numbers in keys are zero-padded to 20 digits so that keys sort as the
// numbers do; seq and step must be >= 0.
//
// Every write is one etcd transaction that first compares the leader key's
// create_revision with the one this coordinator won with (the fence, Note
// [Leader lease] in etcd_leadership.cc): a coordinator that no longer leads
// gets FAILED_PRECONDITION "this coordinator no longer leads (fenced by
// etcd): ..." and nothing is written. Note [etcd limits] in the .cc says
// what happens at etcd's request size limit.
//
// Thread-safety: every method may be called from any thread.
//
// Example:
//   ASSIGN_OR_RETURN(auto state,
//                    EtcdStateStore::Open(*etcd, "/chorus", leadership.fence()));
//   RETURN_IF_ERROR(state->SaveJob(job));
#ifndef CHORUS_COORDINATOR_ETCD_ETCD_STATE_STORE_H_
#define CHORUS_COORDINATOR_ETCD_ETCD_STATE_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/etcd/etcd_client.h"
#include "coordinator/etcd/etcd_leadership.h"
#include "coordinator/state/state_store.h"

namespace chorus {

struct EtcdStateStoreOptions {
  // etcd's --max-request-bytes (1.5 MiB by default): a write larger than
  // this is refused here, with a message naming the record, before etcd
  // would refuse it.
  int64_t max_request_bytes = 3 << 19;
  // Keys per page of a range read.
  int page_size = 500;
  // Whether this coordinator still believes it leads (Leadership::IsLeader);
  // a write asked for once it does not is refused here, before etcd's fence
  // could still let it through (Note [Fenced writes] in the .cc). Null: the
  // fence alone.
  std::function<bool()> still_leading;
  // Called with the refusal's message when etcd refused a write because
  // the leader key is no longer the one this store is fenced on: the
  // coordinator was deposed without noticing yet, and steps down
  // (EtcdLeadership::Deposed). Runs on the writing thread, perhaps under
  // its caller's locks, so it must not block. Null: the write's
  // FAILED_PRECONDITION alone.
  std::function<void(const std::string& why)> on_fenced;
};

class EtcdStateStore : public StateStore {
 public:
  // The state under `prefix` (no trailing '/'), written under `fence`.
  // Reads the cluster id, or draws and writes it on first use.
  // FAILED_PRECONDITION if the fence no longer holds, UNAVAILABLE if etcd
  // cannot answer. `etcd` must outlive the store.
  static absl::StatusOr<std::unique_ptr<EtcdStateStore>> Open(EtcdClient& etcd,
                                                              std::string prefix,
                                                              LeaderFence fence,
                                                              EtcdStateStoreOptions options = {});
  EtcdStateStore(const EtcdStateStore&) = delete;
  EtcdStateStore& operator=(const EtcdStateStore&) = delete;

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

  // Checks that `dir` is the checkpoint directory every coordinator of this
  // cluster shares (Note [Shared checkpoint directory] in the .cc): the
  // first leader leaves a marker file there and its token in etcd; a later
  // leader that does not find the same marker in its `dir` gets
  // FAILED_PRECONDITION naming the directory, instead of starting without
  // the checkpoints the cluster committed.
  absl::Status ClaimSharedDirectory(const std::string& dir);

  // The job-credential secret every coordinator of this cluster uses (Note
  // [Shared job credentials] in the .cc): the one in etcd; the first leader
  // that needs one stores its `local_path` file's, or a new one. A
  // `local_path` file that differs from etcd's is refused
  // (FAILED_PRECONDITION naming both and what to do).
  absl::StatusOr<JobCredentials> LoadJobCredentials(const std::string& local_path) override;

  const std::string& path() const override { return path_; }
  const std::string& cluster_id() const override { return cluster_id_; }

 private:
  EtcdStateStore(EtcdClient& etcd, std::string prefix, LeaderFence fence,
                 EtcdStateStoreOptions options);
  // One fenced transaction of `ops` (Note [Fenced writes]).
  absl::Status Write(const std::string& what, std::vector<etcdserverpb::RequestOp> ops);
  // Calls `visit` with every key in [begin, end), in key order, a page at a
  // time; stops at the first error `visit` returns.
  absl::Status ForEachKey(const std::string& begin, const std::string& end, bool keys_only,
                          const std::function<absl::Status(const etcdserverpb::KeyValue&)>& visit);
  // The value of `key`, nullopt if there is none.
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key);
  absl::StatusOr<std::string> LoadOrCreateClusterId();
  absl::Status Corrupt(absl::string_view what, absl::string_view key) const;

  std::string JobKey(const std::string& job_id) const;
  std::string EventKey(const std::string& job_id, int64_t seq) const;
  etcdserverpb::RequestOp PutJob(const v1::Job& job) const;
  etcdserverpb::RequestOp PutJobOrder(const v1::Job& job) const;

  EtcdClient& etcd_;
  const std::string prefix_;
  const LeaderFence fence_;
  const EtcdStateStoreOptions options_;
  const std::string path_;
  std::string cluster_id_;  // set once by Open
};

// The read-only half of EtcdStateStore::ClaimSharedDirectory, for a
// coordinator about to campaign (its follower would otherwise start and
// fail only once elected): OK when `dir` is the checkpoint directory the
// cluster at `prefix` shares or none has been claimed yet;
// FAILED_PRECONDITION naming `dir` when the cluster's is another (a PREFIX
// another cluster uses, or storage that is not shared); etcd's error when
// it cannot be read. `where` names the state (etcd://...) in the message.
absl::Status CheckSharedDirectory(EtcdClient& etcd, const std::string& prefix,
                                  const std::string& dir, const std::string& where);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_ETCD_ETCD_STATE_STORE_H_
