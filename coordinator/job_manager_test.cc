#include "coordinator/job_manager.h"

#include <cstdlib>

#include "common/job_spec.h"
#include "common/output_limits.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Dir(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

v1::JobSpec Spec(const std::string& text) {
  auto spec = ParseJobSpec(text, SpecFormat::kTextProto, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(JobManagerTest, SubmitListCancelAndSurviveReopen) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  std::string first_id;
  {
    auto state = StateStore::Open(Dir("reopen"));
    ASSERT_TRUE(state.ok()) << state.status();
    auto jobs = JobManager::Create(**state, &clock);
    ASSERT_TRUE(jobs.ok());
    auto a = (*jobs)->Submit(Spec("name: 'a' model { mlp {} } data { synthetic {} }"), "");
    ASSERT_TRUE(a.ok()) << a.status();
    first_id = a->job_id();
    EXPECT_EQ(first_id, "job-000001");
    EXPECT_EQ(a->state(), v1::Job::PENDING);
    EXPECT_EQ(a->submit_time_us(), 1000 * 1000000LL);
    EXPECT_EQ(a->spec().strategy().ddp().bucket_cap_mb(), 25);  // normalized
    clock.Advance(absl::Seconds(5));
    auto b = (*jobs)->Submit(Spec("name: 'b' model { mlp {} } data { synthetic {} }"), first_id);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->job_id(), "job-000002");
    auto cancelled = (*jobs)->Cancel(first_id, "");
    ASSERT_TRUE(cancelled.ok());
    EXPECT_EQ(cancelled->state(), v1::Job::CANCELLED);
    EXPECT_EQ(cancelled->reason(), "cancelled by the user");
    auto again = (*jobs)->Cancel(first_id, "");
    EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(again.status().message(), HasSubstr("already ended: CANCELLED"));
  }
  // A new manager on the same directory (as after kill -9 and restart).
  auto state = StateStore::Open(Dir("reopen"));
  ASSERT_TRUE(state.ok());
  auto jobs = JobManager::Create(**state, &clock);
  ASSERT_TRUE(jobs.ok());
  std::vector<v1::Job> all = (*jobs)->List({}, 0);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].job_id(), "job-000002");  // newest first
  EXPECT_EQ(all[0].state(), v1::Job::PENDING);
  EXPECT_EQ(all[0].resume_from(), first_id);
  EXPECT_EQ(all[1].state(), v1::Job::CANCELLED);
  EXPECT_EQ((*jobs)->List({v1::Job::CANCELLED}, 0).size(), 1u);
  EXPECT_EQ((*jobs)->List({}, 1).size(), 1u);
  std::map<v1::Job::State, int64_t> counts = (*jobs)->CountByState();
  EXPECT_EQ(counts.size(), 5u) << "every state, zeros included";
  EXPECT_EQ(counts[v1::Job::PENDING], 1);
  EXPECT_EQ(counts[v1::Job::CANCELLED], 1);
  EXPECT_EQ(counts[v1::Job::RUNNING], 0);
  auto events = (*jobs)->Events(first_id, 0);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].state(), v1::Job::PENDING);
  EXPECT_EQ((*events)[1].state(), v1::Job::CANCELLED);
  EXPECT_EQ((*events)[1].seq(), 2);
  auto c = (*jobs)->Submit(Spec("model { mlp {} } data { synthetic {} }"), "");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->job_id(), "job-000003");  // numbering continues
}

