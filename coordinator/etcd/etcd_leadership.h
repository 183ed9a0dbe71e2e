// EtcdLeadership: leader election among the coordinators sharing one etcd
// prefix, through a lease-guarded key PREFIX/leader (Note [Leader lease] in
// etcd_leadership.cc for why IsLeader turns false before anyone else can
// win, and how the state's writes are fenced on the key's create_revision).
//
// Thread-safety: every method may be called from any thread. The object
// owns one keep-alive thread while it leads, joined by Resign, Stop and the
// destructor.
//
// Example:
//   EtcdLeadership leadership(*etcd, {.prefix = "/chorus", .self = me});
//   RETURN_IF_ERROR(leadership.Campaign());
//   ASSIGN_OR_RETURN(auto state, EtcdStateStore::Open(*etcd, "/chorus",
//                                                   leadership.fence()));
#ifndef CHORUS_COORDINATOR_ETCD_ETCD_LEADERSHIP_H_
#define CHORUS_COORDINATOR_ETCD_ETCD_LEADERSHIP_H_

#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/backoff.h"
#include "coordinator/etcd/etcd_client.h"
#include "coordinator/state/leadership.h"

namespace chorus {

// What a leader's writes are fenced on: the leader key and the revision at
// which this coordinator created it.
struct LeaderFence {
  std::string key;
  int64_t create_revision = 0;
};

struct EtcdLeadershipOptions {
  // The state's prefix (no trailing '/'); the leader key is PREFIX/leader.
  std::string prefix;
  LeaderInfo self;
  // The lease's time to live (--leader_lease_seconds); a deposed or dead
  // leader is replaced within about this long. etcd grants at least its own
  // minimum (about 2 s with default election settings).
  absl::Duration lease_ttl = absl::Seconds(2);
  // A coordinator that does not lead watches the key and campaigns when it
  // is deleted (Note [Standbys watch the leader key]). As a safety net it
  // also reads the key again after a quiet watch of this long (each wait
  // drawn from its upper half, Note [Backoff] in common/backoff.cc).
  absl::Duration recheck_interval = absl::Seconds(3);
  // After etcd could not answer (or a watch broke), the first wait before
  // reading the key again; later ones double up to `retry_max`, jittered.
  absl::Duration retry_delay = absl::Milliseconds(100);
  absl::Duration retry_max = absl::Seconds(1);
  // Subtracted from every lease's end for clock rate differences between
  // this machine and etcd's leader (Note [Leader lease]).
  absl::Duration safety_margin = absl::Milliseconds(250);
};

class EtcdLeadership : public Leadership {
 public:
  // `etcd` must outlive this object.
  EtcdLeadership(EtcdClient& etcd, EtcdLeadershipOptions options);
  EtcdLeadership(const EtcdLeadership&) = delete;
  EtcdLeadership& operator=(const EtcdLeadership&) = delete;
  ~EtcdLeadership() override;

  // Where clients reach this coordinator, as its leader record will say
  // once it wins: the address and status page it actually bound (a
  // --listen port of 0 is known only then). Takes effect at the next win.
  void SetSelfAddress(std::string address, std::string http_url);

  absl::Status Campaign() override;
  bool IsLeader() const override;
  std::optional<LeaderInfo> Leader() const override;
  void WaitUntilLost() override;
  void Resign() override;
  void Stop() override;
  absl::Status ElectionError() const override;

  // The fence of the leadership this coordinator won last (create_revision
  // 0 before it first won). Stays set after the leadership is lost, so that
  // a deposed leader's writes are refused by etcd rather than skipped.
  LeaderFence fence() const;
  // etcd refused a write fenced on `fence` (Note [Fenced writes] in
  // etcd_state_store.cc): the leader key is gone or another coordinator's.
  // If this coordinator still leads under that fence it stops now
  // (IsLeader false, WaitUntilLost returns), not at its next renewal up to
  // a third of the lease later; a refusal under an earlier term's fence
  // changes nothing. Never blocks on etcd.
  void Deposed(const LeaderFence& fence, absl::string_view why) ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& key() const { return key_; }

 private:
  // One attempt: OK with `*won` set, or an error from etcd. When another
  // coordinator leads, `*seen_at` is a revision at which the key existed
  // (0 if none is known).
  absl::Status TryToWin(bool* won, int64_t* seen_at);
  // Waits until the key, seen at revision `seen_at`, is deleted, the
  // re-check is due, Stop() is called, or (after a broken watch) `retry`'s
  // next delay has passed.
  void WaitForVacancy(int64_t seen_at, Backoff& retry) ABSL_LOCKS_EXCLUDED(mu_);
  // `held` is the leader key as read: if it is still this coordinator's
  // last term's, renews that lease and leads again (Note [Taking back a
  // lapsed term]); OK with `*won` false otherwise.
  absl::Status TryToTakeBack(const etcdserverpb::KeyValue& held, bool* won)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Leads on `lease_id` (granted or renewed for `ttl` by a request sent at
  // `sent`) under the fence `revision`, and starts the keep-alive thread;
  // false if stopped or the lease's bound has already passed.
  bool StartTerm(int64_t lease_id, absl::Duration ttl, absl::Time sent, int64_t revision)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The keep-alive thread's body: renews the lease every TTL/3 until the
  // leadership is lost or given up.
  void KeepAlive();
  // Renews once; false when the leadership is gone for good.
  bool RenewOnce() ABSL_LOCKS_EXCLUDED(mu_);
  void MarkLost(absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops the keep-alive thread and, if `release`, deletes the key and
  // revokes the lease.
  void GiveUp(bool release) ABSL_LOCKS_EXCLUDED(mu_);
  bool Valid() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  EtcdClient& etcd_;
  const EtcdLeadershipOptions options_;
  const std::string key_;

  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  bool keep_alive_exit_ ABSL_GUARDED_BY(mu_) = false;
  int64_t lease_id_ ABSL_GUARDED_BY(mu_) = 0;
  // The lease certainly lives until then (Note [Leader lease]).
  absl::Time valid_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Duration granted_ttl_ ABSL_GUARDED_BY(mu_);
  LeaderFence fence_ ABSL_GUARDED_BY(mu_);
  LeaderInfo self_ ABSL_GUARDED_BY(mu_);
  // Ends a standby's watch of the key when the coordinator stops.
  EtcdWaitCanceller watch_canceller_;
  // The last campaign attempt's error; OK after one that etcd answered.
  absl::Status election_error_ ABSL_GUARDED_BY(mu_);
  // Held while the keep-alive thread is started or joined (never with mu_).
  absl::Mutex thread_mu_;
  std::thread keep_alive_ ABSL_GUARDED_BY(thread_mu_);
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_ETCD_ETCD_LEADERSHIP_H_
