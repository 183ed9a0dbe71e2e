#include "coordinator/etcd/etcd_leadership.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/etcd/leader_record.pb.h"
#include "glog/logging.h"

namespace chorus {

// Note [Leader lease]
// The leader is whoever created the key PREFIX/leader, bound to its lease: a
// transaction "if the key's create_revision is 0 (it does not exist), put it
// with my lease". etcd deletes the key when the lease ends, and only then can
// another coordinator's transaction succeed.
//
// When does this coordinator stop believing it leads? etcd's leader starts a
// lease's TTL when it *processes* a grant or keep-alive, which is after we
// *sent* it. So if we take `sent + TTL` as the end, the lease really ends no
// earlier (by etcd's clock), and no other coordinator can create the key
// before then. IsLeader() is therefore true only until
// `sent of the last confirmed keep-alive + TTL - safety_margin`; the margin
// covers the rate difference of the two clocks over one TTL (ppm in
// practice) and the time between IsLeader() answering true and the action it
// guarded. A keep-alive that is not answered changes nothing: the old end
// stands and passes. etcd only ever lengthens leases on its own (a new raft
// leader extends them), never shortens them, so the argument holds across
// etcd leader changes. Keep-alives go out every TTL/3, so two can be lost
// before the end comes near.
//
// The remaining window (a leader that checked IsLeader, then stalled, e.g.
// in a long GC-like pause, and writes after its lease ended) is closed by
// the fence: every state write is a transaction that compares the leader
// key's create_revision with the one this coordinator won with
// (LeaderFence). A successor's key has a newer create_revision, so a
// deposed leader's write fails in etcd itself, whatever its clock says.

namespace {

LeaderInfo ToLeaderInfo(const coordinator::LeaderRecord& record) {
  LeaderInfo info;
  info.id = record.id();
  info.address = record.address();
  info.http_url = record.http_url();
  info.since = absl::FromUnixMicros(record.since_unix_us());
  return info;
}

std::string Serialize(const LeaderInfo& info) {
  coordinator::LeaderRecord record;
  record.set_id(info.id);
  record.set_address(info.address);
  record.set_http_url(info.http_url);
  record.set_since_unix_us(absl::ToUnixMicros(info.since));
  return record.SerializeAsString();
}

}  // namespace

EtcdLeadership::EtcdLeadership(EtcdClient& etcd, EtcdLeadershipOptions options)
    : etcd_(etcd),
      options_(std::move(options)),
      key_(options_.prefix + "/leader"),
      self_(options_.self) {}

EtcdLeadership::~EtcdLeadership() { Stop(); }

void EtcdLeadership::SetSelfAddress(std::string address, std::string http_url) {
  absl::MutexLock lock(&mu_);
  self_.address = std::move(address);
  self_.http_url = std::move(http_url);
}

// Note [Standbys watch the leader key]
// A coordinator that does not lead reads the key once, then waits on etcd's
// Watch stream for its deletion (Note [Watching the leader key] in
// etcd_client.cc), as etcd's own election (clientv3/concurrency) waits for its
// predecessor's key: a leader that resigns or whose lease ends is replaced as
// soon as etcd deletes the key, and a waiting coordinator sends etcd nothing
// meanwhile. Before, it read the key every 100 ms: 10 reads a second per
// standby, and a takeover up to 100 ms late. The watch is a live stream that
// can break or, in a case not foreseen, stay silent; so a quiet watch is ended
// after recheck_interval (jittered) and the key read again, and after an error
// the next read waits a Backoff from retry_delay up to retry_max.
absl::Status EtcdLeadership::Campaign() {
  BackoffOptions delays;
  delays.initial = options_.retry_delay;
  delays.max = std::max(options_.retry_max, options_.retry_delay);
  Backoff retry(delays);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return absl::CancelledError("the coordinator is stopping");
      if (leading_ && Valid()) return absl::OkStatus();
    }
    bool won = false;
    int64_t seen_at = 0;
    absl::Status status = TryToWin(&won, &seen_at);
    {
      absl::MutexLock lock(&mu_);
      election_error_ = status;
    }
    if (status.ok() && won) return absl::OkStatus();
    if (status.ok()) {
      retry.Reset();
      WaitForVacancy(seen_at, retry);
      continue;
    }
    if (!absl::IsUnavailable(status)) {
      return absl::UnavailableError(absl::StrCat("leader election: ", status.message()));
    }
    LOG(WARNING) << "leader election: " << status.message() << "; trying again";
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopped_), retry.Next());
  }
}

