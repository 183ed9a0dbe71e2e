#include "common/backoff.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace chorus {
namespace {

BackoffOptions Options(double jitter) {
  BackoffOptions options;
  options.initial = absl::Milliseconds(100);
  options.max = absl::Seconds(1);
  options.jitter = jitter;
  return options;
}

TEST(BackoffTest, WithoutJitterTheDelaysDoubleUpToTheCap) {
  Backoff backoff(Options(0), 1);
  std::vector<absl::Duration> delays;
  for (int i = 0; i < 7; ++i) delays.push_back(backoff.Next());
  EXPECT_EQ(delays, (std::vector<absl::Duration>{
                        absl::Milliseconds(100), absl::Milliseconds(200), absl::Milliseconds(400),
                        absl::Milliseconds(800), absl::Seconds(1), absl::Seconds(1),
                        absl::Seconds(1)}));
  EXPECT_EQ(backoff.retries(), 7);
}

TEST(BackoffTest, EachJitteredDelayLiesInTheUpperHalfOfItsGrowingCeiling) {
  Backoff backoff(Options(0.5), 7);
  for (int i = 0; i < 40; ++i) {
    const absl::Duration ceiling = backoff.ceiling();
    const absl::Duration delay = backoff.Next();
    EXPECT_GE(delay, ceiling / 2) << "retry " << i;
    EXPECT_LE(delay, ceiling) << "retry " << i;
    EXPECT_LE(delay, absl::Seconds(1));
  }
  EXPECT_EQ(backoff.ceiling(), absl::Seconds(1));
}

// Clients that lost their peer at the same instant must not come back at
// the same instants: over 1000 clients the first delay covers its window.
TEST(BackoffTest, ClientsStartedTogetherSpreadOverTheWindow) {
  std::vector<double> ms;
  for (uint64_t client = 0; client < 1000; ++client) {
    Backoff backoff(Options(0.5), client);
    for (int i = 0; i < 4; ++i) backoff.Next();  // the ceiling is 1 s now
    ms.push_back(absl::ToDoubleMilliseconds(backoff.Next()));
  }
  const auto [lo, hi] = std::minmax_element(ms.begin(), ms.end());
  double sum = 0;
  for (double d : ms) sum += d;
  const double mean = sum / ms.size();
  EXPECT_GE(*lo, 500);
  EXPECT_LT(*lo, 520);  // the window's floor is reached...
  EXPECT_LE(*hi, 1000);
  EXPECT_GT(*hi, 980);  // ...and its top
  EXPECT_NEAR(mean, 750, 25);
  // No 50 ms bucket of the window holds more than twice its fair share.
  std::vector<int> buckets(10, 0);
  for (double d : ms) ++buckets[std::min(9, static_cast<int>((d - 500) / 50))];
  for (int count : buckets) {
    EXPECT_GT(count, 50);
    EXPECT_LT(count, 200);
  }
}

TEST(BackoffTest, TheProcessSeedDiffersBetweenBackoffs) {
  Backoff a(Options(0.5));
  Backoff b(Options(0.5));
  std::vector<absl::Duration> da, db;
  for (int i = 0; i < 8; ++i) {
    da.push_back(a.Next());
    db.push_back(b.Next());
  }
  EXPECT_NE(da, db);
}

TEST(BackoffTest, ResetStartsOverFromTheInitialDelay) {
  Backoff backoff(Options(0.5), 3);
  for (int i = 0; i < 10; ++i) backoff.Next();
  ASSERT_EQ(backoff.ceiling(), absl::Seconds(1));
  backoff.Reset();
  EXPECT_EQ(backoff.retries(), 0);
  EXPECT_EQ(backoff.ceiling(), absl::Milliseconds(100));
  const absl::Duration first = backoff.Next();
  EXPECT_GE(first, absl::Milliseconds(50));
  EXPECT_LE(first, absl::Milliseconds(100));
}

TEST(BackoffTest, TheSameSeedGivesTheSameDelays) {
  Backoff a(Options(0.5), 42);
  Backoff b(Options(0.5), 42);
  Backoff c(Options(0.5), 43);
  std::vector<absl::Duration> da, db, dc;
  for (int i = 0; i < 20; ++i) {
    da.push_back(a.Next());
    db.push_back(b.Next());
    dc.push_back(c.Next());
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
}

TEST(BackoffTest, NextWithinIsCutAtTheDeadline) {
  Backoff backoff(Options(0), 1);
  const absl::Time now = absl::FromUnixSeconds(1000);
  EXPECT_EQ(backoff.NextWithin(now + absl::Milliseconds(30), now), absl::Milliseconds(30));
  EXPECT_EQ(backoff.NextWithin(now + absl::Seconds(5), now), absl::Milliseconds(200));
  EXPECT_EQ(backoff.NextWithin(now - absl::Seconds(1), now), absl::ZeroDuration());
}

TEST(BackoffTest, BadOptionsNameTheField) {
  BackoffOptions options = Options(0.5);
  options.initial = absl::ZeroDuration();
  EXPECT_NE(ValidateBackoffOptions(options).message().find("initial must be > 0"),
            std::string::npos);
  options = Options(0.5);
  options.max = absl::Milliseconds(10);
  EXPECT_NE(ValidateBackoffOptions(options).message().find("max (10ms) must be >= initial"),
            std::string::npos);
  options = Options(1.5);
  EXPECT_NE(ValidateBackoffOptions(options).message().find("jitter must be in [0, 1]"),
            std::string::npos);
  options = Options(0.5);
  options.multiplier = 0.5;
  EXPECT_NE(ValidateBackoffOptions(options).message().find("multiplier must be >= 1"),
            std::string::npos);
  EXPECT_TRUE(ValidateBackoffOptions(Options(0.5)).ok());
}

}  // namespace
}  // namespace chorus
