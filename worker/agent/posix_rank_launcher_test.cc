// PosixRankLauncher against real processes (/bin/sh scripts): output lines,
// exit codes and signals, process groups, start failures.
#include "worker/agent/posix_rank_launcher.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <fstream>
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

// Note [Rank cgroups]: the rank's pid goes into each cgroup.procs file
// before the rank is handed back; one that cannot be written fails the
// start, naming the file, and leaves no process behind.
TEST(PosixRankLauncherTest, WritesThePidToCgroupProcsOrFailsTheStart) {
  const std::string procs = absl::StrCat(::testing::TempDir(), "/cgroup.procs");
  std::ofstream(procs) << "";
  RankCommand command = Shell("echo started");
  command.cgroup_procs = {procs};
  PosixRankLauncher launcher;
  absl::StatusOr<std::unique_ptr<RankProcess>> rank = launcher.Start(command);
  ASSERT_TRUE(rank.ok()) << rank.status();
  std::ifstream written(procs);
  std::string pid;
  std::getline(written, pid);
  EXPECT_EQ(pid, std::to_string((*rank)->pid()));
  EXPECT_THAT(AllLines(**rank), ElementsAre("started"));

  command.cgroup_procs = {procs, "/proc/self/no-such-cgroup/cgroup.procs"};
  rank = launcher.Start(command);
  ASSERT_FALSE(rank.ok());
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(rank.status().message(),
              HasSubstr("could not start /bin/sh: joining its cgroup "
                        "(/proc/self/no-such-cgroup/cgroup.procs)"));
  std::ifstream second(procs);
  std::getline(second, pid);
  int spawned = 0;
  ASSERT_TRUE(absl::SimpleAtoi(pid, &spawned));
  EXPECT_TRUE(BecomesDead(spawned)) << "the spawned process was not killed";
}

}  // namespace
}  // namespace chorus