void EtcdLeadership::WaitForVacancy(int64_t seen_at, Backoff& retry) {
  absl::Status watched = absl::UnavailableError("no revision to watch from");
  if (seen_at > 0) {
    BackoffOptions quiet;  // one jittered draw of [recheck_interval / 2, recheck_interval]
    quiet.initial = options_.recheck_interval;
    quiet.max = options_.recheck_interval;
    const absl::Time recheck = absl::Now() + Backoff(quiet).Next();
    watched = etcd_.WaitForDeletion(key_, seen_at + 1, recheck, &watch_canceller_);
  }
  if (watched.ok() || absl::IsDeadlineExceeded(watched) || absl::IsCancelled(watched)) return;
  VLOG(1) << "watching " << key_ << ": " << watched.message() << "; reading it again";
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopped_), retry.Next());
}

absl::Status EtcdLeadership::TryToWin(bool* won, int64_t* seen_at) {
  *won = false;
  *seen_at = 0;
  etcdserverpb::RangeRequest get;
  get.set_key(key_);
  absl::StatusOr<etcdserverpb::RangeResponse> held = etcd_.Range(get);
  if (!held.ok()) return held.status();
  if (held->kvs_size() > 0) {  // someone leads: us?
    *seen_at = held->header().revision();
    return TryToTakeBack(held->kvs(0), won);
  }

  const absl::Time sent = absl::Now();
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> lease = etcd_.LeaseGrant(options_.lease_ttl);
  if (!lease.ok()) return lease.status();
  LeaderInfo me;
  {
    absl::MutexLock lock(&mu_);
    self_.since = absl::Now();
    me = self_;
  }
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* absent = txn.add_compare();
  absent->set_key(key_);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key_);
  put->set_value(Serialize(me));
  put->set_lease(lease->id());
  txn.add_failure()->mutable_request_range()->set_key(key_);
  absl::StatusOr<etcdserverpb::TxnResponse> result = etcd_.Txn(txn);
  int64_t revision = 0;
  if (result.ok() && result->succeeded()) {
    revision = result->header().revision();
  } else if (result.ok() && result->responses_size() == 1 &&
             result->responses(0).response_range().kvs_size() == 1 &&
             result->responses(0).response_range().kvs(0).lease() == lease->id()) {
    // A retried transaction whose first attempt had won (Note [Retried calls]).
    revision = result->responses(0).response_range().kvs(0).create_revision();
  }
  if (revision == 0) {
    // Lost to another coordinator: its key exists at this revision.
    if (result.ok()) *seen_at = result->header().revision();
    (void)etcd_.LeaseRevoke(lease->id());
    return result.ok() ? absl::OkStatus() : result.status();
  }
  *won = StartTerm(lease->id(), absl::Seconds(lease->ttl()), sent, revision);
  if (*won) {
    LOG(INFO) << "leading " << key_ << " (" << etcd_.name() << ", revision " << revision
              << ", lease " << lease->ttl() << " s)";
  }
  return absl::OkStatus();
}

