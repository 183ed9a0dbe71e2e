// JobRecords: the durable writes the Scheduler makes about a job, each added
// to the call's batch of writes (JobWrites::Batch), which runs them in the
// job's order once the scheduler's lock is released (Note [The scheduler's
// writes after its lock] in call_outbox.h). A write the state store refuses
// is logged with what it would have recorded: the scheduler goes on from
// what it holds in memory, and a write refused by etcd's fence has already
// ended this coordinator's term (EtcdStateStoreOptions::on_fenced).
// A job's end, cancellation and re-queue first take its `report_writes`
// mutex, so that a report accepted before them is written before them (Note
// [Reports are written outside the scheduler's lock] in rank_messages.h).
//
// Thread-safety: const methods that only add to `writes`; the writes call
// JobManager, which is thread-safe.
//
// Example:
//   JobRecords records(jobs);
//   JobWrites::Batch writes(order);
//   records.Event(writes, "job-000001", event);
//   writes.Run();
#ifndef CHORUS_COORDINATOR_SCHEDULING_JOB_RECORDS_H_
#define CHORUS_COORDINATOR_SCHEDULING_JOB_RECORDS_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/state/elastic_record.pb.h"
#include "coordinator/state/job_manager.h"
#include "coordinator/state/job_writes.h"

namespace chorus {

class JobRecords {
 public:
  // `jobs` must outlive the writes.
  explicit JobRecords(JobManager& jobs) : jobs_(jobs) {}

  // The job is RUNNING as generation 1 of `world` ranks at `placements`;
  // `recorded` is set once it is (the placements are saved after).
  void Started(JobWrites::Batch& writes, const std::string& job_id, int world,
               std::vector<v1::RankPlacement> placements, std::shared_ptr<bool> recorded) const;
  // The running job ended in `state` with `reason`.
  void Ended(JobWrites::Batch& writes, const std::string& job_id, v1::Job::State state,
             const std::string& reason, std::shared_ptr<std::mutex> report_writes) const;
  // A job with no running ranks here FAILED with `reason`.
  void Failed(JobWrites::Batch& writes, const std::string& job_id,
              const std::string& reason) const;
  // The job is CANCELLED with `reason`; `result` (which must outlive the
  // write) gets the job or why not. `report_writes` is null for a job not
  // running here.
  void Cancelled(JobWrites::Batch& writes, const std::string& job_id, const std::string& reason,
                 std::shared_ptr<std::mutex> report_writes,
                 absl::StatusOr<v1::Job>* result) const;
  // Appends `event` to the job's history.
  void Event(JobWrites::Batch& writes, const std::string& job_id, v1::JobEvent event) const;
  // The elastic job formed generation `generation` of `world` ranks after
  // `restarts` restarts (`change` is its history line), at `placements`.
  void Reformed(JobWrites::Batch& writes, const std::string& job_id, int64_t generation, int world,
                int restarts, const std::string& change,
                std::vector<v1::RankPlacement> placements) const;
  // What a restart needs to take the elastic job back (Note [Elastic
  // restart] in job_recovery.h).
  void Elastic(JobWrites::Batch& writes, const std::string& job_id,
               coordinator::ElasticRecord record) const;
  // The job is PENDING again with `reason`, resuming from its own newest
  // checkpoint when `resume_step` > 0; `requeued` (which must outlive the
  // write) is set once it is.
  void Requeued(JobWrites::Batch& writes, const std::string& job_id, int64_t resume_step,
                const std::string& reason, std::shared_ptr<std::mutex> report_writes,
                bool* requeued) const;

  // Written at once, not in a batch (Note [Reports are written outside the
  // scheduler's lock] in rank_messages.h):
  //
  // Rank 0's report, `metrics` as RecordReport completed them, in a job that
  // runs a `program` or not: they become the job's latest (persisted when
  // final) with an event, and a warning event when they count more
  // checkpoints skipped as unreachable. A final report without metrics
  // keeps the latest ones; a program job's carries at most the progress of
  // its program's newest record, laid over what the program reported along
  // the way.
  absl::Status Report(const v1::ReportRequest& report, const v1::Metrics& metrics,
                      bool program) const;
  // A program job's rank 0 heartbeat moves the job's latest metrics forward
  // to its progress (WithProgress), in memory only: its final report
  // persists them.
  void Progress(const v1::RankHeartbeat& heartbeat) const;

 private:
  JobManager& jobs_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_JOB_RECORDS_H_
