#include "worker/agent/rank_cgroup.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

std::string TempDir() {
  std::string pattern = absl::StrCat(::testing::TempDir(), "/cgroupXXXXXX");
  char* dir = ::mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr);
  return pattern;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// A v2 host: the unified mount offers memory, and this process is in
// /system.slice/chorus.service; chorus's cgroups go below that.
TEST(CgroupLayoutTest, UnifiedHierarchy) {
  const std::string root = TempDir();
  Write(root + "/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma\n");
  const CgroupLayout layout = DetectCgroupLayout(
      absl::StrCat("proc /proc proc rw 0 0\ncgroup2 ", root, " cgroup2 rw,nosuid 0 0\n"),
      "0::/system.slice/chorus.service\n");
  EXPECT_EQ(layout.version, 2);
  ASSERT_EQ(layout.parents.size(), 1u);
  EXPECT_EQ(layout.parents.at(""), root + "/system.slice/chorus.service");
}

// The development machines: v1 hierarchies, and a cgroup2 mount without
// controllers beside them (a hybrid host), which must not be taken for v2.
TEST(CgroupLayoutTest, HybridHostUsesV1) {
  const std::string root = TempDir();
  ::mkdir((root + "/unified").c_str(), 0755);
  Write(root + "/unified/cgroup.controllers", "");
  const std::string mounts = absl::StrCat(
      "tmpfs ", root, " tmpfs rw 0 0\n",                               //
      "cgroup ", root, "/cpu cgroup rw,relatime,cpu 0 0\n",            //
      "cgroup ", root, "/cpuset cgroup rw,relatime,cpuset 0 0\n",      //
      "cgroup ", root, "/memory cgroup rw,relatime,memory 0 0\n",      //
      "cgroup ", root, "/pids cgroup rw,relatime,pids 0 0\n",          //
      "cgroup2 ", root, "/unified cgroup2 rw,relatime 0 0\n");
  const CgroupLayout layout = DetectCgroupLayout(
      mounts, "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/4d90\n3:cpuset:/\n0::/\n");
  EXPECT_EQ(layout.version, 1);
  ASSERT_EQ(layout.parents.size(), 3u);
  EXPECT_EQ(layout.parents.at("memory"), root + "/memory/process_api/4d90");
  EXPECT_EQ(layout.parents.at("pids"), root + "/pids");
  EXPECT_EQ(layout.parents.at("cpuset"), root + "/cpuset");
}

// Debian's older layout mounts cpu and cpuacct together; a path with a
// space comes escaped as \040.
TEST(CgroupLayoutTest, CombinedMountsAndEscapedPaths) {
  const CgroupLayout layout = DetectCgroupLayout(
      "cgroup /sys/fs/my\\040cgroups/memory cgroup rw,memory 0 0\n"
      "cgroup /sys/fs/cgroup/cpuset,cpu cgroup rw,cpuset,cpu 0 0\n",
      "5:cpuset,cpu:/a\n4:memory:/\n");
  EXPECT_EQ(layout.version, 1);
  EXPECT_EQ(layout.parents.at("memory"), "/sys/fs/my cgroups/memory");
  EXPECT_EQ(layout.parents.at("cpuset"), "/sys/fs/cgroup/cpuset,cpu/a");
  EXPECT_EQ(layout.parents.count("pids"), 0u);
}

TEST(CgroupLayoutTest, NoMemoryControllerMeansNone) {
  const CgroupLayout layout =
      DetectCgroupLayout("cgroup /x/pids cgroup rw,pids 0 0\nproc /proc proc rw 0 0\n", "1:pids:/\n");
  EXPECT_EQ(layout.version, 0);
  EXPECT_NE(layout.problem.find("memory"), std::string::npos) << layout.problem;
}

// A read-only or foreign hierarchy: the agent's directory cannot be made,
// and RankCgroups says where and why instead of failing the agent.
TEST(RankCgroupsTest, DisabledWhenItCannotCreate) {
  CgroupLayout layout;
  layout.version = 1;
  layout.parents["memory"] = "/proc/self/no-such-dir";
  RankCgroups cgroups(layout, "agent-1");
  EXPECT_FALSE(cgroups.enabled());
  EXPECT_NE(cgroups.why_disabled().find("/proc/self/no-such-dir/chorus"), std::string::npos)
      << cgroups.why_disabled();
  absl::StatusOr<std::unique_ptr<RankCgroup>> rank = cgroups.Create("job-1", "slot-0", {});
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kFailedPrecondition);
}

