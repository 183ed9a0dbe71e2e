#include "worker/runtime/progress_channel.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/env_names.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

v1::RankHeartbeat Progress(int64_t step) {
  v1::RankHeartbeat hb;
  hb.set_step(step);
  hb.set_phase(v1::BACKWARD);
  hb.set_loss(0.25 * step);
  return hb;
}

TEST(ProgressChannelTest, TheNewestQueuedRecordComesBack) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ProgressSender sender(pair->program_fd);
  ProgressReceiver receiver(pair->supervisor_fd);
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE(sender.Send(Progress(step)).ok());
  absl::StatusOr<v1::RankHeartbeat> got = receiver.Receive(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step(), 3);
  EXPECT_EQ(got->phase(), v1::BACKWARD);
  EXPECT_DOUBLE_EQ(got->loss(), 0.75);
  // Drained: nothing more until the deadline.
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::RankHeartbeat> none = receiver.Receive(start + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(none.status())) << none.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
}

TEST(ProgressChannelTest, DirectivesGoTheOtherWayInOrderBesideRecords) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ProgressSender sender(pair->program_fd);
  ProgressReceiver receiver(pair->supervisor_fd);
  v1::Directive reform;
  reform.set_kind(v1::Directive::REFORM_AT_STEP_BOUNDARY);
  reform.set_generation(3);
  reform.set_reason("agent a-2 was drained");
  v1::Directive rendezvous;
  rendezvous.set_kind(v1::Directive::RE_RENDEZVOUS);
  rendezvous.set_generation(4);
  ASSERT_TRUE(receiver.SendDirective(reform).ok());
  ASSERT_TRUE(receiver.SendDirective(rendezvous).ok());
  // Records still flow the other way and are not mistaken for directives.
  ASSERT_TRUE(sender.Send(Progress(5)).ok());
  absl::StatusOr<v1::RankHeartbeat> record = receiver.Receive(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->step(), 5);
  absl::StatusOr<v1::Directive> first = sender.ReceiveDirective(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->kind(), v1::Directive::REFORM_AT_STEP_BOUNDARY);
  EXPECT_EQ(first->generation(), 3);
  EXPECT_EQ(first->reason(), "agent a-2 was drained");
  absl::StatusOr<v1::Directive> second = sender.ReceiveDirective(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->kind(), v1::Directive::RE_RENDEZVOUS);
  EXPECT_EQ(second->generation(), 4);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::Directive> none = sender.ReceiveDirective(start + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(none.status())) << none.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
}

// Note [One reader, two kinds]: a directive and a join answer sent while
// one thread waits for directives and another for its join's answer each
// reach the thread waiting for that kind, whichever thread reads them.
TEST(ProgressChannelTest, ADirectiveAndAJoinAnswerEachReachTheThreadWaitingForThem) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ProgressSender rank(pair->program_fd);
  ProgressReceiver agent(pair->supervisor_fd);
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<v1::Directive> directive;
    absl::StatusOr<v1::AgentJoinAnswer> answer;
    std::thread directives(
        [&] { directive = rank.ReceiveDirective(absl::Now() + absl::Seconds(10)); });
    std::thread joins([&] { answer = rank.ReceiveJoinAnswer(absl::Now() + absl::Seconds(10)); });
    absl::SleepFor(absl::Milliseconds(50));  // both waiting (or not: the order must not matter)
    v1::AgentJoinAnswer sent_answer;
    sent_answer.set_asked_generation(2 + round);
    v1::Directive sent_directive;
    sent_directive.set_kind(v1::Directive::RE_RENDEZVOUS);
    sent_directive.set_generation(3 + round);
    // The other kind first in the second round.
    if (round == 0) {
      ASSERT_TRUE(agent.SendJoinAnswer(sent_answer).ok());
      ASSERT_TRUE(agent.SendDirective(sent_directive).ok());
    } else {
      ASSERT_TRUE(agent.SendDirective(sent_directive).ok());
      ASSERT_TRUE(agent.SendJoinAnswer(sent_answer).ok());
    }
    directives.join();
    joins.join();
    ASSERT_TRUE(directive.ok()) << directive.status();
    EXPECT_EQ(directive->generation(), 3 + round);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->asked_generation(), 2 + round);
  }
  // Joins go the other way beside records.
  v1::JoinRequest join;
  join.set_generation(4);
  ASSERT_TRUE(rank.SendJoin(join).ok());
  v1::RankHeartbeat record;
  record.set_step(9);
  ASSERT_TRUE(rank.Send(record).ok());
  absl::StatusOr<v1::RankHeartbeat> newest = agent.Receive(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step(), 9);
  std::vector<v1::JoinRequest> joins = agent.TakeJoins();
  ASSERT_EQ(joins.size(), 1u);
  EXPECT_EQ(joins[0].generation(), 4);
  EXPECT_TRUE(agent.TakeJoins().empty());
}

