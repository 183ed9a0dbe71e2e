#include "coordinator/key_value_store.h"

#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>

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
            absl::StatusCode::kInvalidArgument);
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
