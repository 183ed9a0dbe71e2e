#include "coordinator/state/state_dir_lock.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/state_dir_lock_" + name;
}

TEST(StateDirLockTest, CreatesTheDirectoryAndRecordsThePid) {
  const std::string dir = TempDir("create") + "/nested";
  auto lock = StateDirLock::Acquire(dir);
  ASSERT_TRUE(lock.ok()) << lock.status();
  EXPECT_EQ((*lock)->dir(), dir);
  std::ifstream in(dir + "/LOCK");
  std::string pid;
  in >> pid;
  EXPECT_EQ(pid, std::to_string(::getpid()));
}

TEST(StateDirLockTest, SecondLockFailsNamingTheDirectoryAndTheHolder) {
  const std::string dir = TempDir("second");
  auto first = StateDirLock::Acquire(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = StateDirLock::Acquire(dir);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("--state_dir ", dir, " is in use by another coordinator (pid ",
                                     ::getpid(), "); stop it or choose another --state_dir")));
}

TEST(StateDirLockTest, SecondLockWithoutARecordedHolderOmitsThePid) {
  const std::string dir = TempDir("no_holder");
  auto first = StateDirLock::Acquire(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  // A holder that has not written its pid yet (or an older coordinator).
  std::filesystem::resize_file(dir + "/LOCK", 0);
  auto second = StateDirLock::Acquire(dir);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().message(),
            absl::StrCat("--state_dir ", dir,
                         " is in use by another coordinator; stop it or choose another "
                         "--state_dir"));
}

TEST(StateDirLockTest, ReleasedOnDestruction) {
  const std::string dir = TempDir("release");
  {
    auto first = StateDirLock::Acquire(dir);
    ASSERT_TRUE(first.ok()) << first.status();
  }
  auto again = StateDirLock::Acquire(dir);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(StateDirLockTest, EmptyAndUncreatableDirectories) {
  auto empty = StateDirLock::Acquire("");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.status().message(), "--state_dir must not be empty");
  auto proc = StateDirLock::Acquire("/proc/chorus-cannot-exist");
  EXPECT_EQ(proc.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(proc.status().message(),
              HasSubstr("--state_dir /proc/chorus-cannot-exist: cannot create"));
}

}  // namespace
}  // namespace chorus