TEST(ProgressChannelTest, AProgramThatReadsNoDirectivesNeverBlocksItsSupervisor) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ProgressSender sender(pair->program_fd);
  ProgressReceiver receiver(pair->supervisor_fd);
  v1::Directive d;
  d.set_kind(v1::Directive::RE_RENDEZVOUS);
  d.set_reason(std::string(8000, 'x'));
  absl::Status last;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 10000 && last.ok(); ++i) last = receiver.SendDirective(d);
  EXPECT_TRUE(absl::IsResourceExhausted(last)) << last;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(ProgressChannelTest, ReceivingDirectivesFromAClosedSupervisorIsOutOfRange) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ProgressSender sender(pair->program_fd);
  ::close(pair->supervisor_fd);
  absl::StatusOr<v1::Directive> got = sender.ReceiveDirective(absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsOutOfRange(got.status())) << got.status();
}

TEST(ProgressChannelTest, AnEmptyRecordIsARecordNotAClose) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ProgressSender sender(pair->program_fd);
  ProgressReceiver receiver(pair->supervisor_fd);
  ASSERT_TRUE(sender.Send(v1::RankHeartbeat()).ok());
  absl::StatusOr<v1::RankHeartbeat> got = receiver.Receive(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step(), 0);
}

TEST(ProgressChannelTest, CloseIsReportedAfterTheLastRecord) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ProgressReceiver receiver(pair->supervisor_fd);
  {
    ProgressSender sender(pair->program_fd);
    ASSERT_TRUE(sender.Send(Progress(7)).ok());
  }
  absl::StatusOr<v1::RankHeartbeat> got = receiver.Receive(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step(), 7);
  absl::StatusOr<v1::RankHeartbeat> closed = receiver.Receive(absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsOutOfRange(closed.status())) << closed.status();
}

TEST(ProgressChannelTest, ASenderNeverBlocksWhenTheSupervisorIsBehind) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ProgressSender sender(pair->program_fd);
  ProgressReceiver receiver(pair->supervisor_fd);
  v1::RankHeartbeat big = Progress(1);
  big.set_job_id(std::string(8000, 'j'));
  int dropped = 0;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 10000 && dropped == 0; ++i) {
    absl::Status status = sender.Send(big);
    if (absl::IsResourceExhausted(status))
      ++dropped;
    else
      ASSERT_TRUE(status.ok()) << status;
  }
  EXPECT_EQ(dropped, 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The supervisor catches up and the channel works again.
  ASSERT_TRUE(receiver.Receive(absl::Now() + absl::Seconds(5)).ok());
  ASSERT_TRUE(sender.Send(Progress(2)).ok());
  absl::StatusOr<v1::RankHeartbeat> got = receiver.Receive(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step(), 2);
}

TEST(ProgressChannelTest, SendingToAClosedSupervisorIsUnavailable) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ProgressSender sender(pair->program_fd);
  close(pair->supervisor_fd);
  absl::Status status = sender.Send(Progress(1));
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
}

TEST(ProgressChannelTest, AnOversizedRecordIsRefused) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ProgressSender sender(pair->program_fd);
  ProgressReceiver receiver(pair->supervisor_fd);
  v1::RankHeartbeat big;
  big.set_job_id(std::string(kMaxProgressRecordBytes, 'x'));
  absl::Status status = sender.Send(big);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
}

TEST(ProgressChannelTest, AGarbledRecordIsSkipped) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ProgressReceiver receiver(pair->supervisor_fd);
  const char junk[] = "not a record";
  ASSERT_GT(send(pair->program_fd, junk, sizeof(junk), 0), 0);
  absl::StatusOr<v1::RankHeartbeat> got = receiver.Receive(absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  ProgressSender sender(pair->program_fd);
  ASSERT_TRUE(sender.Send(Progress(4)).ok());
  got = receiver.Receive(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step(), 4);
}

