// EtcdClient: the calls Chorus makes to an etcd v3 cluster (KV, leases,
// status), over one gRPC channel to all its members.
//
// The channel balances over every endpoint given (round robin over the
// members it can reach), so a dead member is skipped; a call that fails
// because a member went away, or found no quorum, is retried on the others
// until its deadline. Every error is an absl::Status that names the
// endpoints and the call ("etcd at 127.0.0.1:23790,127.0.0.1:23791: put:
// unreachable or no quorum (...)"): UNAVAILABLE when etcd cannot answer,
// UNAUTHENTICATED/PERMISSION_DENIED for credentials, INVALID_ARGUMENT for a
// request etcd refused (e.g. one over its size limit).
//
// Thread-safety: every method may be called from any thread.
//
// Example:
//   ASSIGN_OR_RETURN(auto etcd, EtcdClient::Connect({.endpoints = "127.0.0.1:2379"}));
//   etcdserverpb::PutRequest put;
//   put.set_key("/chorus/x");
//   RETURN_IF_ERROR(etcd->Put(put).status());
#ifndef CHORUS_COORDINATOR_ETCD_ETCD_CLIENT_H_
#define CHORUS_COORDINATOR_ETCD_ETCD_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/etcd/etcd_api.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace chorus {

struct EtcdOptions {
  // "HOST:PORT[,HOST:PORT...]": the cluster's client URLs without scheme.
  std::string endpoints;
  // PEM files, as etcdctl's --cacert/--cert/--key: a CA makes the channel
  // TLS (verifying the members against it); cert and key go together (mTLS).
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // etcd authentication (etcdctl --user): the password is read from a file
  // so that it never appears in `ps`. Both or neither.
  std::string user;
  std::string password_file;
  // Deadline of each call, retries included.
  absl::Duration call_timeout = absl::Seconds(5);
};

// Checks the options without touching the network or files: INVALID_ARGUMENT
// naming the option.
absl::Status ValidateEtcdOptions(const EtcdOptions& options);

// Ends EtcdClient::WaitForDeletion from another thread (a coordinator
// stopping while it waits for the leader key to go).
//
// Thread-safety: every method may be called from any thread.
class EtcdWaitCanceller {
 public:
  // Ends the wait in progress, if any, and every later one at once.
  void Cancel();

 private:
  friend class EtcdClient;
  // Registers the wait's context; false when already cancelled.
  bool Attach(grpc::ClientContext* context);
  void Detach();

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

class EtcdClient {
 public:
  // Reads the TLS and password files and builds the channel; with a user,
  // authenticates (the only step that needs etcd up). INVALID_ARGUMENT for
  // bad options, FAILED_PRECONDITION for an unreadable file.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(const EtcdOptions& options);
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  absl::StatusOr<etcdserverpb::RangeResponse> Range(const etcdserverpb::RangeRequest& request);
  absl::StatusOr<etcdserverpb::PutResponse> Put(const etcdserverpb::PutRequest& request);
  absl::StatusOr<etcdserverpb::DeleteRangeResponse> DeleteRange(
      const etcdserverpb::DeleteRangeRequest& request);
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& request);

  // A lease of `ttl` (whole seconds, rounded up); etcd may grant a longer one
  // (its minimum), which the response says.
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> LeaseGrant(absl::Duration ttl);
  absl::Status LeaseRevoke(int64_t lease_id);
  // One keep-alive of `lease_id`, answered within `timeout`: the response's
  // TTL is the lease's new remaining time, 0 if the lease no longer exists.
  absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> LeaseKeepAliveOnce(int64_t lease_id,
                                                                          absl::Duration timeout);
  // Maintenance.Status of whichever member answers.
  absl::StatusOr<etcdserverpb::StatusResponse> MemberStatus();

  // Watches `key` on etcd's Watch stream from `start_revision` on and
  // returns OK at its first deletion (deleted, or its lease ended) at or
  // after that revision. DEADLINE_EXCEEDED when `deadline` passes first,
  // CANCELLED once `canceller` (may be null) is cancelled, UNAVAILABLE when
  // the watch breaks (etcd unreachable, the member lost its raft leader, the
  // revision was compacted): the caller then reads the key again. Not
  // retried: a wait is cheap to start over.
  absl::Status WaitForDeletion(const std::string& key, int64_t start_revision, absl::Time deadline,
                               EtcdWaitCanceller* canceller);

  // Range calls made so far (retries of one call count once): how tests see
  // that a waiting coordinator watches rather than reads.
  int64_t range_calls() const { return range_calls_.load(); }

  // "etcd at HOST:PORT,...": how errors name this cluster.
  const std::string& name() const { return name_; }
  absl::Duration call_timeout() const { return options_.call_timeout; }

 private:
  EtcdClient(EtcdOptions options, std::shared_ptr<grpc::Channel> channel, std::string password);
  // Runs `call` with a fresh context (deadline, auth token) until it
  // succeeds, fails for good, or `timeout` has passed (Note [Retried calls]).
  template <typename Call>
  absl::Status Run(const char* what, absl::Duration timeout, Call call);
  absl::Status Authenticate(absl::Time deadline);
  absl::Status ToStatus(const char* what, const grpc::Status& status) const;

  const EtcdOptions options_;
  const std::string name_;
  const std::string password_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease_;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch_;
  std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance_;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth_;

  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);  // etcd auth token; empty without a user
  std::atomic<int64_t> range_calls_{0};
};

// Whether a failed call means etcd could not answer in time (unreachable,
// no quorum, or its own deadline passed): such a call is retried and its
// error is UNAVAILABLE (Note [etcd's own deadline]).
bool IsEtcdUnavailable(const grpc::Status& status);

// The end of the range of every key that starts with `prefix` (etcd's
// range_end for a prefix query).
std::string PrefixRangeEnd(const std::string& prefix);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_ETCD_ETCD_CLIENT_H_
