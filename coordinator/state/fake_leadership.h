// FakeLeadership: a Leadership for tests that the test makes win and lose.
//
// Thread-safety: every method may be called from any thread.
//
// Example:
//   FakeLeadership leadership;
//   std::thread loop([&] { loop.Run(); });   // campaigns, blocks
//   leadership.Win();                        // Campaign returns OK
//   leadership.Lose();                       // WaitUntilLost returns
#ifndef CHORUS_COORDINATOR_STATE_FAKE_LEADERSHIP_H_
#define CHORUS_COORDINATOR_STATE_FAKE_LEADERSHIP_H_

#include <optional>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "coordinator/state/leadership.h"

namespace chorus {

// Leads when the test says Win, stops leading when it says Lose.
class FakeLeadership : public Leadership {
 public:
  void Win() {
    absl::MutexLock lock(&mu_);
    won_ = true;
  }
  void Lose() {
    absl::MutexLock lock(&mu_);
    won_ = false;
    leading_ = false;
  }
  // Who the others lead as: what followers tell clients.
  void SetOtherLeader(std::optional<LeaderInfo> leader) {
    absl::MutexLock lock(&mu_);
    other_ = std::move(leader);
  }
  // What ElectionError answers (as EtcdLeadership while etcd has no quorum).
  void SetElectionError(absl::Status error) {
    absl::MutexLock lock(&mu_);
    election_error_ = std::move(error);
  }
  int campaigns() const {
    absl::MutexLock lock(&mu_);
    return campaigns_;
  }
  int resigns() const {
    absl::MutexLock lock(&mu_);
    return resigns_;
  }

  absl::Status Campaign() override {
    absl::MutexLock lock(&mu_);
    ++campaigns_;
    mu_.Await(absl::Condition(
        +[](FakeLeadership* self) { return self->won_ || self->stopped_; }, this));
    if (stopped_) return absl::CancelledError("stopped");
    leading_ = true;
    return absl::OkStatus();
  }
  bool IsLeader() const override {
    absl::MutexLock lock(&mu_);
    return leading_;
  }
  std::optional<LeaderInfo> Leader() const override {
    absl::MutexLock lock(&mu_);
    if (leading_) return LeaderInfo{"me", "self", "", absl::Now()};
    return other_;
  }
  void WaitUntilLost() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](bool* leading) { return !*leading; }, &leading_));
  }
  void Resign() override {
    absl::MutexLock lock(&mu_);
    ++resigns_;
    won_ = false;
    leading_ = false;
  }
  void Stop() override {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    leading_ = false;
  }
  absl::Status ElectionError() const override {
    absl::MutexLock lock(&mu_);
    return election_error_;
  }

 private:
  mutable absl::Mutex mu_;
  bool won_ ABSL_GUARDED_BY(mu_) = false;
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  int campaigns_ ABSL_GUARDED_BY(mu_) = 0;
  int resigns_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<LeaderInfo> other_ ABSL_GUARDED_BY(mu_);
  absl::Status election_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_STATE_FAKE_LEADERSHIP_H_
