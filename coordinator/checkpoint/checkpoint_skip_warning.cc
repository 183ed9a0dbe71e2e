#include "coordinator/checkpoint/checkpoint_skip_warning.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

int64_t SkippedIn(const v1::Metrics& metrics) {
  auto it = metrics.values().find(kCheckpointsSkippedUnreachable);
  return it == metrics.values().end() ? 0 : static_cast<int64_t>(it->second);
}

}  // namespace

std::optional<v1::JobEvent> SkippedCheckpointsWarning(const v1::Metrics& before,
                                                      const v1::Metrics& now, int rank) {
  const int64_t total = SkippedIn(now);
  const int64_t more = total - SkippedIn(before);
  if (more <= 0) return std::nullopt;
  v1::JobEvent event;
  event.set_message(
      absl::StrCat("warning: rank ", rank, " skipped ", more, " checkpoint(s) by step ", now.step(),
                   ": it could not reach the coordinator to store them (was it restarting?) within "
                   "checkpoint.unreachable_retry_seconds; training went on (",
                   kCheckpointsSkippedUnreachable, " ", total, " so far)"));
  return event;
}

}  // namespace chorus
