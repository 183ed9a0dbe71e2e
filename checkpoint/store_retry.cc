#include "checkpoint/store_retry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/backoff.h"
#include "glog/logging.h"

namespace chorus {

bool IsCoordinatorUnreachable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsCancelled(status);
}

StoreRetryResult StoreRetrying(CheckpointStorage& storage, int64_t step,
                               const std::vector<CheckpointFileSource>& files,
                               const StoreRetryOptions& options) {
  RealClock real;
  Clock& clock = options.clock != nullptr ? *options.clock : real;
  StoreRetryResult result;
  result.status = storage.Store(step, files);
  result.attempts = 1;
  if (result.status.ok() || !IsCoordinatorUnreachable(result.status)) return result;
  const absl::Time first_failure = clock.Now();
  const absl::Time give_up = first_failure + options.give_up_after;
  if (options.give_up_after > absl::ZeroDuration()) {
    LOG(WARNING) << "checkpoint step " << step << ": " << result.status.message()
                 << "; trying again for up to " << absl::FormatDuration(options.give_up_after);
  }
  BackoffOptions delays;
  delays.initial = options.initial_backoff;
  delays.max = std::max(options.max_backoff, options.initial_backoff);
  delays.jitter = options.jitter;
  Backoff backoff(delays);
  while (true) {
    const absl::Duration left = give_up - clock.Now();
    if (left <= absl::ZeroDuration()) break;
    clock.SleepFor(std::min(backoff.Next(), left));
    const absl::Status s = storage.Store(step, files);
    ++result.attempts;
    if (absl::IsAlreadyExists(s)) {
      // An earlier attempt was committed; its answer was lost with the
      // connection.
      LOG(INFO) << "checkpoint step " << step << " was committed by an earlier attempt ("
                << s.message() << ")";
      result.status = absl::OkStatus();
      return result;
    }
    result.status = s;
    if (s.ok()) {
      LOG(INFO) << "checkpoint step " << step << " stored at attempt " << result.attempts
                << ", after the coordinator was unreachable for "
                << absl::FormatDuration(clock.Now() - first_failure);
      return result;
    }
    if (!IsCoordinatorUnreachable(s)) return result;
  }
  result.gave_up_unreachable = true;
  result.status = absl::Status(
      result.status.code(),
      absl::StrCat(result.status.message(), " (the coordinator could not be reached for ",
                   absl::FormatDuration(clock.Now() - first_failure), ", ", result.attempts,
                   " attempt(s))"));
  return result;
}

}  // namespace chorus
