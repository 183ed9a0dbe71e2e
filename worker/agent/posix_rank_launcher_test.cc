// PosixRankLauncher against real processes (/bin/sh scripts): output lines,
// exit codes and signals, process groups, start failures, the account, the
// cgroups and the descriptors a rank starts with.
#include "worker/agent/posix_rank_launcher.h"

#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cpu_binding.h"
#include "common/output_limits.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kPatience = absl::Seconds(10);

RankCommand Shell(const std::string& script, std::vector<std::string> env = {}) {
  return RankCommand{{"/bin/sh", "-c", script}, std::move(env)};
}

// Whether `pid` has exited (gone, or a zombie its parent has not reaped).
bool Dead(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return true;
  const size_t name_end = text.rfind(')');
  return name_end == std::string::npos || text.substr(name_end + 2, 1) == "Z";
}

// Polls (bounded by kPatience) until `pid` has exited.
bool BecomesDead(pid_t pid) {
  const absl::Time deadline = absl::Now() + kPatience;
  while (!Dead(pid)) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// Every line until the output ends (bounded by kPatience).
std::vector<std::string> AllLines(RankProcess& process) {
  std::vector<std::string> lines;
  const absl::Time deadline = absl::Now() + kPatience;
  while (true) {
    absl::StatusOr<std::string> line = process.ReadLine(deadline);
    if (!line.ok()) {
      EXPECT_TRUE(absl::IsOutOfRange(line.status())) << line.status();
      return lines;
    }
    lines.push_back(*line);
  }
}

TEST(PosixRankLauncherTest, ReadsStdoutAndStderrAndTheExitCode) {
  PosixRankLauncher launcher;
  auto process = launcher.Start(
      Shell("echo one; echo two >&2; printf \"$CHORUS_JOB_ID\"; exit 3", {"CHORUS_JOB_ID=j-7"}));
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_GT((*process)->pid(), 0);
  EXPECT_THAT(AllLines(**process), ElementsAre("one", "two", "j-7"));
  EXPECT_EQ((*process)->Wait(absl::Now() + kPatience).value_or(-1000), 3);
  // The exit is remembered; signals after it go nowhere.
  (*process)->SignalGroup(SIGKILL);
  EXPECT_EQ((*process)->Wait(absl::Now()).value_or(-1000), 3);
}

// Note [Bounded job output]: a 40 MB line once broke the agent's stream.
TEST(PosixRankLauncherTest, LongLinesAreCutWithoutHoldingThemWhole) {
  constexpr size_t kLong = 40 << 20;
  constexpr size_t kUnterminated = 2 << 20;
  rusage before{};
  ASSERT_EQ(getrusage(RUSAGE_SELF, &before), 0);
  PosixRankLauncher launcher;
  auto process = launcher.Start(Shell(
      absl::StrCat("echo before; head -c ", kLong, " /dev/zero | tr '\\0' x; echo; echo after; ",
                   "head -c ", kUnterminated, " /dev/zero | tr '\\0' y")));
  ASSERT_TRUE(process.ok()) << process.status();
  const std::vector<std::string> lines = AllLines(**process);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "before");
  EXPECT_EQ(lines[1], absl::StrCat(std::string(kMaxOutputLineBytes, 'x'), " [",
                                   kLong - kMaxOutputLineBytes, " bytes of this line dropped]"));
  EXPECT_EQ(lines[2], "after");
  // An unterminated last line is cut the same way.
  EXPECT_EQ(lines[3],
            absl::StrCat(std::string(kMaxOutputLineBytes, 'y'), " [",
                         kUnterminated - kMaxOutputLineBytes, " bytes of this line dropped]"));
  for (const std::string& line : lines) EXPECT_LT(line.size(), kMaxOutputLineBytes + 64);
  EXPECT_EQ((*process)->Wait(absl::Now() + kPatience).value_or(-1000), 0);
  // The line was never held whole: holding it would have taken this
  // process's peak memory up by at least 40 MB.
  rusage after{};
  ASSERT_EQ(getrusage(RUSAGE_SELF, &after), 0);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 8 * 1024) << "KB";
}

