#include "coordinator/scheduling/log_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/output_limits.h"

namespace chorus {

void LogStore::Append(const std::string& job_id, int rank, int slot, const std::string& agent_id,
                      int64_t time_us, const std::vector<std::string>& lines) {
  absl::MutexLock lock(&mu_);
  JobLogs& logs = jobs_[job_id];
  auto add = [&](std::string text) {
    v1::LogLine& line = logs.lines.emplace_back();
    line.set_seq(logs.next_seq++);
    line.set_rank(rank);
    line.set_slot(slot);
    line.set_agent_id(agent_id);
    line.set_time_us(time_us);
    line.set_text(std::move(text));
    logs.bytes += Cost(line);
    total_bytes_ += Cost(line);
  };
  const size_t kept = std::min(lines.size(), kMaxLogBatchLines);
  for (size_t i = 0; i < kept; ++i) add(BoundReceivedLine(lines[i]));
  if (kept < lines.size()) {
    add(absl::StrCat("[", lines.size() - kept, " more lines of this batch dropped: an agent sends ",
                     "at most ", kMaxLogBatchLines, " at once]"));
  }
  while (logs.lines.size() > 1 &&
         (logs.lines.size() > max_lines_per_job_ || logs.bytes > max_bytes_per_job_)) {
    DropOldest(logs);
  }
  // Job ids grow with submission order, so the first entries are the oldest:
  // they go first, by count and then by the bytes of all jobs together.
  auto evict_oldest = [this] ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    total_bytes_ -= jobs_.begin()->second.bytes;
    jobs_.erase(jobs_.begin());
  };
  while (jobs_.size() > max_jobs_) evict_oldest();
  while (total_bytes_ > max_total_bytes_ && jobs_.size() > 1 && jobs_.begin()->first != job_id) {
    evict_oldest();
  }
  while (total_bytes_ > max_total_bytes_ && logs.lines.size() > 1) DropOldest(logs);
}

void LogStore::DropOldest(JobLogs& logs) {
  const size_t cost = Cost(logs.lines.front());
  logs.bytes -= cost;
  total_bytes_ -= cost;
  logs.lines.pop_front();
  ++logs.dropped;
}

v1::GetLogsResponse LogStore::Get(const v1::GetLogsRequest& request) const {
  v1::GetLogsResponse response;
  response.set_next_seq(request.after_seq());
  const size_t max_lines = request.max_lines() > 0 ? request.max_lines() : kDefaultMaxLines;
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(request.job_id());
  if (it == jobs_.end()) return response;
  const JobLogs& logs = it->second;
  response.set_dropped(logs.dropped);
  // Lines are in seq order: find the first one after after_seq.
  auto first =
      std::upper_bound(logs.lines.begin(), logs.lines.end(), request.after_seq(),
                       [](int64_t seq, const v1::LogLine& line) { return seq < line.seq(); });
  std::vector<const v1::LogLine*> matches;
  for (auto line = first; line != logs.lines.end(); ++line) {
    if (request.has_rank() && line->rank() != request.rank()) continue;
    matches.push_back(&*line);
  }
  size_t begin = 0, end = matches.size();
  if (matches.size() > max_lines) {
    if (request.tail()) {
      begin = matches.size() - max_lines;
    } else {
      end = max_lines;
    }
  }
  for (size_t i = begin; i < end; ++i) *response.add_lines() = *matches[i];
  // After a tail or a full read, the reader continues after the newest line
  // seen; after a page cut short, after the last line returned.
  if (end < matches.size()) {
    response.set_next_seq(matches[end - 1]->seq());
  } else if (!logs.lines.empty()) {
    response.set_next_seq(std::max(request.after_seq(), logs.lines.back().seq()));
  }
  return response;
}

}  // namespace chorus
