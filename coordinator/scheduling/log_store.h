// LogStore: the output lines of each job's rank processes, as the agents
// relay them, kept in memory for `chorus logs`.
//
// Each job keeps its newest `max_lines_per_job` lines and at most
// `max_bytes_per_job` bytes (older ones are counted as dropped); only the
// newest `max_jobs` jobs (by job id) are kept at all, and all of them
// together hold at most `max_total_bytes`: past it the oldest jobs' lines go
// first. Bytes are what a line costs in memory: its text and
// kLineOverheadBytes of bookkeeping (a soak run of 2 MB outputs once held
// 340 MB of 76-byte lines within "8 MiB of text" per job). What an agent sends
// is not trusted (Note [Bounded job output] in common/output_limits.h): a
// line longer than kMaxBoundedLineBytes is cut with a marker, and of one
// Append only the first kMaxLogBatchLines lines are kept, followed by a line
// that says how many were dropped.
// Lines get per-job sequence numbers from 1 so readers can page and follow.
//
// Thread-safety: all methods may be called concurrently.
//
// Example:
//   LogStore logs;
//   logs.Append("job-000001", /*rank=*/0, /*slot=*/0, "agent-1", now_us, {"step 10 loss 0.5"});
//   v1::GetLogsResponse r = logs.Get(request);
#ifndef CHORUS_COORDINATOR_SCHEDULING_LOG_STORE_H_
#define CHORUS_COORDINATOR_SCHEDULING_LOG_STORE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/coordinator.pb.h"

namespace chorus {

class LogStore {
 public:
  // Lines one Get returns when the request does not say.
  static constexpr int kDefaultMaxLines = 10000;
  // What a kept line costs besides its text (its LogLine, its deque slot
  // and the string's heap block), measured with 76-byte lines.
  static constexpr size_t kLineOverheadBytes = 160;

  explicit LogStore(size_t max_lines_per_job = 20000, size_t max_jobs = 64,
                    size_t max_bytes_per_job = 8 << 20, size_t max_total_bytes = 64 << 20)
      : max_lines_per_job_(max_lines_per_job),
        max_jobs_(max_jobs),
        max_bytes_per_job_(max_bytes_per_job),
        max_total_bytes_(max_total_bytes) {}

  void Append(const std::string& job_id, int rank, int slot, const std::string& agent_id,
              int64_t time_us, const std::vector<std::string>& lines);
  // Lines of request.job_id per the request; `complete` is left false (the
  // caller knows whether the job can still write). An unknown job gives an
  // empty answer: it may not have written anything yet.
  v1::GetLogsResponse Get(const v1::GetLogsRequest& request) const;

 private:
  struct JobLogs {
    std::deque<v1::LogLine> lines;
    int64_t next_seq = 1;
    int64_t dropped = 0;
    size_t bytes = 0;  // the lines' cost (text + kLineOverheadBytes each)
  };

  static size_t Cost(const v1::LogLine& line) { return line.text().size() + kLineOverheadBytes; }
  // Drops `logs`' oldest line, counting it.
  void DropOldest(JobLogs& logs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_lines_per_job_;
  const size_t max_jobs_;
  const size_t max_bytes_per_job_;
  const size_t max_total_bytes_;
  mutable absl::Mutex mu_;
  std::map<std::string, JobLogs> jobs_ ABSL_GUARDED_BY(mu_);
  size_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // of every job
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_LOG_STORE_H_
