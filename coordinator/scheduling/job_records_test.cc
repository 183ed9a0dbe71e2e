#include "coordinator/scheduling/job_records.h"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/job_spec.h"
#include "coordinator/state/state_store.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

// Each write, run as a call's batch runs it, records what it says in the
// job's record; a write the store refuses changes nothing and is logged.
class JobRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = *StateStore::Open(std::string(std::getenv("TEST_TMPDIR")) + "/records");
    jobs_ = *JobManager::Create(*store_, &clock_);
  }

  std::string Submit() {
    absl::StatusOr<v1::JobSpec> spec =
        ParseJobSpec("model { mlp {} } data { synthetic {} } resources { max_ranks: 2 }",
                     SpecFormat::kTextProto, "test");
    EXPECT_TRUE(spec.ok()) << spec.status();
    return jobs_->Submit(*spec, "", "ann")->job_id();
  }

  std::vector<v1::RankPlacement> Placements(int ranks) {
    std::vector<v1::RankPlacement> placements;
    for (int rank = 0; rank < ranks; ++rank) {
      v1::RankPlacement& p = placements.emplace_back();
      p.set_host("node-a");
      p.set_slot(rank);
    }
    return placements;
  }

  std::vector<std::string> Events(const std::string& job_id) {
    std::vector<std::string> texts;
    absl::StatusOr<std::vector<v1::JobEvent>> events = jobs_->Events(job_id, 0);
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok()) return texts;
    for (const v1::JobEvent& e : *events) {
      if (!e.message().empty()) texts.push_back(e.message());
    }
    return texts;
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<JobManager> jobs_;
  JobWrites order_;
};

TEST_F(JobRecordsTest, EachWriteRecordsItsChange) {
  const JobRecords records(*jobs_);
  const std::string job_id = Submit();
  auto recorded = std::make_shared<bool>(false);
  {
    JobWrites::Batch writes(order_);
    records.Started(writes, job_id, 2, Placements(2), recorded);
    v1::JobEvent event;
    event.set_message("generation 2 will form at the next step boundary");
    records.Event(writes, job_id, event);
    EXPECT_FALSE(*recorded);  // nothing runs before the batch does
    writes.Run();
  }
  EXPECT_TRUE(*recorded);
  v1::Job job = *jobs_->Get(job_id);
  EXPECT_EQ(job.state(), v1::Job::RUNNING);
  EXPECT_EQ(job.placements_size(), 2);
  EXPECT_EQ(job.world_size(), 2);
  EXPECT_EQ(Events(job_id),
            std::vector<std::string>{"generation 2 will form at the next step boundary"});

  {
    JobWrites::Batch writes(order_);
    records.Reformed(writes, job_id, 2, 3, 1, "generation 2 after rank 1 exited", Placements(3));
    coordinator::ElasticRecord record;
    record.set_generation(2);
    records.Elastic(writes, job_id, record);
    writes.Run();
  }
  job = *jobs_->Get(job_id);
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.world_size(), 3);
  EXPECT_EQ(job.placements_size(), 3);
  EXPECT_EQ(jobs_->LoadElasticRecord(job_id)->generation(), 2);

  // A re-queue waits for the reports accepted before it.
  auto report_writes = std::make_shared<std::mutex>();
  bool requeued = false;
  {
    JobWrites::Batch writes(order_);
    records.Requeued(writes, job_id, /*resume_step=*/120, "preempted by job-000009", report_writes,
                     &requeued);
    writes.Run();
  }
  EXPECT_TRUE(requeued);
  job = *jobs_->Get(job_id);
  EXPECT_EQ(job.state(), v1::Job::PENDING);
  EXPECT_EQ(job.resume_from(), job_id);
  EXPECT_EQ(job.reason(), "preempted by job-000009");
}

