#include "coordinator/state/key_value_store.h"

#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

// Collects the one status a wait finishes with.
struct Result {
  absl::Mutex mu;
  int calls = 0;
  absl::Status status;
  KeyValueStore::Done Callback() {
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu);
      ++calls;
      status = std::move(s);
    };
  }
  bool WaitDone(absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    return mu.AwaitWithTimeout(absl::Condition(
                                   +[](int* c) { return *c > 0; }, &calls),
                               timeout);
  }
};

TEST(KeyValueStoreTest, SetGetAddAndNamespaces) {
  KeyValueStore kv;
  ASSERT_TRUE(kv.Set("a", "k", "v").ok());
  EXPECT_EQ(kv.Get("a", "k"), "v");
  EXPECT_EQ(kv.Get("b", "k"), std::nullopt);
  EXPECT_EQ(*kv.Add("a", "n", 2), 2);
  EXPECT_EQ(*kv.Add("a", "n", 3), 5);
  EXPECT_EQ(kv.Add("a", "k", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Set("a", "big", std::string(KeyValueStore::kMaxValueBytes + 1, 'x')).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(KeyValueStoreTest, AJobsKeysStopAtItsQuotaWhileOtherJobsKeepWorking) {
  // The default quota, reached by a job that tries to write a million keys.
  KeyValueStore kv;
  const size_t limit = kv.limits().max_keys_per_job;
  ASSERT_EQ(limit, 100000u);
  absl::Status refused;
  size_t written = 0;
  for (size_t i = 0; i < 1000000; ++i) {
    refused = kv.Set(i % 2 ? "job-9/gen-1" : "job-9/gen-2", absl::StrCat("k", i), "v");
    if (!refused.ok()) break;
    ++written;
  }
  EXPECT_EQ(written, limit) << "keys of both generations count against the job";
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(),
            "store: job \"job-9\" already holds 100000 keys, the limit of 100000 per job "
            "(coordinator flag --store_max_keys_per_job); key \"k100000\" was not set. "
            "Rendezvous needs a few keys per rank and generation: a job that reaches this "
            "writes keys in a loop");
  EXPECT_EQ(kv.Get("job-9/gen-2", "k100000"), std::nullopt);
  EXPECT_EQ(kv.Add("job-9/gen-2", "counter", 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Keys it holds may still change; other jobs are untouched.
  EXPECT_TRUE(kv.Set("job-9/gen-2", "k0", "w").ok());
  EXPECT_EQ(kv.Get("job-9/gen-2", "k0"), "w");
  EXPECT_TRUE(kv.Set("job-10/gen-1", "0", "addr").ok());
  EXPECT_EQ(*kv.Add("job-10/gen-1", "n", 5), 5);
  EXPECT_EQ(kv.UsageOf("job-9").keys, limit);
  EXPECT_EQ(kv.UsageOf("job-10").keys, 2u);
}

TEST(KeyValueStoreTest, BytesAndValueSizeQuotasNameTheJobAndTheFlag) {
  KeyValueStore::Limits limits;
  limits.max_bytes_per_job = 1000;
  limits.max_value_bytes = 600;
  KeyValueStore kv(nullptr, limits);
  absl::Status huge = kv.Set("job-1/gen-1", "blob", std::string(601, 'x'));
  EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(huge.message(),
            "store: job \"job-1\": the value of key \"blob\" is 601 bytes, more than the limit "
            "of 600 bytes per value (coordinator flag --store_max_value_bytes)");
  ASSERT_TRUE(kv.Set("job-1/gen-1", "a", std::string(599, 'x')).ok());  // 600 bytes with its key
  ASSERT_TRUE(kv.Set("job-1/gen-2", "b", std::string(399, 'x')).ok());  // 1000
  EXPECT_EQ(kv.UsageOf("job-1").bytes, 1000u);
  absl::Status full = kv.Set("job-1/gen-2", "c", "");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(),
            "store: job \"job-1\" would hold 1001 bytes of keys and values, more than the limit "
            "of 1000 per job (coordinator flag --store_max_bytes_per_job); key \"c\" was not set");
  // Overwriting counts the new value instead of the old one.
  ASSERT_TRUE(kv.Set("job-1/gen-1", "a", "small").ok());
  EXPECT_EQ(kv.UsageOf("job-1").bytes, 6u + 400u);
  EXPECT_TRUE(kv.Set("job-1/gen-2", "c", std::string(500, 'y')).ok());
  EXPECT_EQ(kv.UsageOf("job-1").bytes, 6u + 400u + 501u);
  // A namespace without '/' is its own job.
  EXPECT_EQ(kv.Set("solo", "k", std::string(601, 'z')).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(kv.Set("solo", "k", std::string(500, 'z')).ok());
  EXPECT_EQ(kv.UsageOf("solo").bytes, 501u);
}

// Found writing //coordinator:store_service_fuzzer (its seed
// counter_overflow fails without the fix): a sum past 64 bits wrapped
// around (undefined behaviour) and was stored.
TEST(KeyValueStoreTest, AddThatWouldOverflowIsRefusedAndChangesNothing) {
  KeyValueStore kv;
  const int64_t max = std::numeric_limits<int64_t>::max();
  ASSERT_EQ(*kv.Add("a", "n", max - 1), max - 1);
  absl::StatusOr<int64_t> over = kv.Add("a", "n", 2);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(over.status().message(), HasSubstr("\"n\""));
  EXPECT_EQ(kv.Get("a", "n"), std::to_string(max - 1));
  EXPECT_EQ(*kv.Add("a", "n", 1), max);
  ASSERT_EQ(*kv.Add("a", "m", std::numeric_limits<int64_t>::min()),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(kv.Add("a", "m", -1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(KeyValueStoreTest, WaitCompletesWhenTheLastKeyArrives) {
  KeyValueStore kv;
  Result r;
  kv.WaitFor("ns", {"0", "1"}, absl::Now() + absl::Seconds(30), r.Callback());
  EXPECT_EQ(kv.pending_waits(), 1u);
  ASSERT_TRUE(kv.Set("ns", "0", "a").ok());
  ASSERT_TRUE(kv.Set("other", "1", "b").ok());  // wrong namespace
  EXPECT_FALSE(r.WaitDone(absl::Milliseconds(50)));
  ASSERT_TRUE(kv.Add("ns", "1", 1).ok());
  ASSERT_TRUE(r.WaitDone(absl::Seconds(5)));
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(r.calls, 1);
  EXPECT_EQ(kv.pending_waits(), 0u);
}

// A coordinator that ran thousands of jobs kept every ended job's keys.
TEST(KeyValueStoreTest, AnEndedJobsKeysAndWaitsGoAndOtherJobsKeepTheirs) {
  KeyValueStore kv;
  ASSERT_TRUE(kv.Set("job-000001/gen-1", "0", "addr").ok());
  ASSERT_TRUE(kv.Set("job-000001/gen-2", "0", "addr").ok());
  ASSERT_TRUE(kv.Set("job-000002/gen-1", "0", "addr").ok());
  Result r;
  kv.WaitFor("job-000001/gen-3", {"0"}, absl::Now() + absl::Seconds(30), r.Callback());
  EXPECT_EQ(kv.Jobs(), (std::vector<std::string>{"job-000001", "job-000002"}));
  kv.DropJob("job-000001");
  EXPECT_EQ(kv.Jobs(), (std::vector<std::string>{"job-000002"}));
  EXPECT_EQ(kv.Get("job-000001/gen-1", "0"), std::nullopt);
  EXPECT_EQ(kv.UsageOf("job-000001").keys, 0u);
  EXPECT_EQ(kv.Get("job-000002/gen-1", "0"), "addr");
  ASSERT_TRUE(r.WaitDone(absl::Seconds(5)));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(r.status.message(), HasSubstr("job job-000001 has ended"));
  EXPECT_EQ(kv.pending_waits(), 0u);
}

TEST(KeyValueStoreTest, AlreadySetCompletesAtOnce) {
  KeyValueStore kv;
  ASSERT_TRUE(kv.Set("ns", "x", "1").ok());
  Result r;
  EXPECT_EQ(kv.WaitFor("ns", {"x"}, absl::Now(), r.Callback()), 0u);
  EXPECT_EQ(r.calls, 1);
  EXPECT_TRUE(r.status.ok());
}

TEST(KeyValueStoreTest, DeadlineFollowsTheClockAndNamesMissingKeys) {
  FakeClock clock(absl::FromUnixSeconds(100));
  KeyValueStore kv(&clock);
  ASSERT_TRUE(kv.Set("job/gen0", "0", "a").ok());
  Result r;
  kv.WaitFor("job/gen0", {"0", "1", "2"}, absl::FromUnixSeconds(110), r.Callback());
  EXPECT_FALSE(r.WaitDone(absl::Milliseconds(100)));
  clock.Advance(absl::Seconds(11));
  ASSERT_TRUE(r.WaitDone(absl::Seconds(5)));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status.message(), HasSubstr("\"job/gen0\": these keys were never set: 1, 2"));
}

TEST(KeyValueStoreTest, CancelAndShutdownFinishEachWaitOnce) {
  Result cancelled, shut;
  {
    KeyValueStore kv;
    uint64_t id = kv.WaitFor("ns", {"x"}, absl::Now() + absl::Hours(1), cancelled.Callback());
    kv.Cancel(id);
    kv.Cancel(id);  // no second callback
    kv.WaitFor("ns", {"y"}, absl::Now() + absl::Hours(1), shut.Callback());
  }
  EXPECT_EQ(cancelled.calls, 1);
  EXPECT_EQ(cancelled.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(shut.calls, 1);
  EXPECT_EQ(shut.status.code(), absl::StatusCode::kUnavailable);
}

TEST(KeyValueStoreTest, ManyConcurrentWaitersAllWake) {
  KeyValueStore kv;
  std::vector<Result> results(200);
  for (auto& r : results) kv.WaitFor("ns", {"go"}, absl::Now() + absl::Seconds(30), r.Callback());
  ASSERT_TRUE(kv.Set("ns", "go", "1").ok());
  for (auto& r : results) {
    ASSERT_TRUE(r.WaitDone(absl::Seconds(5)));
    EXPECT_TRUE(r.status.ok());
  }
}

}  // namespace
}  // namespace chorus
