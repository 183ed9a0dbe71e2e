// The status page's data and HTML: the job list and one job's page (rank
// table with diagnoses, loss / accuracy / throughput history, events
// (states, generations, diagnoses), checkpoints, last log lines), as JSON
// for the page's live refresh and as HTML shells that carry the first data
// inline, so the page is whole on load and works with no network (the
// charting library and the page's script are served from the binary).
//
// Thread-safety: plain functions; they read the job manager, the scheduler
// and the checkpoint store under their own locks.
//
// Example:
//   absl::StatusOr<std::string> json = JobPageJson(sources, "job-000001", absl::Now());
//   if (absl::IsNotFound(json.status())) ... 404
#ifndef CHORUS_COORDINATOR_HTTP_STATUS_PAGE_H_
#define CHORUS_COORDINATOR_HTTP_STATUS_PAGE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint/checkpoint_store.h"
#include "coordinator/scheduling/scheduler.h"
#include "coordinator/state/job_manager.h"

namespace chorus {

struct StatusPageSources {
  JobManager* jobs = nullptr;
  const Scheduler* scheduler = nullptr;
  CheckpointStore* checkpoints = nullptr;  // may be null: no checkpoint history
};

// Most jobs the list shows (newest first) and most history points, events
// and log lines a job page carries.
inline constexpr int kPageMaxJobs = 200;
inline constexpr int kPageMaxHistory = 500;
inline constexpr int kPageMaxEvents = 100;
inline constexpr int kPageMaxLogLines = 30;

// {"jobs": [{"job_id", "name", "owner", "state", "step", "total_steps",
// "progress", "eta_seconds", "age_seconds", "samples_per_second",
// "world_size", "diagnoses", "reason"}...],
//  "queue": [{"position", "job_id", "name", "owner", "priority", "min_ranks",
//  "device", "reason", "holds_reservation"}...] (placement order, at most
//  kPageMaxJobs),
//  "users": [{"user", "slots": {DEVICE: n}, "running_jobs", "queued_jobs",
//  "fair_share_slot_seconds"}...] (every user; "" the anonymous one)}
std::string JobListJson(const StatusPageSources& sources, absl::Time now);

// {"status": JobStatus (proto JSON, field names as in the proto),
//  "history": [{"step", "time_s", "loss", "eval_loss", "eval_accuracy",
//               "samples_per_second"}...],
//  "events": [{"time_s", "text"}...], "checkpoints": [{"step", "time_s",
//  "bytes"}...], "logs": [{"rank", "text"}...]}. The status's rank rows are
//  `rank_limit` from `rank_offset` (and the ranks a diagnosis names);
//  status.rank_summary counts them all. NOT_FOUND for an unknown job.
absl::StatusOr<std::string> JobPageJson(const StatusPageSources& sources, const std::string& job_id,
                                        absl::Time now, int rank_offset = 0,
                                        int rank_limit = kDefaultStatusRankRows);

// HTML of the job list and of a job's page, `json` (from the functions above)
// embedded as their first data.
std::string JobListHtml(absl::string_view json);
std::string JobPageHtml(const std::string& job_id, absl::string_view json);
// A 404 page naming what is missing.
std::string NotFoundHtml(absl::string_view what);

// The embedded assets (status_page_assets.cc, generated from the files).
extern const char kStatusPageJs[];
extern const char kStatusPageCss[];
extern const char kUplotJs[];
extern const char kUplotCss[];

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_HTTP_STATUS_PAGE_H_
