#include "common/retry.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;

// A fake clock that remembers every sleep.
class RecordingClock : public FakeClock {
 public:
  using FakeClock::FakeClock;
  void SleepFor(absl::Duration d) override {
    sleeps.push_back(d);
    FakeClock::SleepFor(d);
  }
  std::vector<absl::Duration> sleeps;
};

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(RetryBackoffTest, TheCeilingGrowsByTheMultiplierUpToTheCap) {
  RetryOptions options;
  options.initial_backoff = absl::Milliseconds(100);
  options.multiplier = 2;
  options.max_backoff = absl::Seconds(1);
  EXPECT_EQ(BackoffBefore(options, 1), absl::Milliseconds(100));
  EXPECT_EQ(BackoffBefore(options, 2), absl::Milliseconds(200));
  EXPECT_EQ(BackoffBefore(options, 3), absl::Milliseconds(400));
  EXPECT_EQ(BackoffBefore(options, 4), absl::Milliseconds(800));
  EXPECT_EQ(BackoffBefore(options, 5), absl::Seconds(1));
  EXPECT_EQ(BackoffBefore(options, 50), absl::Seconds(1));
  options.multiplier = 1;
  EXPECT_EQ(BackoffBefore(options, 7), absl::Milliseconds(100));
}

TEST(RetryTest, RetriesTransientFailuresWithBackoffUntilOneSucceeds) {
  RecordingClock clock(kStart);
  RetryOptions options;
  options.initial_backoff = absl::Milliseconds(200);
  options.max_backoff = absl::Seconds(1);
  options.jitter = 0;  // exact sleeps
  options.clock = &clock;
  int attempts = 0;
  absl::Status s = Retry(options, [&](absl::Time) {
    ++attempts;
    if (attempts == 2) return absl::DeadlineExceededError("attempt 2 ran out of time");
    return attempts < 5 ? absl::UnavailableError("coordinator restarting") : absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(attempts, 5);
  EXPECT_THAT(clock.sleeps, ElementsAre(absl::Milliseconds(200), absl::Milliseconds(400),
                                        absl::Milliseconds(800), absl::Seconds(1)));
}

TEST(RetryTest, JitteredSleepsLieInTheUpperHalfOfTheirCeilings) {
  RecordingClock clock(kStart);
  RetryOptions options;
  options.initial_backoff = absl::Milliseconds(200);
  options.max_backoff = absl::Seconds(1);
  options.deadline = absl::Minutes(10);
  options.clock = &clock;
  int attempts = 0;
  absl::Status s = Retry(options, [&](absl::Time) {
    return ++attempts < 12 ? absl::UnavailableError("down") : absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  ASSERT_EQ(clock.sleeps.size(), 11);
  for (int i = 0; i < 11; ++i) {
    const absl::Duration ceiling = BackoffBefore(options, i + 1);
    EXPECT_GE(clock.sleeps[i], ceiling / 2) << "sleep " << i;
    EXPECT_LE(clock.sleeps[i], ceiling) << "sleep " << i;
  }
}

TEST(RetryTest, FinalCodesEndAtOnceWithTheirStatus) {
  for (const absl::Status& final_status :
       {absl::InvalidArgumentError("no such rank"), absl::NotFoundError("job-000009 not found"),
        absl::PermissionDeniedError("bad token")}) {
    RecordingClock clock(kStart);
    RetryOptions options;
    options.clock = &clock;
    int attempts = 0;
    absl::Status s = Retry(options, [&](absl::Time) {
      ++attempts;
      return final_status;
    });
    EXPECT_EQ(s, final_status);
    EXPECT_EQ(attempts, 1);
    EXPECT_TRUE(clock.sleeps.empty());
  }
}

TEST(RetryTest, TheDeadlineCutsTheLastSleepAndNoAttemptStartsAfterIt) {
  RecordingClock clock(kStart);
  RetryOptions options;
  options.initial_backoff = absl::Milliseconds(200);
  options.max_backoff = absl::Seconds(10);
  options.deadline = absl::Seconds(1);
  options.jitter = 0;  // exact sleeps
  options.clock = &clock;
  std::vector<absl::Time> started;
  std::vector<absl::Time> attempt_deadlines;
  absl::Status s = Retry(options, [&](absl::Time attempt_deadline) {
    started.push_back(clock.Now());
    attempt_deadlines.push_back(attempt_deadline);
    return absl::UnavailableError("connection refused");
  });
  EXPECT_TRUE(absl::IsUnavailable(s));
  EXPECT_EQ(s.message(), "connection refused");
  EXPECT_THAT(clock.sleeps, ElementsAre(absl::Milliseconds(200), absl::Milliseconds(400),
                                        absl::Milliseconds(400)));
  EXPECT_THAT(started, ElementsAre(kStart, kStart + absl::Milliseconds(200),
                                   kStart + absl::Milliseconds(600)));
  // attempt_timeout (10 s) is longer than what is left: every attempt ends
  // with the whole deadline.
  for (absl::Time d : attempt_deadlines) EXPECT_EQ(d, kStart + absl::Seconds(1));
  EXPECT_EQ(clock.Now(), kStart + absl::Seconds(1));
}

TEST(RetryTest, SlowAttemptsCountAgainstTheDeadline) {
  RecordingClock clock(kStart);
  RetryOptions options;
  options.initial_backoff = absl::Milliseconds(200);
  options.deadline = absl::Seconds(2);
  options.attempt_timeout = absl::Milliseconds(700);
  options.jitter = 0;  // exact sleeps
  options.clock = &clock;
  std::vector<absl::Time> attempt_deadlines;
  absl::Status s = Retry(options, [&](absl::Time attempt_deadline) {
    attempt_deadlines.push_back(attempt_deadline);
    clock.Advance(absl::Milliseconds(700));  // the attempt times out
    return absl::DeadlineExceededError("Deadline Exceeded");
  });
  EXPECT_TRUE(absl::IsDeadlineExceeded(s));
  // 0-0.7 attempt, 0.9-1.6 attempt, then a sleep cut to the 0.4 s left.
  EXPECT_THAT(attempt_deadlines,
              ElementsAre(kStart + absl::Milliseconds(700), kStart + absl::Milliseconds(1600)));
  EXPECT_THAT(clock.sleeps, ElementsAre(absl::Milliseconds(200), absl::Milliseconds(400)));
}

TEST(RetryTest, MaxAttemptsAndACustomPredicateAreHonoured) {
  RecordingClock clock(kStart);
  RetryOptions options;
  options.clock = &clock;
  options.max_attempts = 1;
  int attempts = 0;
  absl::Status s = Retry(options, [&](absl::Time) {
    ++attempts;
    return absl::UnavailableError("down");
  });
  EXPECT_TRUE(absl::IsUnavailable(s));
  EXPECT_EQ(attempts, 1);

  options.max_attempts = 3;
  options.retryable = [](const absl::Status& st) { return absl::IsAborted(st); };
  attempts = 0;
  s = Retry(options, [&](absl::Time) {
    ++attempts;
    return absl::AbortedError("conflict");
  });
  EXPECT_TRUE(absl::IsAborted(s));
  EXPECT_EQ(attempts, 3);
  attempts = 0;
  s = Retry(options, [&](absl::Time) {
    ++attempts;
    return absl::UnavailableError("down");
  });
  EXPECT_EQ(attempts, 1) << "UNAVAILABLE is final for this predicate";
}

TEST(IsTransientTest, OnlyUnavailableAndDeadlineExceeded) {
  EXPECT_TRUE(IsTransient(absl::UnavailableError("")));
  EXPECT_TRUE(IsTransient(absl::DeadlineExceededError("")));
  EXPECT_FALSE(IsTransient(absl::OkStatus()));
  EXPECT_FALSE(IsTransient(absl::InternalError("")));
  EXPECT_FALSE(IsTransient(absl::FailedPreconditionError("")));
}

}  // namespace
}  // namespace chorus
