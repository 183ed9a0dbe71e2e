#include "coordinator/state/job_manager.h"

#include <cstdlib>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
  std::vector<v1::Job> all = (*jobs)->List({}, 0).value();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].job_id(), "job-000002");  // newest first
  EXPECT_EQ(all[0].state(), v1::Job::PENDING);
  EXPECT_EQ(all[0].resume_from(), first_id);
  EXPECT_EQ(all[1].state(), v1::Job::CANCELLED);
  EXPECT_EQ((*jobs)->List({v1::Job::CANCELLED}, 0).value().size(), 1u);
  EXPECT_EQ((*jobs)->List({}, 1).value().size(), 1u);
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

TEST(JobManagerTest, ARequeuedJobIsPendingAgainWithItsReasonAndResumeFromAfterAReopen) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  std::string id;
  {
    auto state = StateStore::Open(Dir("requeue"));
    ASSERT_TRUE(state.ok()) << state.status();
    auto jobs = *JobManager::Create(**state, &clock);
    id = jobs->Submit(Spec("model { mlp {} } data { synthetic {} }"), "")->job_id();
    EXPECT_EQ(jobs->Requeue(id, id, "too early").status().code(),
              absl::StatusCode::kFailedPrecondition)
        << "a PENDING job is not running";
    ASSERT_TRUE(jobs->MarkRunning(id, 1, 2).ok());
    absl::StatusOr<v1::Job> queued =
        jobs->Requeue(id, id, "preempted by job-000009 (HIGH, bob); resumes from step 120");
    ASSERT_TRUE(queued.ok()) << queued.status();
    EXPECT_EQ(queued->state(), v1::Job::PENDING);
    EXPECT_EQ(queued->generation(), 0);
    EXPECT_EQ(queued->submit_time_us(), 1000 * 1000000LL) << "it keeps its place";
    EXPECT_THAT(jobs->PendingJobIds(), testing::ElementsAre(id));
  }
  auto state = StateStore::Open(Dir("requeue"));
  ASSERT_TRUE(state.ok());
  auto jobs = *JobManager::Create(**state, &clock);
  v1::Job job = *jobs->Get(id);
  EXPECT_EQ(job.state(), v1::Job::PENDING);
  EXPECT_EQ(job.resume_from(), id);
  EXPECT_EQ(job.preemptions(), 1);
  EXPECT_EQ(job.reason(), "preempted by job-000009 (HIGH, bob); resumes from step 120");
  ASSERT_TRUE(jobs->MarkRunning(id, 1, 2).ok());
  EXPECT_EQ(jobs->Get(id)->reason(), "") << "running again, it no longer waits";
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
  EXPECT_TRUE((*jobs)->List({}, 0).value().empty());
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
    EXPECT_EQ((*jobs)->List({}, 0).value().size(), static_cast<size_t>(kLimit))
        << "nothing was stored";
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
  EXPECT_EQ((*jobs)->List({v1::Job::PENDING}, 0).value().size(), static_cast<size_t>(kLimit));
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
  EXPECT_EQ(SharedCheckpointRoot(job->spec().checkpoint()), "/mnt/ckpt/" + (*other)->cluster_id());

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