TEST(JobManagerTest, BadInputIsRefusedAndNothingIsStored) {
  auto state = StateStore::Open(Dir("bad"));
  ASSERT_TRUE(state.ok());
  auto jobs = JobManager::Create(**state, nullptr);
  ASSERT_TRUE(jobs.ok());
  auto invalid = (*jobs)->Submit(Spec("model { mlp {} } data { synthetic {} } "
                                      "strategy { ddp { bucket_cap_mb: -3 } }"),
                                 "");
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(invalid.status().message(),
              HasSubstr("strategy.ddp.bucket_cap_mb: must be > 0, got -3"));
  auto unknown = (*jobs)->Submit(Spec("model { mlp {} } data { synthetic {} }"), "job-000099");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  auto malformed = (*jobs)->Submit(Spec("model { mlp {} } data { synthetic {} }"), "x:y");
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*jobs)->List({}, 0).empty());
  EXPECT_EQ((*jobs)->Get("job-1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*jobs)->Cancel("job-1", "").status().code(), absl::StatusCode::kNotFound);
}

TEST(JobManagerTest, TheQueueTakesThousandsOfJobsUpToItsLimitAndSaysWhatToDo) {
  constexpr int kLimit = 1000;
  const v1::JobSpec spec = Spec("model { mlp {} } data { synthetic {} }");
  std::string first_id;
  {
    auto state = StateStore::Open(Dir("queue_limit"));
    ASSERT_TRUE(state.ok());
    auto jobs = JobManager::Create(**state, nullptr, kLimit);
    ASSERT_TRUE(jobs.ok());
    for (int i = 0; i < kLimit; ++i) {
      auto job = (*jobs)->Submit(spec, "");
      ASSERT_TRUE(job.ok()) << i << ": " << job.status();
      if (i == 0) first_id = job->job_id();
    }
    auto full = (*jobs)->Submit(spec, "");
    EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(full.status().message(),
              "the coordinator's queue is full: 1000 jobs are pending, the limit is 1000 "
              "(coordinator flag --max_pending_jobs). Submit again once some have started or "
              "ended, or cancel the ones you no longer need (`chorus jobs`, `chorus cancel JOB`)");
    EXPECT_EQ((*jobs)->List({}, 0).size(), static_cast<size_t>(kLimit)) << "nothing was stored";
    // A job that starts leaves the queue and makes room.
    ASSERT_TRUE((*jobs)->MarkRunning(first_id, 1, 1).ok());
    auto room = (*jobs)->Submit(spec, "");
    ASSERT_TRUE(room.ok()) << room.status();
    EXPECT_EQ(room->job_id(), "job-001001");
    EXPECT_EQ((*jobs)->Submit(spec, "").status().code(), absl::StatusCode::kResourceExhausted);
  }
  // Restarted with a smaller limit: the stored jobs stay queued, new ones
  // wait until the queue is below it.
  auto state = StateStore::Open(Dir("queue_limit"));
  ASSERT_TRUE(state.ok());
  auto jobs = JobManager::Create(**state, nullptr, 10);
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ((*jobs)->List({v1::Job::PENDING}, 0).size(), static_cast<size_t>(kLimit));
  auto refused = (*jobs)->Submit(spec, "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("1000 jobs are pending, the limit is 10"));
  EXPECT_EQ(JobManager::Create(**state, nullptr, 0).status().message(),
            "--max_pending_jobs must be at least 1, got 0");
}

TEST(JobManagerTest, RunningJobsFailAfterARestart) {
  auto state = StateStore::Open(Dir("restart_running"));
  ASSERT_TRUE(state.ok());
  auto jobs = JobManager::Create(**state, nullptr);
  ASSERT_TRUE(jobs.ok());
  auto a = (*jobs)->Submit(Spec("model { mlp {} } data { synthetic {} }"), "");
  auto b = (*jobs)->Submit(Spec("model { mlp {} } data { synthetic {} }"), "");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*jobs)->MarkRunning(a->job_id(), 1, 2).ok());
  EXPECT_EQ((*jobs)->FailRunning("coordinator restarted"), 1);
  EXPECT_EQ((*jobs)->Get(a->job_id())->state(), v1::Job::FAILED);
  EXPECT_EQ((*jobs)->Get(a->job_id())->reason(), "coordinator restarted");
  EXPECT_EQ((*jobs)->Get(b->job_id())->state(), v1::Job::PENDING);
  EXPECT_EQ((*jobs)->Finish(a->job_id(), v1::Job::SUCCEEDED, "x").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Two clusters sharing one checkpoint directory both number their jobs from
// job-000001: each one's jobs go under its own cluster id, and a path given
// with a trailing slash or dots is stored in one form.
TEST(JobManagerTest, SharedCheckpointDirectoriesAreNamespacedByCluster) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  const std::string spec =
      "name: 's' model { mlp {} } data { synthetic {} } "
      "checkpoint { storage: SHARED_DIR shared_dir: '/mnt/./ckpt/' "
      "shared_dir_namespace: 'chosen-by-the-user' }";
  std::string first_cluster;
  {
    auto state = StateStore::Open(Dir("cluster_a"));
    ASSERT_TRUE(state.ok()) << state.status();
    first_cluster = (*state)->cluster_id();
    EXPECT_THAT(first_cluster, ::testing::MatchesRegex("[0-9a-f]{12}"));
    auto jobs = JobManager::Create(**state, &clock);
    auto job = (*jobs)->Submit(Spec(spec), "");
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->job_id(), "job-000001");
    EXPECT_EQ(job->spec().checkpoint().shared_dir(), "/mnt/ckpt") << "stored in one form";
    EXPECT_EQ(job->spec().checkpoint().shared_dir_namespace(), first_cluster)
        << "the coordinator sets it, whatever was submitted";
    EXPECT_EQ(SharedCheckpointRoot(job->spec().checkpoint()), "/mnt/ckpt/" + first_cluster);
    auto plain = (*jobs)->Submit(Spec("model { mlp {} } data { synthetic {} }"), "");
    EXPECT_TRUE(plain->spec().checkpoint().shared_dir_namespace().empty());
  }
  auto reopened = StateStore::Open(Dir("cluster_a"));
  EXPECT_EQ((*reopened)->cluster_id(), first_cluster) << "the id survives a restart";
  // Another cluster's job-000001 goes elsewhere.
  auto other = StateStore::Open(Dir("cluster_b"));
  ASSERT_NE((*other)->cluster_id(), first_cluster);
  auto jobs = JobManager::Create(**other, &clock);
  auto job = (*jobs)->Submit(Spec(spec), "");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->job_id(), "job-000001");
  EXPECT_EQ(SharedCheckpointRoot(job->spec().checkpoint()),
            "/mnt/ckpt/" + (*other)->cluster_id());

  v1::CheckpointSpec root;
  root.set_shared_dir("/");
  EXPECT_EQ(SharedCheckpointRoot(root), "/");
  root.set_shared_dir_namespace("abc");
  EXPECT_EQ(SharedCheckpointRoot(root), "/abc");
}