// Note [Taking back a lapsed term]
// This coordinator stops leading when its own bound on the lease passes (Note
// [Leader lease]) although etcd may still hold the lease. That happens when
// etcd itself has no raft leader for a while: losing the etcd member that led
// raft takes one or two of etcd's election timeouts (1-2 s with its defaults)
// before a keep-alive is answered again, longer than a 2 s lease leaves between
// keep-alives. etcd keeps the lease (a new raft leader extends every lease), so
// the leader key is still there and every other coordinator keeps waiting;
// without this, the key would lapse unrenewed and another coordinator would
// take over for nothing. So a campaign that finds the key still bound to the
// lease of this coordinator's last term, with that term's create_revision,
// renews the lease and leads again under the same fence. That is safe: a key
// with the same create_revision was never deleted and created again, so no
// other coordinator has led since; and the new term's bound starts from this
// renewal, like any other.
absl::Status EtcdLeadership::TryToTakeBack(const etcdserverpb::KeyValue& held, bool* won) {
  int64_t lease_id;
  LeaderFence fence;
  {
    absl::MutexLock lock(&mu_);
    lease_id = lease_id_;
    fence = fence_;
  }
  const auto ours = [&](const etcdserverpb::KeyValue& kv) {
    return lease_id != 0 && kv.lease() == lease_id &&
           kv.create_revision() == fence.create_revision;
  };
  if (!ours(held)) return absl::OkStatus();  // another coordinator leads
  const absl::Time sent = absl::Now();
  absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> renewed =
      etcd_.LeaseKeepAliveOnce(lease_id, options_.lease_ttl);
  if (!renewed.ok()) return renewed.status();
  if (renewed->ttl() <= 0) return absl::OkStatus();  // it ended: the key goes with it
  etcdserverpb::RangeRequest get;
  get.set_key(key_);
  absl::StatusOr<etcdserverpb::RangeResponse> again = etcd_.Range(get);
  if (!again.ok()) return again.status();
  if (again->kvs_size() == 0 || !ours(again->kvs(0))) return absl::OkStatus();
  *won = StartTerm(lease_id, absl::Seconds(renewed->ttl()), sent, fence.create_revision);
  if (*won) {
    LOG(INFO) << "leading " << key_ << " again (" << etcd_.name() << ", revision "
              << fence.create_revision << "): etcd kept this coordinator's lease and key "
              << "while it could not renew them";
  }
  return absl::OkStatus();
}

bool EtcdLeadership::StartTerm(int64_t lease_id, absl::Duration ttl, absl::Time sent,
                               int64_t revision) {
  absl::MutexLock thread_lock(&thread_mu_);
  if (keep_alive_.joinable()) keep_alive_.join();  // an earlier term's, already ending
  {
    absl::MutexLock lock(&mu_);
    granted_ttl_ = ttl;
    valid_until_ = sent + granted_ttl_ - options_.safety_margin;
    lease_id_ = lease_id;
    fence_ = {key_, revision};
    if (stopped_ || !Valid()) return false;  // Stop() or the lease ends by itself
    leading_ = true;
    keep_alive_exit_ = false;
  }
  keep_alive_ = std::thread([this] { KeepAlive(); });
  return true;
}

bool EtcdLeadership::Valid() const { return absl::Now() < valid_until_; }

bool EtcdLeadership::IsLeader() const {
  absl::MutexLock lock(&mu_);
  return leading_ && Valid();
}

std::optional<LeaderInfo> EtcdLeadership::Leader() const {
  etcdserverpb::RangeRequest get;
  get.set_key(key_);
  absl::StatusOr<etcdserverpb::RangeResponse> held = etcd_.Range(get);
  if (!held.ok() || held->kvs_size() == 0) return std::nullopt;
  coordinator::LeaderRecord record;
  if (!record.ParseFromString(held->kvs(0).value())) return std::nullopt;
  return ToLeaderInfo(record);
}

absl::Status EtcdLeadership::ElectionError() const {
  absl::MutexLock lock(&mu_);
  return election_error_;
}

LeaderFence EtcdLeadership::fence() const {
  absl::MutexLock lock(&mu_);
  return fence_;
}

void EtcdLeadership::WaitUntilLost() {
  absl::MutexLock lock(&mu_);
  while (leading_ && Valid()) {
    mu_.AwaitWithDeadline(absl::Condition(+[](bool* leading) { return !*leading; }, &leading_),
                          valid_until_);
  }
  // The keep-alive thread ends now rather than at its next renewal, so that
  // a campaign taking the term back does not wait for it.
  MarkLost("the lease's end came before a keep-alive was answered");
}

void EtcdLeadership::MarkLost(absl::string_view why) {
  if (leading_) LOG(WARNING) << "no longer leading " << key_ << ": " << why;
  leading_ = false;
  keep_alive_exit_ = true;
}

