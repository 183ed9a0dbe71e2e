#include "coordinator/state/job_writes.h"

#include <utility>

namespace chorus {

void JobWrites::Batch::Add(const std::string& job_id, Write write) {
  entries_.push_back(Entry{job_id, order_.Take(job_id), std::move(write)});
}

void JobWrites::Batch::Run() {
  std::vector<Entry> entries = std::move(entries_);
  entries_.clear();
  for (const Entry& entry : entries) order_.RunInTurn(entry.job_id, entry.ticket, entry.write);
}

int64_t JobWrites::Take(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  return ++lanes_[job_id].issued;
}

void JobWrites::RunInTurn(const std::string& job_id, int64_t ticket, const Write& write) {
  {
    absl::MutexLock lock(&mu_);
    // The lane exists: this ticket has not run, so it cannot have gone.
    const Lane& lane = lanes_.at(job_id);
    const auto my_turn = [&lane, ticket] { return lane.done == ticket - 1; };
    mu_.Await(absl::Condition(&my_turn));
  }
  write();
  absl::MutexLock lock(&mu_);
  auto lane = lanes_.find(job_id);
  lane->second.done = ticket;
  if (lane->second.done == lane->second.issued) lanes_.erase(lane);
}

int JobWrites::jobs_in_flight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(lanes_.size());
}

}  // namespace chorus