TEST(PosixRankLauncherTest, OutputThatIsNotUtf8ArrivesAsUtf8) {
  PosixRankLauncher launcher;
  auto process = launcher.Start(Shell("printf 'caf\\351\\n'"));
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_THAT(AllLines(**process), ElementsAre("caf\xEF\xBF\xBD"));
}

TEST(PosixRankLauncherTest, DeadlinesAreKeptWhileTheProcessIsQuiet) {
  PosixRankLauncher launcher;
  auto process = launcher.Start(Shell("exec sleep 30"));
  ASSERT_TRUE(process.ok()) << process.status();
  const absl::Time start = absl::Now();
  EXPECT_TRUE(
      absl::IsDeadlineExceeded((*process)->ReadLine(start + absl::Milliseconds(100)).status()));
  EXPECT_TRUE(
      absl::IsDeadlineExceeded((*process)->Wait(absl::Now() + absl::Milliseconds(100)).status()));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, absl::Milliseconds(200));
  EXPECT_LT(waited, absl::Seconds(5));
  (*process)->SignalGroup(SIGTERM);
  EXPECT_EQ((*process)->Wait(absl::Now() + kPatience).value_or(-1000), -SIGTERM);
}

// Reads the mask of signals `field` ("SigBlk", "SigIgn") of the process
// that runs it from /proc.
uint64_t SignalMaskOf(RankProcess& process, const std::string& field) {
  for (const std::string& line : AllLines(process)) {
    uint64_t mask = 0;
    if (absl::StartsWith(line, field + ":") &&
        absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line.substr(field.size() + 1)), &mask))
      return mask;
  }
  ADD_FAILURE() << "no " << field << " line";
  return 0;
}

uint64_t Bit(int signal) { return uint64_t{1} << (signal - 1); }

TEST(PosixRankLauncherTest, RankGetsDefaultSignalsAndSigusr1Blocked) {
  // As in chorus-worker: the launching thread blocks SIGINT and SIGTERM (for
  // a signal thread) and the process ignores SIGPIPE.
  sigset_t agent_mask, old_mask;
  sigemptyset(&agent_mask);
  sigaddset(&agent_mask, SIGINT);
  sigaddset(&agent_mask, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &agent_mask, &old_mask), 0);
  struct sigaction ignore {
  }, old_pipe{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGPIPE, &ignore, &old_pipe), 0);

  // grep itself reads its own status: no shell in between to reset masks.
  PosixRankLauncher launcher;
  auto blocked = launcher.Start({{"/bin/grep", "^SigBlk", "/proc/self/status"}, {}});
  auto ignored = launcher.Start({{"/bin/grep", "^SigIgn", "/proc/self/status"}, {}});
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  sigaction(SIGPIPE, &old_pipe, nullptr);
  ASSERT_TRUE(blocked.ok()) << blocked.status();
  ASSERT_TRUE(ignored.ok()) << ignored.status();

  EXPECT_EQ(SignalMaskOf(**blocked, "SigBlk"), Bit(SIGUSR1));
  EXPECT_EQ(SignalMaskOf(**ignored, "SigIgn") & (Bit(SIGTERM) | Bit(SIGINT) | Bit(SIGPIPE)), 0u);
  EXPECT_EQ((*blocked)->Wait(absl::Now() + kPatience).value_or(-1000), 0);
  EXPECT_EQ((*ignored)->Wait(absl::Now() + kPatience).value_or(-1000), 0);
}

