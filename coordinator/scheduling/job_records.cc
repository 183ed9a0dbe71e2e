#include "coordinator/scheduling/job_records.h"

#include <utility>

#include "glog/logging.h"

namespace chorus {

void JobRecords::Started(JobWrites::Batch& writes, const std::string& job_id, int world,
                         std::vector<v1::RankPlacement> placements,
                         std::shared_ptr<bool> recorded) const {
  writes.Add(job_id, [this, job_id, world, recorded, placements = std::move(placements)] {
    absl::StatusOr<v1::Job> started = jobs_.MarkRunning(job_id, 1, world);
    if (!started.ok()) {
      LOG(ERROR) << "cannot start " << job_id << ": " << started.status();
      return;
    }
    *recorded = true;
    if (absl::Status s = jobs_.SavePlacements(job_id, placements); !s.ok()) {
      LOG(ERROR) << job_id << ": could not record placements (a restart would lose the job): " << s;
    }
  });
}

void JobRecords::Ended(JobWrites::Batch& writes, const std::string& job_id, v1::Job::State state,
                       const std::string& reason,
                       std::shared_ptr<std::mutex> report_writes) const {
  writes.Add(job_id, [this, job_id, state, reason, report_writes] {
    std::lock_guard<std::mutex> reports_written(*report_writes);
    absl::StatusOr<v1::Job> ended = jobs_.Finish(job_id, state, reason);
    if (!ended.ok()) LOG(ERROR) << "recording the end of " << job_id << ": " << ended.status();
  });
}

void JobRecords::Failed(JobWrites::Batch& writes, const std::string& job_id,
                        const std::string& reason) const {
  writes.Add(job_id, [this, job_id, reason] {
    absl::StatusOr<v1::Job> ended = jobs_.Finish(job_id, v1::Job::FAILED, reason);
    if (!ended.ok()) {
      LOG(ERROR) << job_id << ": could not record it FAILED (" << reason << "): " << ended.status();
    }
  });
}

void JobRecords::Cancelled(JobWrites::Batch& writes, const std::string& job_id,
                           const std::string& reason, std::shared_ptr<std::mutex> report_writes,
                           absl::StatusOr<v1::Job>* result) const {
  writes.Add(job_id, [this, job_id, reason, report_writes, result] {
    std::unique_lock<std::mutex> reports_written;
    if (report_writes != nullptr) reports_written = std::unique_lock<std::mutex>(*report_writes);
    *result = jobs_.Cancel(job_id, reason);
  });
}

void JobRecords::Event(JobWrites::Batch& writes, const std::string& job_id,
                       v1::JobEvent event) const {
  writes.Add(job_id, [this, job_id, event = std::move(event)]() mutable {
    std::string text = event.message();
    if (text.empty() && event.has_diagnosis()) text = event.diagnosis().message();
    if (absl::Status s = jobs_.AddEvent(job_id, std::move(event)); !s.ok()) {
      LOG(ERROR) << job_id << ": could not record the event \"" << text << "\": " << s;
    }
  });
}

void JobRecords::Reformed(JobWrites::Batch& writes, const std::string& job_id, int64_t generation,
                          int world, int restarts, const std::string& change,
                          std::vector<v1::RankPlacement> placements) const {
  writes.Add(job_id, [this, job_id, generation, world, restarts, change,
                      placements = std::move(placements)] {
    if (absl::StatusOr<v1::Job> s = jobs_.MarkReformed(job_id, generation, world, restarts, change);
        !s.ok()) {
      LOG(ERROR) << job_id << ": could not record generation " << generation << ": " << s.status();
    }
    if (absl::Status s = jobs_.SavePlacements(job_id, placements); !s.ok()) {
      LOG(ERROR) << job_id << ": could not record placements: " << s;
    }
  });
}

void JobRecords::Elastic(JobWrites::Batch& writes, const std::string& job_id,
                         coordinator::ElasticRecord record) const {
  writes.Add(job_id, [this, job_id, record = std::move(record)] {
    if (absl::Status s = jobs_.SaveElasticRecord(job_id, record); !s.ok()) {
      LOG(ERROR) << job_id << ": could not record its elastic state (a restart now would take "
                 << "it back as it was before): " << s;
    }
  });
}

void JobRecords::Requeued(JobWrites::Batch& writes, const std::string& job_id,
                          int64_t resume_step, const std::string& reason,
                          std::shared_ptr<std::mutex> report_writes, bool* requeued) const {
  writes.Add(job_id, [this, job_id, resume_step, reason, report_writes, requeued] {
    std::lock_guard<std::mutex> reports_written(*report_writes);
    absl::StatusOr<v1::Job> queued =
        jobs_.Requeue(job_id, resume_step > 0 ? job_id : std::string(), reason);
    if (!queued.ok()) {
      LOG(ERROR) << job_id << ": could not send it back to the queue: " << queued.status();
      return;
    }
    *requeued = true;
  });
}

}  // namespace chorus
