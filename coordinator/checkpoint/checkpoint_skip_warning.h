// The job event that tells users a rank skipped checkpoints because it
// could not reach the coordinator (checkpoint.unreachable_retry_seconds ran
// out while the coordinator was away, e.g. restarting). The rank cannot say
// so while the coordinator is away; it counts them in its metrics
// (checkpoints_skipped_unreachable, cumulative), and the coordinator turns an
// increase into a warning event when the rank's next report arrives.
//
// Thread-safety: a pure function.
//
// Example:
//   if (std::optional<v1::JobEvent> warning =
//           SkippedCheckpointsWarning(job.latest_metrics(), report.metrics(), report.rank()))
//     jobs.AddEvent(job.job_id(), *std::move(warning));
#ifndef CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_SKIP_WARNING_H_
#define CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_SKIP_WARNING_H_

#include <optional>

#include "chorus/v1/coordinator.pb.h"

namespace chorus {

// The metric a rank counts its skipped checkpoints in.
inline constexpr char kCheckpointsSkippedUnreachable[] = "checkpoints_skipped_unreachable";

// A warning (message event) when `now`, rank `rank`'s metrics, counts more
// checkpoints skipped as unreachable than `before` (the job's metrics as last
// reported); else nothing.
std::optional<v1::JobEvent> SkippedCheckpointsWarning(const v1::Metrics& before,
                                                      const v1::Metrics& now, int rank);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_SKIP_WARNING_H_