TEST(PosixRankLauncherTest, RankAndWhatItStartsRunOnTheCommandsCpusAndTheLauncherKeepsItsOwn) {
  const std::vector<int> own = AllowedCpus();
  ASSERT_FALSE(own.empty());
  const int cpu = own.back();
  PosixRankLauncher launcher;
  // The shell's own mask, then that of a process it starts.
  RankCommand command = Shell(
      "grep ^Cpus_allowed_list /proc/self/status; "
      "sh -c 'grep ^Cpus_allowed_list /proc/self/status'");
  command.cpus = {cpu};
  auto bound = launcher.Start(command);
  ASSERT_TRUE(bound.ok()) << bound.status();
  const std::string expected = absl::StrCat("Cpus_allowed_list:\t", cpu);
  EXPECT_THAT(AllLines(**bound), ElementsAre(expected, expected));
  EXPECT_EQ((*bound)->Wait(absl::Now() + kPatience).value_or(-1000), 0);
  EXPECT_EQ(AllowedCpus(), own);

  // Without CPUs the rank gets the launcher's.
  auto unbound = launcher.Start(Shell("grep ^Cpus_allowed_list /proc/self/status"));
  ASSERT_TRUE(unbound.ok()) << unbound.status();
  EXPECT_THAT(AllLines(**unbound),
              ElementsAre(absl::StrCat("Cpus_allowed_list:\t", FormatCpuList(own))));
  EXPECT_EQ((*unbound)->Wait(absl::Now() + kPatience).value_or(-1000), 0);
}

TEST(PosixRankLauncherTest, ACpuTheMachineLacksStartsTheRankUnbound) {
  const std::vector<int> own = AllowedCpus();
  PosixRankLauncher launcher;
  RankCommand command = Shell("grep ^Cpus_allowed_list /proc/self/status");
  command.cpus = {1023};
  auto process = launcher.Start(command);
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_THAT(AllLines(**process),
              ElementsAre(absl::StrCat("Cpus_allowed_list:\t", FormatCpuList(own))));
  EXPECT_EQ((*process)->Wait(absl::Now() + kPatience).value_or(-1000), 0);
  EXPECT_EQ(AllowedCpus(), own);
}

TEST(PosixRankLauncherTest, ProcessGroupIsSignalledAndKilledWithTheRank) {
  // The shell leads the group; a background sleep is a second member that
  // would outlive the shell if the launcher did not kill the group.
  PosixRankLauncher launcher;
  // (The trap comes after the sleep, which keeps SIGTERM's default, and
  // before the echo, so no SIGTERM can reach the shell before it.)
  auto process = launcher.Start(Shell("sleep 30 & trap '' TERM; echo $!; wait $!"));
  ASSERT_TRUE(process.ok()) << process.status();
  absl::StatusOr<std::string> line = (*process)->ReadLine(absl::Now() + kPatience);
  ASSERT_TRUE(line.ok()) << line.status();
  pid_t sleeper = 0;
  ASSERT_TRUE(absl::SimpleAtoi(*line, &sleeper)) << *line;
  EXPECT_EQ(getpgid(sleeper), (*process)->pid());
  // SIGTERM reaches the sleep (the shell ignores it), the shell's wait
  // returns and the shell exits 143 (128 + SIGTERM) for its child.
  (*process)->SignalGroup(SIGTERM);
  EXPECT_EQ((*process)->Wait(absl::Now() + kPatience).value_or(-1000), 128 + SIGTERM);
  EXPECT_TRUE(BecomesDead(sleeper));
}

TEST(PosixRankLauncherTest, LeftoversOfTheGroupDieWhenTheRankExits) {
  PosixRankLauncher launcher;
  // The background sleep keeps the output pipe open, so read one line only.
  auto process = launcher.Start(Shell("sleep 30 & echo $!; exit 0"));
  ASSERT_TRUE(process.ok()) << process.status();
  absl::StatusOr<std::string> line = (*process)->ReadLine(absl::Now() + kPatience);
  ASSERT_TRUE(line.ok()) << line.status();
  pid_t sleeper = 0;
  ASSERT_TRUE(absl::SimpleAtoi(*line, &sleeper)) << *line;
  EXPECT_EQ((*process)->Wait(absl::Now() + kPatience).value_or(-1000), 0);
  // The sleep is no child of ours; it has to die (killed with the group).
  EXPECT_TRUE(BecomesDead(sleeper)) << "pid " << sleeper << " outlived its rank";
  EXPECT_TRUE(absl::IsOutOfRange((*process)->ReadLine(absl::Now() + kPatience).status()));
}

