// Leadership: whether this coordinator leads its cluster, and who does.
//
// With the default state (SQLite under --state_dir) a coordinator is alone
// and always leads: SoleLeadership. With --state etcd://... any number of
// coordinators share one state and one of them leads, elected through an
// etcd lease (the etcd implementation lives beside the etcd state store).
// Only the leader serves the coordinator's services and writes the state;
// the others wait in Campaign, ready to take over.
//
// Thread-safety: every method may be called from any thread.
//
// Example:
//   RETURN_IF_ERROR(leadership.Campaign());   // blocks while another leads
//   ... serve ...
//   leadership.WaitUntilLost();               // lease gone: stop serving
#ifndef CHORUS_COORDINATOR_STATE_LEADERSHIP_H_
#define CHORUS_COORDINATOR_STATE_LEADERSHIP_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace chorus {

// Who leads, as the leader published it.
struct LeaderInfo {
  std::string id;        // the coordinator's own id (host:pid or a flag)
  std::string address;   // host:port clients dial for gRPC
  std::string http_url;  // http://HOST:PORT of its status page; may be empty
  absl::Time since = absl::InfinitePast();
};

class Leadership {
 public:
  virtual ~Leadership() = default;

  // Blocks until this coordinator leads (OK), Stop() is called (CANCELLED),
  // or the election cannot go on (UNAVAILABLE naming the backend).
  virtual absl::Status Campaign() = 0;
  // True while this coordinator leads: false from the moment its lease may
  // have expired, before any other coordinator can have been elected.
  virtual bool IsLeader() const = 0;
  // The current leader, if one is known.
  virtual std::optional<LeaderInfo> Leader() const = 0;
  // Blocks until leadership, once won, is lost (lease expired or revoked,
  // Resign, Stop). Returns at once if this coordinator does not lead.
  virtual void WaitUntilLost() = 0;
  // Gives leadership up so that another coordinator takes over at once
  // (clean shutdown). No-op when not leading.
  virtual void Resign() = 0;
  // Makes Campaign and WaitUntilLost return; leadership, if held, is given up.
  virtual void Stop() = 0;
  // Why no coordinator can lead now: the error of the last attempt to
  // campaign while it lasts (etcd unreachable or without quorum), OK once an
  // attempt gets an answer again. Answers at once, without asking the
  // backend. A coordinator alone never has one.
  virtual absl::Status ElectionError() const { return absl::OkStatus(); }
};

// The leadership of a coordinator that is alone: it leads from its first
// Campaign until Stop or Resign.
class SoleLeadership : public Leadership {
 public:
  explicit SoleLeadership(LeaderInfo self) : self_(std::move(self)) {}

  absl::Status Campaign() override {
    absl::MutexLock lock(&mu_);
    if (stopped_) return absl::CancelledError("the coordinator is stopping");
    leading_ = true;
    self_.since = absl::Now();
    return absl::OkStatus();
  }
  bool IsLeader() const override {
    absl::MutexLock lock(&mu_);
    return leading_;
  }
  std::optional<LeaderInfo> Leader() const override {
    absl::MutexLock lock(&mu_);
    if (!leading_) return std::nullopt;
    return self_;
  }
  void WaitUntilLost() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](bool* leading) { return !*leading; }, &leading_));
  }
  void Resign() override {
    absl::MutexLock lock(&mu_);
    leading_ = false;
  }
  void Stop() override {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    leading_ = false;
  }

 private:
  mutable absl::Mutex mu_;
  LeaderInfo self_ ABSL_GUARDED_BY(mu_);
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_STATE_LEADERSHIP_H_