void EtcdLeadership::Deposed(const LeaderFence& fence, absl::string_view why) {
  absl::MutexLock lock(&mu_);
  if (fence.key != fence_.key || fence.create_revision != fence_.create_revision) return;
  MarkLost(absl::StrCat("a write was refused by etcd's fence: ", why));
}

void EtcdLeadership::KeepAlive() {
  absl::Duration wait;
  {
    absl::MutexLock lock(&mu_);
    wait = granted_ttl_ / 3;
  }
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&keep_alive_exit_), wait);
      if (keep_alive_exit_ || !leading_) return;
    }
    if (!RenewOnce()) return;
  }
}

bool EtcdLeadership::RenewOnce() {
  int64_t lease_id;
  absl::Time until;
  {
    absl::MutexLock lock(&mu_);
    lease_id = lease_id_;
    until = valid_until_;
  }
  const absl::Time sent = absl::Now();
  if (sent >= until) {
    absl::MutexLock lock(&mu_);
    MarkLost("the lease was not renewed in time (etcd unreachable or without quorum)");
    return false;
  }
  absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> renewed =
      etcd_.LeaseKeepAliveOnce(lease_id, until - sent);
  absl::StatusOr<etcdserverpb::RangeResponse> held;
  if (renewed.ok() && renewed->ttl() > 0) {
    etcdserverpb::RangeRequest get;
    get.set_key(key_);
    held = etcd_.Range(get);
  }
  absl::MutexLock lock(&mu_);
  if (!leading_ || keep_alive_exit_) return false;
  if (!renewed.ok()) {
    LOG(WARNING) << "leader lease keep-alive: " << renewed.status().message();
    if (Valid()) return true;
    MarkLost("the lease was not renewed in time (etcd unreachable or without quorum)");
    return false;
  }
  if (renewed->ttl() <= 0) {
    MarkLost("etcd says the lease is gone (revoked or expired)");
    return false;
  }
  if (!Valid()) {
    // IsLeader() may have answered false already: a term, once over, stays over.
    MarkLost("the keep-alive was answered after the lease's end");
    return false;
  }
  valid_until_ = std::max(valid_until_, sent + absl::Seconds(renewed->ttl()) -
                                            options_.safety_margin);
  if (held.ok() && (held->kvs_size() == 0 ||
                    held->kvs(0).create_revision() != fence_.create_revision)) {
    MarkLost(absl::StrCat("the leader key ", key_, " was deleted or replaced"));
    return false;
  }
  return true;
}

void EtcdLeadership::GiveUp(bool release) {
  int64_t lease_id;
  LeaderFence fence;
  {
    absl::MutexLock lock(&mu_);
    keep_alive_exit_ = true;
    leading_ = false;
    lease_id = release ? std::exchange(lease_id_, 0) : 0;
    fence = fence_;
  }
  {
    absl::MutexLock thread_lock(&thread_mu_);
    if (keep_alive_.joinable()) keep_alive_.join();
  }
  if (lease_id == 0) return;
  // Delete the key only if it is still ours, so that a successor is not
  // deposed; then revoke the lease (which would delete it too).
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* ours = txn.add_compare();
  ours->set_key(fence.key);
  ours->set_target(etcdserverpb::Compare::CREATE);
  ours->set_result(etcdserverpb::Compare::EQUAL);
  ours->set_create_revision(fence.create_revision);
  txn.add_success()->mutable_request_delete_range()->set_key(fence.key);
  absl::Status deleted = etcd_.Txn(txn).status();
  absl::Status revoked = etcd_.LeaseRevoke(lease_id);
  if (absl::IsNotFound(revoked)) revoked = absl::OkStatus();  // it had ended already
  if (!deleted.ok() || !revoked.ok()) {
    LOG(WARNING) << "giving up the leadership of " << key_ << ": "
                 << (deleted.ok() ? revoked : deleted).message()
                 << " (the lease ends by itself within its TTL)";
  }
}

void EtcdLeadership::Resign() { GiveUp(/*release=*/true); }

void EtcdLeadership::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  watch_canceller_.Cancel();
  GiveUp(/*release=*/true);
}

}  // namespace chorus