TEST(PosixRankLauncherTest, SignalReachesTheProcessAlone) {
  PosixRankLauncher launcher;
  auto process =
      launcher.Start(Shell("sleep 30 & trap 'echo term; exit 5' TERM; echo $!; wait $!"));
  ASSERT_TRUE(process.ok()) << process.status();
  absl::StatusOr<std::string> line = (*process)->ReadLine(absl::Now() + kPatience);
  ASSERT_TRUE(line.ok()) << line.status();
  pid_t sleeper = 0;
  ASSERT_TRUE(absl::SimpleAtoi(*line, &sleeper)) << *line;
  (*process)->Signal(SIGTERM);
  line = (*process)->ReadLine(absl::Now() + kPatience);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "term");
  // The other member of the group did not get it...
  EXPECT_FALSE(Dead(sleeper));
  // ...and is killed once the rank's exit has been seen.
  EXPECT_EQ((*process)->Wait(absl::Now() + kPatience).value_or(-1000), 5);
  EXPECT_TRUE(BecomesDead(sleeper)) << "pid " << sleeper << " outlived its rank";
}

TEST(PosixRankLauncherTest, MissingProgramIsNotFoundAndNamed) {
  PosixRankLauncher launcher;
  auto process = launcher.Start(RankCommand{{"/nonexistent/chorus-rank"}, {}});
  ASSERT_FALSE(process.ok());
  EXPECT_TRUE(absl::IsNotFound(process.status())) << process.status();
  EXPECT_THAT(process.status().message(),
              HasSubstr("could not start /nonexistent/chorus-rank: No such file or directory"));
  EXPECT_TRUE(absl::IsInvalidArgument(launcher.Start(RankCommand{}).status()));
}

TEST(PosixRankLauncherTest, DestroyingARunningProcessKillsAndReapsIt) {
  PosixRankLauncher launcher;
  pid_t pid = 0;
  {
    auto process = launcher.Start(Shell("exec sleep 30"));
    ASSERT_TRUE(process.ok()) << process.status();
    pid = (*process)->pid();
  }
  // Killed and reaped, not left a zombie: the pid is gone.
  EXPECT_FALSE(std::ifstream("/proc/" + std::to_string(pid) + "/stat").good());
}

// The uid and gid the tests run a rank as when they are root: nobody's.
constexpr uid_t kNobody = 65534;

TEST(PosixRankLauncherTest, TheRankRunsAsTheAccountGivenWithoutSupplementaryGroups) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to start a process as another uid";
  PosixRankLauncher launcher;
  RankCommand command = Shell("id -u; id -g; id -G; grep ^Uid /proc/self/status");
  command.account = RankCommand::Account{kNobody, kNobody};
  auto process = launcher.Start(command);
  ASSERT_TRUE(process.ok()) << process.status();
  // Real, effective, saved and filesystem uid alike: nothing brings root back.
  EXPECT_THAT(AllLines(**process),
              ElementsAre("65534", "65534", "65534", "Uid:\t65534\t65534\t65534\t65534"));
  EXPECT_EQ((*process)->Wait(absl::Now() + kPatience).value_or(-1000), 0);
}

// Note [Starting a rank]: a descriptor the launcher holds open without
// close-on-exec (as the agent holds sockets and files a library opened)
// reaches the rank only when the command names it.
TEST(PosixRankLauncherTest, NoDescriptorOfTheLauncherReachesTheRankButThoseNamed) {
  const int leaked = open("/dev/null", O_RDONLY);
  const int passed = open("/dev/null", O_RDONLY);
  ASSERT_GE(leaked, 3);
  ASSERT_GE(passed, 3);
  PosixRankLauncher launcher;
  // ls runs as the shell's child and lists the shell's descriptors.
  RankCommand command = Shell("ls /proc/$$/fd");
  auto bare = launcher.Start(command);
  command.inherit_fds = {passed};
  auto with_one = launcher.Start(command);
  close(leaked);
  close(passed);
  ASSERT_TRUE(bare.ok()) << bare.status();
  ASSERT_TRUE(with_one.ok()) << with_one.status();
  EXPECT_THAT(AllLines(**bare), ElementsAre("0", "1", "2"));
  EXPECT_THAT(AllLines(**with_one), ElementsAre("0", "1", "2", std::to_string(passed)));
  EXPECT_EQ((*bare)->Wait(absl::Now() + kPatience).value_or(-1000), 0);
  EXPECT_EQ((*with_one)->Wait(absl::Now() + kPatience).value_or(-1000), 0);
}