// Note [Only the newest ended jobs in memory]: a long-running coordinator
// keeps the newest ended jobs in memory and reads older ones back from its
// database; users see every job as before.
TEST(JobManagerTest, OldEndedJobsLeaveMemoryAndAreReadBackFromTheDatabase) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  auto state = StateStore::Open(Dir("ended_in_memory"));
  ASSERT_TRUE(state.ok());
  auto jobs = JobManager::Create(**state, &clock, 100, /*ended_jobs_in_memory=*/3);
  ASSERT_TRUE(jobs.ok());
  const v1::JobSpec spec = Spec("model { mlp {} } data { synthetic {} }");
  for (int i = 1; i <= 10; ++i) ASSERT_TRUE((*jobs)->Submit(spec, "").ok());
  // job-000002 runs on, job-000005 waits; the rest end.
  ASSERT_TRUE((*jobs)->MarkRunning("job-000002", 1, 1).ok());
  v1::Metrics metrics;
  metrics.set_step(42);
  ASSERT_TRUE((*jobs)->UpdateMetrics("job-000002", metrics, /*persist=*/false).ok());
  for (int i : {1, 3, 4, 6, 7, 8, 9, 10}) {
    const std::string id = absl::StrFormat("job-%06d", i);
    if (i % 3 == 0) {
      ASSERT_TRUE((*jobs)->Cancel(id, absl::StrCat("cancel ", i)).ok());
    } else {
      ASSERT_TRUE((*jobs)->MarkRunning(id, 1, 1).ok());
      ASSERT_TRUE((*jobs)->Finish(id, v1::Job::SUCCEEDED, absl::StrCat("done ", i)).ok());
    }
  }
  EXPECT_EQ((*jobs)->JobsInMemory(), 5u) << "3 ended jobs and the 2 that have not ended";

  std::vector<v1::Job> all = (*jobs)->List({}, 0).value();
  ASSERT_EQ(all.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(all[i].job_id(), absl::StrFormat("job-%06d", 10 - i));
  EXPECT_EQ(all[8].state(), v1::Job::RUNNING);
  EXPECT_EQ(all[8].latest_metrics().step(), 42) << "a job in memory is listed as memory has it";
  EXPECT_EQ(all[9].reason(), "done 1");
  EXPECT_EQ((*jobs)->List({v1::Job::CANCELLED}, 0).value().size(), 3u);
  std::vector<v1::Job> pending = (*jobs)->List({v1::Job::PENDING}, 0).value();
  ASSERT_EQ(pending.size(), 1u) << "a job below those that left memory is still listed";
  EXPECT_EQ(pending[0].job_id(), "job-000005");
  std::vector<v1::Job> page = (*jobs)->List({}, 2, "job-000005").value();
  ASSERT_EQ(page.size(), 2u);
  EXPECT_EQ(page[0].job_id(), "job-000004");
  EXPECT_EQ(page[1].job_id(), "job-000003");
  std::map<v1::Job::State, int64_t> counts = (*jobs)->CountByState();
  EXPECT_EQ(counts[v1::Job::SUCCEEDED], 5);
  EXPECT_EQ(counts[v1::Job::CANCELLED], 3);
  EXPECT_EQ(counts[v1::Job::RUNNING], 1);
  EXPECT_EQ(counts[v1::Job::PENDING], 1);

  // An old job reads, refuses changes and takes events as before.
  absl::StatusOr<v1::Job> old = (*jobs)->Get("job-000001");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->state(), v1::Job::SUCCEEDED);
  absl::Status refused = (*jobs)->Cancel("job-000001", "").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("already ended: SUCCEEDED (done 1)"));
  v1::JobEvent note;
  note.set_message("checkpoint 7 removed");
  ASSERT_TRUE((*jobs)->AddEvent("job-000001", note).ok());
  auto events = (*jobs)->Events("job-000001", 0);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 4u);  // submitted, running, succeeded, the note
  EXPECT_EQ(events->back().seq(), 4);
  EXPECT_EQ(events->back().message(), "checkpoint 7 removed");
  EXPECT_TRUE((*jobs)->Submit(spec, "job-000001").ok()) << "resuming from an old job";
  EXPECT_EQ((*jobs)->Get("job-000099").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*jobs)->Events("job-000099", 0).status().code(), absl::StatusCode::kNotFound);

  // The long job ends below the ones in memory: it leaves at once, with the
  // metrics it had in memory.
  ASSERT_TRUE((*jobs)->Finish("job-000002", v1::Job::SUCCEEDED, "done 2").ok());
  EXPECT_EQ((*jobs)->JobsInMemory(), 5u) << "3 ended jobs, job-000005 and job-000011";
  EXPECT_EQ((*jobs)->Get("job-000002")->latest_metrics().step(), 42);
  EXPECT_EQ((*jobs)->Get("job-000002")->state(), v1::Job::SUCCEEDED);

  // A restart keeps the same bound and shows the same jobs.
  const std::vector<v1::Job> before = (*jobs)->List({}, 0).value();
  const std::map<v1::Job::State, int64_t> counts_before = (*jobs)->CountByState();
  EXPECT_EQ(counts_before.at(v1::Job::SUCCEEDED), 6);
  EXPECT_EQ(counts_before.at(v1::Job::PENDING), 2);
  jobs->reset();
  auto reopened = JobManager::Create(**state, &clock, 100, 3);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->JobsInMemory(), 5u);
  EXPECT_EQ((*reopened)->CountByState(), counts_before);
  const std::vector<v1::Job> after = (*reopened)->List({}, 0).value();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].SerializeAsString(), before[i].SerializeAsString()) << i;
  }
}