TEST_F(JobRecordsTest, EndsFailuresAndCancellations) {
  const JobRecords records(*jobs_);
  const std::string running = Submit();
  const std::string queued = Submit();
  const std::string cancelled = Submit();
  absl::StatusOr<v1::Job> cancel = absl::UnknownError("not run");
  {
    JobWrites::Batch writes(order_);
    records.Started(writes, running, 1, Placements(1), std::make_shared<bool>(false));
    records.Ended(writes, running, v1::Job::FAILED, "rank 0 exited with code 3",
                  std::make_shared<std::mutex>());
    records.Failed(writes, queued, "cannot resume from job-000042: no checkpoint");
    records.Cancelled(writes, cancelled, "by ann", nullptr, &cancel);
    writes.Run();
  }
  EXPECT_EQ(jobs_->Get(running)->state(), v1::Job::FAILED);
  EXPECT_EQ(jobs_->Get(running)->reason(), "rank 0 exited with code 3");
  EXPECT_EQ(jobs_->Get(queued)->state(), v1::Job::FAILED);
  EXPECT_EQ(jobs_->Get(queued)->reason(), "cannot resume from job-000042: no checkpoint");
  ASSERT_TRUE(cancel.ok()) << cancel.status();
  EXPECT_EQ(cancel->state(), v1::Job::CANCELLED);
  EXPECT_EQ(jobs_->Get(cancelled)->state(), v1::Job::CANCELLED);
}

TEST_F(JobRecordsTest, ARefusedWriteChangesNothing) {
  const JobRecords records(*jobs_);
  auto recorded = std::make_shared<bool>(false);
  bool requeued = false;
  absl::StatusOr<v1::Job> cancel = absl::UnknownError("not run");
  {
    JobWrites::Batch writes(order_);
    records.Started(writes, "job-000404", 1, Placements(1), recorded);
    records.Requeued(writes, "job-000404", 0, "preempted", std::make_shared<std::mutex>(),
                     &requeued);
    records.Cancelled(writes, "job-000404", "by ann", nullptr, &cancel);
    v1::JobEvent event;
    event.set_message("lost");
    records.Event(writes, "job-000404", event);
    writes.Run();
  }
  EXPECT_FALSE(*recorded);  // its launches are not sent
  EXPECT_FALSE(requeued);   // nothing to place
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kNotFound);
}

// Rank 0's reports become the job's metrics with an event; a final one
// without metrics keeps them; a program's final one lays its progress over
// what the program reported; a program's heartbeat moves them forward only.
TEST_F(JobRecordsTest, ReportsAndProgressMoveTheJobsMetrics) {
  const JobRecords records(*jobs_);
  const std::string job_id = Submit();
  v1::ReportRequest report;
  report.set_job_id(job_id);
  v1::Metrics metrics;
  metrics.set_step(20);
  metrics.set_loss(0.75);
  (*metrics.mutable_values())["checkpoints_skipped_unreachable"] = 1;
  *report.mutable_metrics() = metrics;
  ASSERT_TRUE(records.Report(report, metrics, /*program=*/false).ok());
  EXPECT_EQ(jobs_->Get(job_id)->latest_metrics().step(), 20);
  absl::StatusOr<std::vector<v1::JobEvent>> events = jobs_->Events(job_id, 0);
  ASSERT_TRUE(events.ok());
  int with_metrics = 0;
  int warnings = 0;
  for (const v1::JobEvent& e : *events) {
    with_metrics += e.has_metrics();
    warnings += e.message().find("skipped") != std::string::npos;
  }
  EXPECT_EQ(with_metrics, 1);
  EXPECT_EQ(warnings, 1);

  v1::ReportRequest final_report;
  final_report.set_job_id(job_id);
  final_report.set_final(true);  // no metrics: the latest stay
  ASSERT_TRUE(records.Report(final_report, v1::Metrics(), /*program=*/false).ok());
  EXPECT_EQ(jobs_->Get(job_id)->latest_metrics().loss(), 0.75);

  v1::RankHeartbeat heartbeat;
  heartbeat.set_job_id(job_id);
  heartbeat.set_step(30);
  heartbeat.set_epoch(2);
  records.Progress(heartbeat);
  EXPECT_EQ(jobs_->Get(job_id)->latest_metrics().step(), 30);
  EXPECT_EQ(jobs_->Get(job_id)->latest_metrics().loss(), 0.75);
  heartbeat.set_step(25);  // behind: ignored
  records.Progress(heartbeat);
  EXPECT_EQ(jobs_->Get(job_id)->latest_metrics().step(), 30);

  final_report.mutable_metrics()->set_step(35);  // a program's newest record
  final_report.mutable_metrics()->set_samples_per_second(12);
  ASSERT_TRUE(records.Report(final_report, final_report.metrics(), /*program=*/true).ok());
  const v1::Metrics kept = jobs_->Get(job_id)->latest_metrics();
  EXPECT_EQ(kept.step(), 35);
  EXPECT_EQ(kept.loss(), 0.75);
  EXPECT_EQ(kept.samples_per_second(), 12);
}

}  // namespace
}  // namespace chorus