// On a plain directory standing for a v1 memory hierarchy: where the
// directories go, that names which could escape them are refused, and
// that everything goes again, the agent's directory and chorus/ with it.
TEST(RankCgroupsTest, DirectoriesOnAFakeTree) {
  const std::string root = TempDir();
  CgroupLayout layout;
  layout.version = 1;
  layout.parents["memory"] = root;
  {
    RankCgroups cgroups(layout, "agent-7");
    ASSERT_TRUE(cgroups.enabled()) << cgroups.why_disabled();
    EXPECT_EQ(cgroups.agent_dirs(), std::vector<std::string>{root + "/chorus/agent-7"});
    for (const char* bad : {"..", ".", "", "a/b"}) {
      EXPECT_EQ(cgroups.Create(bad, "slot-0", {}).status().code(),
                absl::StatusCode::kInvalidArgument)
          << bad;
      EXPECT_EQ(cgroups.Create("job-1", bad, {}).status().code(),
                absl::StatusCode::kInvalidArgument)
          << bad;
    }
    absl::StatusOr<std::unique_ptr<RankCgroup>> rank =
        cgroups.Create("job-1", "slot-0-gen-1", {});
    ASSERT_TRUE(rank.ok()) << rank.status();
    EXPECT_EQ((*rank)->procs_files(),
              std::vector<std::string>{root + "/chorus/agent-7/job-1/slot-0-gen-1/cgroup.procs"});
    EXPECT_TRUE(Exists(root + "/chorus/agent-7/job-1/slot-0-gen-1"));
    EXPECT_TRUE((*rank)->Remove().ok());
    EXPECT_FALSE(Exists(root + "/chorus/agent-7/job-1")) << "the job's last rank takes it";
  }
  EXPECT_FALSE(Exists(root + "/chorus")) << "the agent's directory and chorus/ go with it";
}

// The real thing, where this test may: a v1 or v2 cgroup with limits that
// the kernel enforces. Skips unless root with a writable hierarchy.
class RealCgroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "not root: cannot create cgroups";
    cgroups_ = std::make_unique<RankCgroups>(
        RankCgroups::ForThisHost(absl::StrCat("agent-test-", ::getpid())));
    if (!cgroups_->enabled()) {
      GTEST_SKIP() << "cgroups are not writable here: " << cgroups_->why_disabled();
    }
  }

  // Forks a child that joins `group` and runs `body`; its wait status.
  static int RunInside(const RankCgroup& group, void (*body)()) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (const std::string& procs : group.procs_files()) {
        std::ofstream out(procs);
        out << ::getpid();
        out.flush();
        if (!out) ::_exit(100);
      }
      body();
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
  }

  std::unique_ptr<RankCgroups> cgroups_;
};

void AllocateTooMuch() {
  // 256 MiB, touched, against a 64 MiB limit.
  std::vector<char*> blocks;
  for (int i = 0; i < 64; ++i) {
    char* block = static_cast<char*>(std::malloc(4 << 20));
    if (block == nullptr) ::_exit(3);
    std::memset(block, 1, 4 << 20);
    blocks.push_back(block);
  }
  ::_exit(4);
}

TEST_F(RealCgroupTest, MemoryLimitKillsAndIsCounted) {
  absl::StatusOr<std::unique_ptr<RankCgroup>> group =
      cgroups_->Create("job-oom", "slot-0-gen-1", {int64_t{64} << 20, 64, {}});
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->OomKills(), 0);
  const int status = RunInside(**group, AllocateTooMuch);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  EXPECT_GE((*group)->OomKills(), 1);
  const std::vector<std::string> dirs = cgroups_->agent_dirs();
  ASSERT_TRUE((*group)->Remove().ok());
  for (const std::string& dir : dirs) {
    EXPECT_FALSE(Exists(dir + "/job-oom")) << dir << "/job-oom is left";
  }
}

void ForkUntilRefused() {
  // Sleepers, until fork fails; the exit code is how many started.
  int started = 0;
  for (; started < 200; ++started) {
    const pid_t pid = ::fork();
    if (pid < 0) break;
    if (pid == 0) {
      ::sleep(30);
      ::_exit(0);
    }
  }
  ::_exit(started);
}

// pids.max stops a fork storm; removing the cgroup kills the sleepers left
// in it (they are no longer in the test's process group's care).
TEST_F(RealCgroupTest, ProcessLimitStopsForksAndRemoveKillsTheRest) {
  absl::StatusOr<std::unique_ptr<RankCgroup>> group =
      cgroups_->Create("job-forks", "slot-1-gen-1", {0, 16, {}});
  ASSERT_TRUE(group.ok()) << group.status();
  const int status = RunInside(**group, ForkUntilRefused);
  ASSERT_TRUE(WIFEXITED(status)) << "exit status " << status;
  // pids.max counts tasks: the child itself is one of the 16, and so is each
  // sleeper. Under ThreadSanitizer every process has a thread of the
  // runtime's besides, so fewer processes fit.
  EXPECT_GE(WEXITSTATUS(status), 1);
  EXPECT_LE(WEXITSTATUS(status), 15);
#if !defined(__SANITIZE_THREAD__)
  EXPECT_EQ(WEXITSTATUS(status), 15);
#endif
  EXPECT_FALSE(Read((*group)->procs_files()[0]).empty());
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*group)->Remove().ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  for (const std::string& procs : (*group)->procs_files()) EXPECT_FALSE(Exists(procs));
}

TEST_F(RealCgroupTest, CpusAreTheSlots) {
  absl::StatusOr<std::unique_ptr<RankCgroup>> group =
      cgroups_->Create("job-cpus", "slot-0-gen-1", {0, 0, {0}});
  ASSERT_TRUE(group.ok()) << group.status();
  bool found = false;
  for (const std::string& procs : (*group)->procs_files()) {
    const std::string dir = procs.substr(0, procs.rfind('/'));
    if (!Exists(dir + "/cpuset.cpus")) continue;
    found = true;
    EXPECT_EQ(Read(dir + "/cpuset.cpus"), "0\n");
  }
  if (!found) GTEST_SKIP() << "no cpuset controller here";
}

}  // namespace
}  // namespace chorus
