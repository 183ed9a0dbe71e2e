// Multi-process: kill -9 one rank in the middle of all-reduces. The survivors
// must see UNAVAILABLE within the op deadline, Abort, and build a working
// communicator among themselves in the same processes.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/store.h"

extern char** environ;

namespace chorus {
namespace {

using ::testing::StartsWith;

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  return pid;
}

// Waits up to `timeout` for `pid`; kills it if it is still running. Returns
// the exit status, or -1 on timeout.
int WaitFor(pid_t pid, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// Param: CHORUS_GLOO_SHM for the ranks — "1": the ranks, all on this host,
// all-reduce through shared memory and must notice the death through the
// process itself; "0": TCP, where the kernel closes the victim's sockets.
class GlooKillTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GlooKillTest, SurvivorsSeeUnavailableAndRebuild) {
  ASSERT_EQ(setenv("CHORUS_GLOO_SHM", GetParam().c_str(), 1), 0);
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/kill_store_shm", GetParam());
  auto store = FileStore::Open(dir);
  ASSERT_TRUE(store.ok());
  const std::string helper = "worker/comm/comm_rank_helper";
  const int size = 3;
  const int victim = 2;
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    pids.push_back(Spawn({helper, "--rank", std::to_string(r), "--size", std::to_string(size),
                          "--store", dir, "--mode", "survive_kill"}));
  }
  std::vector<std::string> ready;
  for (int r = 0; r < size; ++r) ready.push_back(absl::StrCat("ready/", r));
  ASSERT_TRUE((*store)->Wait(ready, absl::Now() + absl::Seconds(60)).ok());
  absl::SleepFor(absl::Milliseconds(200));  // mid-loop

  ASSERT_TRUE((*store)->Set("killed_at_us", std::to_string(absl::ToUnixMicros(absl::Now()))).ok());
  ASSERT_EQ(kill(pids[victim], SIGKILL), 0);
  EXPECT_EQ(WaitFor(pids[victim], absl::Seconds(10)), 128 + SIGKILL);
  ASSERT_TRUE((*store)->Set("survivors", "0,1").ok());

  for (int r = 0; r < size; ++r) {
    if (r == victim) continue;
    EXPECT_EQ(WaitFor(pids[r], absl::Seconds(60)), 0) << "rank " << r;
    auto result = (*store)->Get(absl::StrCat("result/", r), absl::Now() + absl::Seconds(1));
    ASSERT_TRUE(result.ok()) << "rank " << r << ": " << result.status();
    std::cout << "rank " << r << ": " << *result << "\n";
    EXPECT_THAT(*result, StartsWith("UNAVAILABLE "));
    EXPECT_THAT(*result, ::testing::HasSubstr(" ok |"));
    // Detected within the 20 s op deadline (in practice milliseconds).
    int64_t ms = std::stoll(result->substr(result->find(' ') + 1));
    EXPECT_LT(ms, 20000);
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, GlooKillTest, ::testing::Values("1", "0"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "1" ? std::string("Shm") : std::string("Tcp");
                         });

}  // namespace
}  // namespace chorus
