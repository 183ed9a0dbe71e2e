#include "worker/comm/store.h"

#include <cstdlib>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return std::string(base ? base : "/tmp") + "/" + name;
}

// The behaviour every Store must have, run against each implementation.
void ExerciseStore(Store& store) {
  const absl::Time soon = absl::Now() + absl::Seconds(5);
  ASSERT_TRUE(store.Set("a", std::string("x\0y", 3)).ok());
  absl::StatusOr<std::string> a = store.Get("a", soon);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, std::string("x\0y", 3));  // bytes, not C strings

  ASSERT_TRUE(store.Set("a", "replaced").ok());
  EXPECT_EQ(*store.Get("a", soon), "replaced");

  EXPECT_EQ(*store.Add("n", 5), 5);
  EXPECT_EQ(*store.Add("n", -2), 3);
  EXPECT_EQ(*store.Get("n", soon), "3");
  absl::StatusOr<int64_t> bad = store.Add("a", 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);

  // A key set later by another thread wakes the waiter.
  std::thread setter([&store] {
    absl::SleepFor(absl::Milliseconds(30));
    ASSERT_TRUE(store.Set("late", "v").ok());
  });
  EXPECT_EQ(*store.Get("late", absl::Now() + absl::Seconds(10)), "v");
  setter.join();

  // Missing keys are named when the deadline passes.
  std::vector<std::string> keys = {"a", "missing1", "missing2"};
  absl::Time start = absl::Now();
  absl::Status waited = store.Wait(keys, absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(waited.message(), HasSubstr("missing1, "));
  EXPECT_THAT(waited.message(), HasSubstr("missing2"));
  EXPECT_THAT(std::string(waited.message()), ::testing::Not(HasSubstr(" a,")));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(MemoryStoreTest, Behaves) {
  MemoryStore store;
  ExerciseStore(store);
}

TEST(FileStoreTest, Behaves) {
  auto store = FileStore::Open(TempDir("filestore"));
  ASSERT_TRUE(store.ok()) << store.status();
  ExerciseStore(**store);
}

TEST(PrefixStoreTest, BehavesAndIsolatesNamespaces) {
  MemoryStore base;
  PrefixStore gen1(base, "job/gen1");
  ExerciseStore(gen1);
  PrefixStore gen2(base, "job/gen2");
  EXPECT_EQ(gen2.Get("a", absl::Now()).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*base.Get("job/gen1/a", absl::Now()), "replaced");
}

TEST(MemoryStoreTest, DeadlineFollowsTheInjectedClock) {
  FakeClock clock(absl::FromUnixSeconds(100));
  MemoryStore store(&clock);
  std::thread advancer([&clock] {
    absl::SleepFor(absl::Milliseconds(20));
    clock.Advance(absl::Seconds(30));
  });
  absl::Time real_start = absl::Now();
  absl::StatusOr<std::string> value = store.Get("never", absl::FromUnixSeconds(110));
  advancer.join();
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(value.status().message(), HasSubstr("never"));
  EXPECT_LT(absl::Now() - real_start, absl::Seconds(5));
}

TEST(FileStoreTest, AddIsAtomicAcrossThreads) {
  auto store = FileStore::Open(TempDir("filestore_add"));
  ASSERT_TRUE(store.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&store] {
      for (int i = 0; i < 25; ++i) ASSERT_TRUE((*store)->Add("count", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*(*store)->Get("count", absl::Now()), "100");
}

TEST(FileStoreTest, OpenFailsClearly) {
  auto store = FileStore::Open("/proc/no-such-dir/store");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("/proc/no-such-dir/store"));
}

}  // namespace
}  // namespace chorus
