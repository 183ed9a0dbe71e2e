#include "coordinator/scheduling/job_records.h"

#include <optional>
#include <utility>

#include "common/status_macros.h"
#include "coordinator/checkpoint/checkpoint_skip_warning.h"
#include "coordinator/scheduling/rank_messages.h"
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

absl::Status JobRecords::Report(const v1::ReportRequest& report, const v1::Metrics& metrics,
                                bool program) const {
  if (report.final() && (program || report.metrics().ByteSizeLong() == 0)) {
    ASSIGN_OR_RETURN(v1::Job job, jobs_.Get(report.job_id()));
    v1::Metrics kept = job.latest_metrics();
    const v1::Metrics& last = report.metrics();
    if (last.step() > 0) {
      kept = WithProgress(std::move(kept), last.step(), last.epoch(), last.loss(),
                          last.samples_per_second());
    }
    return jobs_.UpdateMetrics(report.job_id(), kept, /*persist=*/true);
  }
  absl::StatusOr<v1::Job> job = jobs_.Get(report.job_id());
  std::optional<v1::JobEvent> skipped =
      job.ok() ? SkippedCheckpointsWarning(job->latest_metrics(), metrics, report.rank())
               : std::nullopt;
  RETURN_IF_ERROR(jobs_.UpdateMetrics(report.job_id(), metrics, report.final()));
  v1::JobEvent event;
  *event.mutable_metrics() = metrics;
  RETURN_IF_ERROR(jobs_.AddEvent(report.job_id(), std::move(event)));
  if (skipped.has_value()) return jobs_.AddEvent(report.job_id(), *std::move(skipped));
  return absl::OkStatus();
}

void JobRecords::Progress(const v1::RankHeartbeat& heartbeat) const {
  absl::StatusOr<v1::Job> job = jobs_.Get(heartbeat.job_id());
  if (!job.ok() || heartbeat.step() < job->latest_metrics().step()) return;
  // Fails only for a job that is gone.
  jobs_
      .UpdateMetrics(heartbeat.job_id(),
                     WithProgress(job->latest_metrics(), heartbeat.step(), heartbeat.epoch(),
                                  heartbeat.loss(), heartbeat.samples_per_second()),
                     /*persist=*/false)
      .IgnoreError();
}

}  // namespace chorus