TEST(ProgressChannelTest, TheProgramEndSurvivesExecAndIsFoundFromTheEnvironment) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(fcntl(pair->supervisor_fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_EQ(fcntl(pair->program_fd, F_GETFD) & FD_CLOEXEC, 0);
  ProgressReceiver receiver(pair->supervisor_fd);
  // A child process that execs /bin/sh, which writes to the inherited end;
  // garbage, but it proves the descriptor crossed the exec.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::string script = absl::StrCat("printf junk >&", pair->program_fd);
    execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(pair->program_fd);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  absl::StatusOr<v1::RankHeartbeat> got = receiver.Receive(absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  got = receiver.Receive(absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsOutOfRange(got.status())) << got.status();
}

// The exit code of /bin/sh writing to descriptor `fd` after its exec: 0
// when `fd` crossed the exec.
int ExecWritingTo(int fd) {
  const pid_t child = fork();
  if (child == 0) {
    const std::string script = absl::StrCat("printf junk >&", fd, " 2>/dev/null");
    execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int wstatus = 0;
  if (child < 0 || waitpid(child, &wstatus, 0) != child || !WIFEXITED(wstatus)) return -1;
  return WEXITSTATUS(wstatus);
}

// Note [The first join through the agent] (worker/rank_main.cc): chorus-rank
// opens the channel before it joins and hands it on across its exec.
TEST(ProgressChannelTest, AnEndOpenedFromTheEnvironmentCrossesExecOnlyWhenKept) {
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ProgressReceiver receiver(pair->supervisor_fd);
  setenv(kEnvAgentHeartbeatsFd, std::to_string(pair->program_fd).c_str(), 1);
  absl::StatusOr<std::unique_ptr<ProgressSender>> sender =
      ProgressSender::FromVariable(kEnvAgentHeartbeatsFd);
  unsetenv(kEnvAgentHeartbeatsFd);
  ASSERT_TRUE(sender.ok()) << sender.status();
  EXPECT_EQ(fcntl(pair->program_fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_NE(ExecWritingTo(pair->program_fd), 0) << "a child's exec does not inherit it";

  ASSERT_TRUE((*sender)->KeepAcrossExec().ok());
  EXPECT_EQ(fcntl(pair->program_fd, F_GETFD) & FD_CLOEXEC, 0);
  ASSERT_EQ(ExecWritingTo(pair->program_fd), 0);
  absl::StatusOr<v1::RankHeartbeat> got = receiver.Receive(absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << "the exec'd program wrote: " << got.status();
  // The sender still works after the exec of a child.
  ASSERT_TRUE((*sender)->Send(Progress(4)).ok());
  got = receiver.Receive(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step(), 4);
}

TEST(ProgressChannelTest, FromEnvironmentNamesTheVariable) {
  unsetenv(kEnvProgressFd);
  absl::StatusOr<std::unique_ptr<ProgressSender>> none = ProgressSender::FromEnvironment();
  EXPECT_TRUE(absl::IsNotFound(none.status()));
  EXPECT_NE(none.status().message().find("CHORUS_PROGRESS_FD"), std::string::npos);

  setenv(kEnvProgressFd, "seven", 1);
  EXPECT_TRUE(absl::IsInvalidArgument(ProgressSender::FromEnvironment().status()));
  // A descriptor that is open but not a channel: a pipe.
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  setenv(kEnvProgressFd, std::to_string(p[1]).c_str(), 1);
  absl::StatusOr<std::unique_ptr<ProgressSender>> pipe_end = ProgressSender::FromEnvironment();
  EXPECT_TRUE(absl::IsInvalidArgument(pipe_end.status()));
  EXPECT_NE(pipe_end.status().message().find("not an open progress channel"), std::string::npos);
  close(p[0]);
  close(p[1]);

  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  ASSERT_TRUE(pair.ok()) << pair.status();
  setenv(kEnvProgressFd, std::to_string(pair->program_fd).c_str(), 1);
  absl::StatusOr<std::unique_ptr<ProgressSender>> sender = ProgressSender::FromEnvironment();
  ASSERT_TRUE(sender.ok()) << sender.status();
  ProgressReceiver receiver(pair->supervisor_fd);
  ASSERT_TRUE((*sender)->Send(Progress(9)).ok());
  absl::StatusOr<v1::RankHeartbeat> got = receiver.Receive(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step(), 9);
  unsetenv(kEnvProgressFd);
}

}  // namespace
}  // namespace chorus