// Whatever ended jobs memory keeps, every listing, page, count and read is
// the same as with all of them in memory.
TEST(JobManagerTest, ListingsDoNotDependOnHowManyEndedJobsAreInMemory) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  const v1::JobSpec spec = Spec("model { mlp {} } data { synthetic {} }");
  std::vector<std::unique_ptr<StateStore>> states;
  std::vector<std::unique_ptr<JobManager>> managers;
  for (int kept : {0, 1, 7, 1000}) {
    auto state = StateStore::Open(Dir(absl::StrCat("differential_", kept)));
    ASSERT_TRUE(state.ok());
    auto jobs = JobManager::Create(**state, &clock, 1000, kept);
    ASSERT_TRUE(jobs.ok());
    states.push_back(*std::move(state));
    managers.push_back(*std::move(jobs));
  }
  std::mt19937 random(7);
  for (int op = 0; op < 300; ++op) {
    const int choice = static_cast<int>(random() % 4);
    const std::string id = absl::StrFormat("job-%06d", 1 + random() % 60);
    for (auto& jobs : managers) {
      if (choice == 0) {
        (void)jobs->Submit(spec, "");
      } else if (choice == 1) {
        (void)jobs->MarkRunning(id, 1, 1);
      } else if (choice == 2) {
        (void)jobs->Finish(id, op % 2 ? v1::Job::SUCCEEDED : v1::Job::FAILED, "r");
      } else {
        (void)jobs->Cancel(id, "c");
      }
    }
    clock.Advance(absl::Seconds(1));
  }
  const auto ids = [](const std::vector<v1::Job>& jobs) {
    std::vector<std::string> out;
    for (const v1::Job& job : jobs)
      out.push_back(job.job_id() + ":" + v1::Job::State_Name(job.state()));
    return out;
  };
  const std::vector<std::vector<v1::Job::State>> filters = {
      {}, {v1::Job::PENDING}, {v1::Job::SUCCEEDED}, {v1::Job::RUNNING, v1::Job::FAILED}};
  for (const auto& states_wanted : filters) {
    for (int limit : {0, 1, 5, 17}) {
      for (const std::string older_than : {"", "job-000031", "job-000002", "job-000100"}) {
        const auto expected = ids(managers.back()->List(states_wanted, limit, older_than).value());
        for (size_t m = 0; m + 1 < managers.size(); ++m) {
          EXPECT_EQ(ids(managers[m]->List(states_wanted, limit, older_than).value()), expected)
              << "manager " << m << " limit " << limit << " older_than " << older_than;
        }
      }
    }
  }
  for (size_t m = 0; m + 1 < managers.size(); ++m) {
    EXPECT_EQ(managers[m]->CountByState(), managers.back()->CountByState()) << m;
    for (int i = 1; i <= 61; ++i) {
      const std::string id = absl::StrFormat("job-%06d", i);
      absl::StatusOr<v1::Job> a = managers[m]->Get(id);
      absl::StatusOr<v1::Job> b = managers.back()->Get(id);
      ASSERT_EQ(a.ok(), b.ok()) << id;
      if (a.ok()) {
        EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString()) << id;
      }
    }
  }
  EXPECT_LT(managers[0]->JobsInMemory(), managers.back()->JobsInMemory());
}

