// Retry: calls an operation again, with exponential backoff, while it fails
// with a status worth retrying and time is left — for calls to the
// coordinator that must outlive its restart (a rank's final report, say).
//
// Attempt k (k = 1, 2, ...) is preceded by a sleep drawn by a Backoff
// (common/backoff.h, Note [Backoff]) under the ceiling
//   BackoffBefore(options, k - 1) = min(initial_backoff * multiplier^(k-2), max_backoff)
// for k >= 2, from [(1 - jitter) * ceiling, ceiling], cut short at the
// deadline; no attempt starts at or after the deadline.
// Each attempt gets its own deadline: min(now + attempt_timeout, deadline).
//
// Thread-safety: Retry is reentrant; `options.clock` must be usable from the
// calling thread.
//
// Example:
//   RetryOptions retry;
//   retry.deadline = absl::Minutes(1);
//   absl::Status s = Retry(retry, [&](absl::Time attempt_deadline) {
//     grpc::ClientContext context;
//     context.set_deadline(absl::ToChronoTime(attempt_deadline));
//     return FromGrpcStatus(stub.Report(&context, request, &response));
//   });
#ifndef CHORUS_COMMON_RETRY_H_
#define CHORUS_COMMON_RETRY_H_

#include <functional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/backoff.h"
#include "common/clock.h"

namespace chorus {

// UNAVAILABLE (the peer is unreachable or restarting) and DEADLINE_EXCEEDED
// (the attempt ran out of time): failures another attempt may not see.
bool IsTransient(const absl::Status& status);

struct RetryOptions {
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(2);
  double multiplier = 2.0;  // >= 1
  // The random share of each sleep (BackoffOptions::jitter); 0 = exact.
  double jitter = 0.5;
  // Total time for all attempts and sleeps together, from the call.
  absl::Duration deadline = absl::Minutes(1);
  // The most one attempt may take (its deadline is also cut at `deadline`).
  absl::Duration attempt_timeout = absl::Seconds(10);
  // At most this many attempts; 0 = as many as the deadline allows.
  int max_attempts = 0;
  // Which failures are worth another attempt; the rest are final.
  std::function<bool(const absl::Status&)> retryable = IsTransient;
  // Time and sleeping; null = the real clock.
  Clock* clock = nullptr;
};

// The ceiling of the sleep before retry `retry` (1 = before the second
// attempt): the sleep itself when jitter is 0.
// REQUIRES: retry >= 1.
absl::Duration BackoffBefore(const RetryOptions& options, int retry);

// The Backoff whose delays Retry sleeps.
BackoffOptions ToBackoffOptions(const RetryOptions& options);

// Calls `attempt(attempt_deadline)` until it returns OK, a status that is
// not retryable, max_attempts is reached, or the deadline leaves no time for
// another attempt; returns the last attempt's status.
absl::Status Retry(const RetryOptions& options,
                   absl::FunctionRef<absl::Status(absl::Time attempt_deadline)> attempt);

}  // namespace chorus

#endif  // CHORUS_COMMON_RETRY_H_