// Note [Bounded job output]: a reason may quote whatever a job printed.
TEST(JobManagerTest, ReasonsAreBoundedInTheJobTheEventsAndTheDatabase) {
  const std::string reason = "rank 0 exited with code 1; last output: " + std::string(1 << 20, 'x');
  std::string job_id;
  {
    auto state = StateStore::Open(Dir("long_reason"));
    ASSERT_TRUE(state.ok());
    auto jobs = JobManager::Create(**state, nullptr);
    ASSERT_TRUE(jobs.ok());
    auto job = (*jobs)->Submit(Spec("model { mlp {} } data { synthetic {} }"), "");
    ASSERT_TRUE(job.ok());
    job_id = job->job_id();
    ASSERT_TRUE((*jobs)->MarkRunning(job_id, 1, 1).ok());
    auto ended = (*jobs)->Finish(job_id, v1::Job::FAILED, reason);
    ASSERT_TRUE(ended.ok()) << ended.status();
    EXPECT_LE(ended->reason().size(), kMaxReasonBytes + 64);
    EXPECT_THAT(ended->reason(), StartsWith("rank 0 exited with code 1; last output: xxx"));
    EXPECT_THAT(ended->reason(), EndsWith(" bytes cut]"));
  }
  auto state = StateStore::Open(Dir("long_reason"));
  ASSERT_TRUE(state.ok());
  auto jobs = JobManager::Create(**state, nullptr);
  ASSERT_TRUE(jobs.ok());
  EXPECT_LE((*jobs)->Get(job_id)->reason().size(), kMaxReasonBytes + 64);
  auto events = (*jobs)->Events(job_id, 0);
  ASSERT_TRUE(events.ok());
  ASSERT_FALSE(events->empty());
  for (const v1::JobEvent& event : *events) EXPECT_LE(event.reason().size(), kMaxReasonBytes + 64);
  EXPECT_THAT(events->back().reason(), EndsWith(" bytes cut]"));
}

TEST(StateStoreTest, RefusesAFileThatIsNotADatabase) {
  const std::string dir = Dir("garbage");
  ASSERT_EQ(
      std::system(
          ("mkdir -p " + dir + " && head -c 4096 /dev/urandom > " + dir + "/chorus.db").c_str()),
      0);
  auto state = StateStore::Open(dir);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(state.status().message(), HasSubstr("chorus.db"));
}

}  // namespace
}  // namespace chorus
