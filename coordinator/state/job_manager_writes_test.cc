// Note [Durable writes outside the lock] in job_manager.h: a job's slow
// durable write holds up neither reads nor other jobs' writes, and one job's
// writes stay in order.
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "coordinator/state/job_manager.h"
#include "coordinator/state/slow_state_store.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

// Long enough that what the tests do meanwhile (a few SQLite commits) ends
// well within it on a loaded machine; each such call is checked to return
// while the slow write is still going on.
constexpr absl::Duration kSlowWrite = absl::Seconds(3);

class JobManagerWritesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sqlite = StateStore::Open(std::string(std::getenv("TEST_TMPDIR")) + "/" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(sqlite.ok()) << sqlite.status();
    state_ = std::make_unique<SlowStateStore>(*std::move(sqlite), kSlowWrite);
    auto jobs = JobManager::Create(*state_, nullptr);
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    jobs_ = *std::move(jobs);
  }

  std::string Submit(const std::string& name) {
    auto spec =
        ParseJobSpec(absl::StrCat("name: '", name, "' model { mlp {} } data { synthetic {} }"),
                     SpecFormat::kTextProto, "test");
    EXPECT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<v1::Job> job = jobs_->Submit(*spec, "");
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->job_id() : "";
  }

  // Whether the slow write was still going on when `call` returned.
  template <typename Call>
  bool Meanwhile(Call call) {
    call();
    return state_->slow_writes_done() == 0;
  }

  std::unique_ptr<SlowStateStore> state_;
  std::unique_ptr<JobManager> jobs_;
};

TEST_F(JobManagerWritesTest, ASlowWriteHoldsUpNeitherReadsNorOtherJobs) {
  const std::string slow = Submit("slow");
  const std::string other = Submit("other");
  state_->SlowDown(slow);
  absl::StatusOr<v1::Job> cancelled;
  std::thread writer([&] { cancelled = jobs_->Cancel(slow, "stopped by a test"); });
  state_->slow_write_began().WaitForNotification();

  // While the cancellation is being written: reads of both jobs, the other
  // job's heartbeat metrics, events and state changes, a new submission.
  absl::StatusOr<v1::Job> read_slow;
  EXPECT_TRUE(Meanwhile([&] { read_slow = jobs_->Get(slow); }));
  ASSERT_TRUE(read_slow.ok());
  EXPECT_EQ(read_slow->state(), v1::Job::PENDING) << "shown before it is durable";
  EXPECT_TRUE(Meanwhile([&] { EXPECT_TRUE(jobs_->Get(other).ok()); }));
  EXPECT_TRUE(Meanwhile([&] { EXPECT_TRUE(jobs_->List({}, 0).ok()); }));
  EXPECT_TRUE(Meanwhile([&] { EXPECT_EQ(jobs_->PendingJobIds().size(), 2u); }));
  v1::Metrics metrics;
  metrics.set_step(7);
  EXPECT_TRUE(Meanwhile([&] { EXPECT_TRUE(jobs_->UpdateMetrics(slow, metrics, false).ok()); }))
      << "a heartbeat's metrics wait for no write";
  EXPECT_TRUE(Meanwhile([&] { EXPECT_TRUE(jobs_->UpdateMetrics(other, metrics, true).ok()); }));
  v1::JobEvent event;
  event.set_message("a message");
  EXPECT_TRUE(Meanwhile([&] { EXPECT_TRUE(jobs_->AddEvent(other, event).ok()); }));
  EXPECT_TRUE(Meanwhile([&] { EXPECT_TRUE(jobs_->MarkRunning(other, 1, 2).ok()); }));
  std::string third;
  EXPECT_TRUE(Meanwhile([&] { third = Submit("third"); }));
  EXPECT_EQ(third, "job-000003");

  writer.join();
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(state_->slow_writes_done(), 1);
  absl::StatusOr<v1::Job> after = jobs_->Get(slow);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->state(), v1::Job::CANCELLED);
  EXPECT_EQ(after->latest_metrics().step(), 7) << "the metrics set during the write are kept";
  EXPECT_EQ(jobs_->Get(other)->state(), v1::Job::RUNNING);
  EXPECT_EQ(jobs_->Get(other)->latest_metrics().step(), 7);
}

TEST_F(JobManagerWritesTest, OneJobsWritesStayInOrder) {
  const std::string job = Submit("ordered");
  state_->SlowDown(job, 1);
  // The first event's write is slow; the second, posted meanwhile, is not,
  // but waits for the first and takes the next seq.
  v1::JobEvent first;
  first.set_message("first");
  std::thread writer([&] { EXPECT_TRUE(jobs_->AddEvent(job, first).ok()); });
  state_->slow_write_began().WaitForNotification();
  v1::JobEvent second;
  second.set_message("second");
  EXPECT_TRUE(jobs_->AddEvent(job, second).ok());
  EXPECT_EQ(state_->slow_writes_done(), 1) << "the second write of a job waits for its first";
  writer.join();
  absl::StatusOr<std::vector<v1::JobEvent>> events = jobs_->Events(job, 0);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 3u);  // submitted, first, second
  EXPECT_EQ((*events)[1].message(), "first");
  EXPECT_EQ((*events)[1].seq(), 2);
  EXPECT_EQ((*events)[2].message(), "second");
  EXPECT_EQ((*events)[2].seq(), 3);
}

TEST_F(JobManagerWritesTest, ATransitionWaitsForTheSameJobsWriteAndSeesItsResult) {
  const std::string job = Submit("raced");
  state_->SlowDown(job, 1);
  std::thread writer([&] { EXPECT_TRUE(jobs_->Cancel(job, "first").ok()); });
  state_->slow_write_began().WaitForNotification();
  absl::StatusOr<v1::Job> second = jobs_->Finish(job, v1::Job::FAILED, "second");
  EXPECT_EQ(state_->slow_writes_done(), 1) << "the second change waited for the first";
  writer.join();
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_EQ(jobs_->Get(job)->state(), v1::Job::CANCELLED);
}

}  // namespace
}  // namespace chorus
