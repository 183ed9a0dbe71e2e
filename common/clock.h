// Clock: the source of time for everything that times out or measures.
//
// Components take a Clock& (or Clock*) through their constructor or options so
// tests can drive time with FakeClock instead of sleeping.
//
// Thread-safety: both implementations are safe to use from many threads.
//
// Example:
//   RealClock clock;
//   absl::Time deadline = clock.Now() + absl::Seconds(5);
//   ...
//   FakeClock fake(absl::FromUnixSeconds(1000));
//   fake.Advance(absl::Seconds(6));   // a 5 s timeout has now expired
#ifndef CHORUS_COMMON_CLOCK_H_
#define CHORUS_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace chorus {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  // Blocks the caller for `d` of this clock's time.
  virtual void SleepFor(absl::Duration d) = 0;
  // Waits until `cond` holds (re-checked whenever `mu` is released by a
  // writer) or this clock reaches `deadline`. Returns whether `cond` holds.
  // REQUIRES: `mu` is held.
  virtual bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
};

// Wall-clock time.
class RealClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond, absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu.AwaitWithDeadline(cond, deadline);
  }
};

// Time that moves only when told to. SleepFor advances it (so code under test
// that sleeps makes progress without real waiting); AwaitWithDeadline returns
// false as soon as the fake time has reached the deadline, and otherwise polls
// in short real-time slices so that another thread's Advance() is noticed.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void SleepFor(absl::Duration d) override { Advance(d); }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  void SetTime(absl::Time t) {
    absl::MutexLock lock(&mu_);
    now_ = t;
  }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond, absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (true) {
      if (cond.Eval()) return true;
      if (Now() >= deadline) return false;
      // Releases `mu` while waiting so writers can make `cond` true.
      if (mu.AwaitWithTimeout(cond, absl::Milliseconds(1))) return true;
    }
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_COMMON_CLOCK_H_
