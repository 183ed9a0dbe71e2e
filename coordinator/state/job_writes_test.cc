#include "coordinator/state/job_writes.h"

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(JobWritesTest, AJobsWritesRunInTheOrderTheyWereAddedWhoeverRunsFirst) {
  JobWrites order;
  std::vector<int> ran;
  JobWrites::Batch first(order);
  JobWrites::Batch second(order);
  first.Add("job-1", [&] { ran.push_back(1); });
  second.Add("job-1", [&] { ran.push_back(2); });
  std::atomic<bool> second_done{false};
  std::thread later([&] {
    second.Run();
    second_done = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(second_done) << "the second write waits for the first";
  first.Run();
  later.join();
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
  EXPECT_EQ(order.jobs_in_flight(), 0);
}

TEST(JobWritesTest, ASlowWriteHoldsUpItsOwnJobOnly) {
  JobWrites order;
  absl::Notification slow_began, release;
  JobWrites::Batch slow(order);
  slow.Add("job-1", [&] {
    slow_began.Notify();
    release.WaitForNotification();
  });
  std::thread writer([&] { slow.Run(); });
  slow_began.WaitForNotification();

  bool other_ran = false;
  JobWrites::Batch other(order);
  other.Add("job-2", [&] { other_ran = true; });
  other.Run();  // returns while job-1's write is still going on
  EXPECT_TRUE(other_ran);

  std::atomic<bool> same_job_ran{false};
  JobWrites::Batch same(order);
  same.Add("job-1", [&] { same_job_ran = true; });
  std::thread behind([&] { same.Run(); });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(same_job_ran) << "a later write of the slow job waits for it";
  EXPECT_EQ(order.jobs_in_flight(), 1);
  release.Notify();
  writer.join();
  behind.join();
  EXPECT_TRUE(same_job_ran);
  EXPECT_EQ(order.jobs_in_flight(), 0);
}

TEST(JobWritesTest, ABatchNotRunRunsWhenItGoes) {
  JobWrites order;
  std::vector<int> ran;
  {
    JobWrites::Batch left(order);
    left.Add("job-1", [&] { ran.push_back(1); });
  }
  JobWrites::Batch next(order);
  next.Add("job-1", [&] { ran.push_back(2); });
  next.Run();  // would wait for ever behind a ticket that never ran
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
  EXPECT_TRUE(next.empty());
}

// As the scheduler uses it: writes decided under one lock by many threads,
// run after it by each of them; every job's writes land in decided order.
TEST(JobWritesTest, ManyThreadsKeepEveryJobsOrder) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 200;
  const std::vector<std::string> jobs = {"job-1", "job-2", "job-3"};
  JobWrites order;
  absl::Mutex decide;  // the scheduler's lock
  std::map<std::string, std::vector<int>> decided;
  absl::Mutex applied_mu;
  std::map<std::string, std::vector<int>> applied;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        JobWrites::Batch writes(order);
        {
          absl::MutexLock lock(&decide);
          // Each call decides writes for one or two jobs.
          for (int k = 0; k <= (round + t) % 2; ++k) {
            const std::string& job = jobs[(round + t + k) % jobs.size()];
            const int value = static_cast<int>(decided[job].size());
            decided[job].push_back(value);
            writes.Add(job, [&, job, value] {
              absl::MutexLock lock(&applied_mu);
              applied[job].push_back(value);
            });
          }
        }
        writes.Run();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::string& job : jobs) {
    EXPECT_EQ(applied[job], decided[job]) << job;
    EXPECT_GT(applied[job].size(), 0u) << job;
  }
  EXPECT_EQ(order.jobs_in_flight(), 0);
}

}  // namespace
}  // namespace chorus
