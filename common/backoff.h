// Backoff: the delays between the attempts of one retry loop, growing
// exponentially from `initial` by `multiplier` up to `max`, each one drawn
// at random from the upper part of its window (Note [Backoff] in
// backoff.cc for why and which part). Reset() after a success starts over
// from `initial`.
//
// Thread-safety: none; one Backoff belongs to one loop.
//
// Example:
//   Backoff backoff({.initial = absl::Milliseconds(100), .max = absl::Seconds(1)});
//   while (!Connect().ok()) {
//     if (absl::Now() >= deadline) return timed_out;
//     absl::SleepFor(backoff.NextWithin(deadline));
//   }
//   backoff.Reset();
#ifndef CHORUS_COMMON_BACKOFF_H_
#define CHORUS_COMMON_BACKOFF_H_

#include <cstdint>
#include <random>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace chorus {

struct BackoffOptions {
  // The ceiling of the first delay; each later one's is `multiplier` times
  // the one before, up to `max`.
  absl::Duration initial = absl::Milliseconds(100);
  absl::Duration max = absl::Seconds(1);
  double multiplier = 2.0;  // >= 1
  // The share of each ceiling that is random: a delay is drawn uniformly
  // from [(1 - jitter) * ceiling, ceiling]. 0.5 is "equal jitter"
  // (Note [Backoff]); 0 gives the exact ceilings (tests that count time).
  double jitter = 0.5;  // in [0, 1]
};

// INVALID_ARGUMENT naming the field when an option is out of range.
absl::Status ValidateBackoffOptions(const BackoffOptions& options);

class Backoff {
 public:
  // Seeded from the process's entropy (so that processes started together
  // draw different delays). REQUIRES: ValidateBackoffOptions(options).ok().
  explicit Backoff(BackoffOptions options);
  // Seeded with `seed`: the same seed gives the same delays (tests).
  Backoff(BackoffOptions options, uint64_t seed);

  // The delay before the next attempt; the ceiling grows afterwards.
  absl::Duration Next();
  // Next(), cut at the time left before `deadline` (never negative).
  absl::Duration NextWithin(absl::Time deadline, absl::Time now = absl::Now());
  // The ceiling the next delay is drawn under.
  absl::Duration ceiling() const { return ceiling_; }
  // Delays handed out since construction or the last Reset().
  int retries() const { return retries_; }
  // After a success: the next delay is drawn under `initial` again.
  void Reset();

  const BackoffOptions& options() const { return options_; }

 private:
  BackoffOptions options_;
  std::mt19937_64 random_;
  absl::Duration ceiling_;
  int retries_ = 0;
};

}  // namespace chorus

#endif  // CHORUS_COMMON_BACKOFF_H_