// /metrics' failure reasons (Note [Failure reasons as labels] in
// coordinator_metrics.cc): the FAILED jobs in memory, latest end first, not
// by id; the others' reasons are not read.
TEST(JobManagerTest, NewestFailedListsFailedJobsByTheirEndLatestFirst) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  auto state = StateStore::Open(Dir("newest_failed"));
  ASSERT_TRUE(state.ok());
  auto jobs = JobManager::Create(**state, &clock);
  ASSERT_TRUE(jobs.ok());
  const v1::JobSpec spec = Spec("model { mlp {} } data { synthetic {} }");
  for (int i = 1; i <= 5; ++i) {
    ASSERT_TRUE((*jobs)->Submit(spec, "").ok());
    ASSERT_TRUE((*jobs)->MarkRunning(absl::StrFormat("job-%06d", i), 1, 1).ok());
  }
  // job-000004 fails first, then job-000001; job-000002 succeeds,
  // job-000003 is cancelled, job-000005 fails last.
  for (const auto& [i, state_now] :
       std::vector<std::pair<int, v1::Job::State>>{{4, v1::Job::FAILED},
                                                   {1, v1::Job::FAILED},
                                                   {2, v1::Job::SUCCEEDED},
                                                   {5, v1::Job::FAILED}}) {
    clock.Advance(absl::Seconds(10));
    ASSERT_TRUE((*jobs)
                    ->Finish(absl::StrFormat("job-%06d", i), state_now, absl::StrCat("reason ", i))
                    .ok());
  }
  ASSERT_TRUE((*jobs)->Cancel("job-000003", "no longer needed").ok());
  const auto ids = [](const std::vector<v1::Job>& failed) {
    std::vector<std::string> out;
    for (const v1::Job& job : failed) out.push_back(job.job_id() + ": " + job.reason());
    return out;
  };
  EXPECT_EQ(ids((*jobs)->NewestFailed(10)),
            (std::vector<std::string>{"job-000005: reason 5", "job-000001: reason 1",
                                      "job-000004: reason 4"}));
  EXPECT_EQ(ids((*jobs)->NewestFailed(2)),
            (std::vector<std::string>{"job-000005: reason 5", "job-000001: reason 1"}));
  EXPECT_TRUE((*jobs)->NewestFailed(0).empty());
}

// Note [One commit per change]: a job's state and its event are stored
// together or not at all.
TEST(StateStoreTest, AJobAndItsEventAreOneCommit) {
  auto state = StateStore::Open(Dir("one_commit"));
  ASSERT_TRUE(state.ok());
  v1::Job job;
  job.set_job_id("job-000001");
  job.set_state(v1::Job::PENDING);
  v1::JobEvent event;
  event.set_job_id("job-000001");
  event.set_seq(1);
  event.set_state(v1::Job::PENDING);
  ASSERT_TRUE((*state)->SaveJobAndEvent(job, event).ok());
  // The event's seq is taken: the state change that comes with it is not stored either.
  job.set_state(v1::Job::RUNNING);
  event.set_state(v1::Job::RUNNING);
  EXPECT_FALSE((*state)->SaveJobAndEvent(job, event).ok());
  EXPECT_EQ((*state)->LoadJob("job-000001")->state(), v1::Job::PENDING);
  EXPECT_EQ((*state)->LastEventSeq("job-000001").value(), 1);
  // The store goes on after the failed commit.
  event.set_seq(2);
  ASSERT_TRUE((*state)->SaveJobAndEvent(job, event).ok());
  EXPECT_EQ((*state)->LoadJob("job-000001")->state(), v1::Job::RUNNING);
  EXPECT_EQ((*state)->LastEventSeq("job-000001").value(), 2);
  EXPECT_EQ((*state)->LoadJob("job-000002").status().code(), absl::StatusCode::kNotFound);
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