// Runs `check` in a child process that is not root (it drops to nobody if
// the test runs as root) and returns what it printed; empty if it passed.
std::string AsUnprivileged(const std::function<std::string()>& check) {
  int out[2];
  if (pipe(out) != 0) return "pipe failed";
  const pid_t child = fork();
  if (child == 0) {
    close(out[0]);
    std::string problem;
    if (geteuid() == 0 &&
        (setgroups(0, nullptr) != 0 || setresgid(kNobody, kNobody, kNobody) != 0 ||
         setresuid(kNobody, kNobody, kNobody) != 0)) {
      problem = "could not drop to nobody";
    } else {
      problem = check();
    }
    ssize_t unused = write(out[1], problem.data(), problem.size());
    (void)unused;
    _exit(0);
  }
  close(out[1]);
  std::string printed;
  char buffer[512];
  for (ssize_t n; (n = read(out[0], buffer, sizeof(buffer))) > 0;) printed.append(buffer, n);
  close(out[0]);
  int status = 0;
  waitpid(child, &status, 0);
  return printed;
}

TEST(PosixRankLauncherTest, AnAccountTheLauncherMayNotTakeFailsTheStartSayingWhy) {
  const std::string problem = AsUnprivileged([]() -> std::string {
    PosixRankLauncher launcher;
    RankCommand command = Shell("echo started");
    command.account = RankCommand::Account{geteuid() + 1, getegid() + 1};
    auto process = launcher.Start(command);
    if (process.ok()) return "it started as another uid";
    const std::string expected = absl::StrCat("could not start /bin/sh: setgroups(0) to uid ",
                                              geteuid() + 1, " gid ", getegid() + 1,
                                              ": Operation not permitted (only an agent running "
                                              "as root may run ranks as another account)");
    if (!absl::IsPermissionDenied(process.status()) || process.status().message() != expected) {
      return absl::StrCat("got ", process.status().ToString(), "; want ", expected);
    }
    return "";
  });
  EXPECT_EQ(problem, "");
}

TEST(PosixRankLauncherTest, TheChildWritesItsPidIntoEachCgroupProcsOrDoesNotStart) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string first = dir + "/first.cgroup.procs";
  const std::string second = dir + "/second.cgroup.procs";
  for (const std::string& path : {first, second}) std::ofstream(path).close();
  PosixRankLauncher launcher;
  RankCommand command = Shell("echo $$");
  command.cgroup_procs = {first, second};
  auto process = launcher.Start(command);
  ASSERT_TRUE(process.ok()) << process.status();
  const std::string pid = std::to_string((*process)->pid());
  EXPECT_THAT(AllLines(**process), ElementsAre(pid));
  EXPECT_EQ((*process)->Wait(absl::Now() + kPatience).value_or(-1000), 0);
  for (const std::string& path : {first, second}) {
    std::string written;
    std::getline(std::ifstream(path), written);
    EXPECT_EQ(written, pid) << path;
  }

  command.cgroup_procs = {first, dir + "/gone/cgroup.procs"};
  auto refused = launcher.Start(command);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsNotFound(refused.status())) << refused.status();
  EXPECT_EQ(refused.status().message(),
            absl::StrCat("could not start /bin/sh: cannot join the cgroup ", dir,
                         "/gone/cgroup.procs: No such file or directory"));
}

}  // namespace
}  // namespace chorus
