#include "common/retry.h"

#include <algorithm>

namespace chorus {

bool IsTransient(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
}

absl::Duration BackoffBefore(const RetryOptions& options, int retry) {
  absl::Duration backoff = options.initial_backoff;
  for (int i = 1; i < retry && backoff < options.max_backoff; ++i) backoff *= options.multiplier;
  return std::min(backoff, options.max_backoff);
}

BackoffOptions ToBackoffOptions(const RetryOptions& options) {
  BackoffOptions backoff;
  backoff.initial = options.initial_backoff;
  backoff.max = std::max(options.max_backoff, options.initial_backoff);
  backoff.multiplier = options.multiplier;
  backoff.jitter = options.jitter;
  return backoff;
}

absl::Status Retry(const RetryOptions& options,
                   absl::FunctionRef<absl::Status(absl::Time attempt_deadline)> attempt) {
  RealClock real;
  Clock& clock = options.clock != nullptr ? *options.clock : real;
  const absl::Time deadline = clock.Now() + options.deadline;
  Backoff backoff(ToBackoffOptions(options));
  absl::Status status;
  for (int n = 1;; ++n) {
    status = attempt(std::min(deadline, clock.Now() + options.attempt_timeout));
    if (status.ok() || !options.retryable(status)) return status;
    if (options.max_attempts > 0 && n >= options.max_attempts) return status;
    const absl::Duration left = deadline - clock.Now();
    if (left <= absl::ZeroDuration()) return status;
    clock.SleepFor(std::min(backoff.Next(), left));
    if (clock.Now() >= deadline) return status;
  }
}

}  // namespace chorus
