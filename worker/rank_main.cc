// chorus-rank: one rank of a job, started by the node agent (chorus-worker).
//
// It joins the job's generation at the coordinator and becomes what the job
// needs:
//   - for a `program` job, the supervisor of the spec's program
//     (worker/runtime/program_supervisor.h, docs/programs.md): it starts the
//     program as its child, heartbeats for it and exits with its exit code;
//   - for a built-in training job, chorus-trainer (beside this binary,
//     worker/trainer_main.cc), which it executes in its own place: the same
//     pid, process group and standard streams, the JoinResponse passed in
//     the file CHORUS_RANK_JOINED.
// This binary does not link LibTorch: a program's supervisor starts in a few
// milliseconds and holds a few megabytes instead of LibTorch's hundreds
// (Note [Two binaries for a rank]).
//
// Configuration comes from the environment the agent sets:
//   CHORUS_COORDINATOR  HOST:PORT of the coordinator, or a list a:p,b:p (follow the leader)
//   CHORUS_JOB_ID, CHORUS_GENERATION, CHORUS_AGENT_ID, CHORUS_SLOT
//   CHORUS_RANK_HOST    the address this rank's traffic uses (default 127.0.0.1)
//   CHORUS_TOKEN, CHORUS_TLS_CA, CHORUS_TLS_CERT, CHORUS_TLS_KEY  credentials
//
// Note [Two binaries for a rank]
// The agent cannot tell a program job from a built-in one when it starts a
// rank (a launch order names the job, not its spec), and a rank learns its
// job's spec only from its Join. LibTorch costs about 0.35 s of loading and
// 170 MB resident before main() runs (its operator registry is built by
// static initializers), which every restart of a program job paid twice:
// once in the supervisor, once in the program. So the rank joins in a
// process without LibTorch and, when it has to train, executes the trainer:
// exec keeps the pid the coordinator knows the rank by and the process group
// the agent signals, and SIGUSR1 stays blocked across it until the trainer
// has installed its handler, as it was when the agent started the rank.
//
// Note [The first join through the agent]
// The first join of a rank (generation 1, or the one a newcomer to an
// elastic job is launched for) goes through its node agent's channel when
// the agent takes joins, as a re-formation's does (Note
// [Joins gathered by the agent] in worker/agent/agent.cc): at 16,384 ranks that is one RankJoins
// per agent instead of one Join per rank. This process opens its end of the
// channel once, before it joins, and keeps it for whatever it becomes:
//   - a program's supervisor heartbeats and relays the program's joins over
//     the same ProgressSender (one reader of the descriptor);
//   - before it executes the trainer it clears the descriptor's
//     close-on-exec flag (opening it set the flag, so that a program's
//     children do not inherit it), and the trainer opens it again from
//     CHORUS_AGENT_HEARTBEATS_FD. What this process read from the channel
//     and left unread stays behind, which loses nothing the trainer needs:
//     directives answer heartbeats, and this process sent none; a join
//     answer the trainer reads is matched to its own attempt. If the flag
//     cannot be cleared, the variable is removed, so the trainer heartbeats
//     on its own stream rather than read whatever takes that number.
// A rank without the channel, or whose agent cannot carry the join, joins
// with its own RankService.Join (GenerationJoiner's fallback).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/auth.h"
#include "common/env_names.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/output_limits.h"
#include "common/paths.h"
#include "glog/logging.h"
#include "worker/comm/grpc_store.h"
#include "worker/runtime/heartbeat_stream.h"
#include "worker/runtime/join_generation.h"
#include "worker/runtime/program_supervisor.h"

namespace chorus {
namespace {

std::string Env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// Note [Rank error record] in common/output_limits.h.
int Fail(const std::string& message) {
  std::cerr << RankErrorRecord(message) << std::endl;
  return 1;
}

// SIGUSR1 (`chorus checkpoint`) and SIGTERM while supervising a program:
// counted here, passed on to the program by the supervisor.
std::atomic<int64_t> g_checkpoint_requests{0};
std::atomic<int64_t> g_terminate_requests{0};

void OnCheckpointSignal(int) { g_checkpoint_requests.fetch_add(1); }
void OnTerminateSignal(int) { g_terminate_requests.fetch_add(1); }

void Handle(int signal, void (*handler)(int)) {
  struct sigaction action = {};
  action.sa_handler = handler;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(signal, &action, nullptr);
}

// A program job (docs/programs.md): this process runs the spec's program as
// its child and supervises it; it exits with the program's exit code (128 +
// N when signal N killed it).
int SuperviseProgram(const v1::JoinResponse& joined, const std::shared_ptr<grpc::Channel>& channel,
                     v1::RankService::Stub& ranks, const std::string& job_id,
                     const std::string& coordinator, std::shared_ptr<ProgressSender> agent) {
  Handle(SIGTERM, OnTerminateSignal);
  Handle(SIGUSR1, OnCheckpointSignal);
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigprocmask(SIG_UNBLOCK, &usr1, nullptr);
  GrpcStore store(channel, joined.store_namespace());
  ProgramSupervisor::Options options;
  options.rank = {joined, job_id, coordinator, Env(kEnvRankHost, "127.0.0.1"), ::getpid()};
  options.store = &store;
  options.ranks = &ranks;
  options.agent_heartbeats = std::move(agent);
  options.terminate_requests = &g_terminate_requests;
  options.checkpoint_requests = &g_checkpoint_requests;
  ProgramSupervisor supervisor(std::move(options));
  absl::StatusOr<ProgramOutcome> outcome = supervisor.Run();
  if (!outcome.ok()) return Fail(std::string(outcome.status().message()));
  // A program that exited with a code has said why in its own last lines,
  // which stay the last ones the agent saw; a signal leaves no such line.
  if (outcome->signaled) {
    std::cerr << RankErrorRecord(outcome->ToStatus(joined.spec().program().argv(0)).message())
              << std::endl;
  }
  return outcome->ExitCode();
}

// A built-in training job: chorus-trainer in this process's place, with
// this process's end of the agent's channel (`agent`, may be null).
int BecomeTrainer(const v1::JoinResponse& joined, char** argv, ProgressSender* agent) {
  const std::string dir = Env("TMPDIR", "/tmp");
  absl::StatusOr<std::string> file = WriteJoinFile(dir, joined);
  if (!file.ok()) return Fail(std::string(file.status().message()));
  setenv(kEnvRankJoined, file->c_str(), 1);
  if (agent != nullptr) {
    if (absl::Status kept = agent->KeepAcrossExec(); !kept.ok()) {
      LOG(WARNING) << "the trainer sends its heartbeats to the coordinator itself: "
                   << kept.message();
      unsetenv(kEnvAgentHeartbeatsFd);
    }
  }
  const std::string trainer = CompanionBinary(ExecutableDir(), "chorus-trainer", "worker");
  std::vector<char*> args = {const_cast<char*>(trainer.c_str())};
  for (char** a = argv + 1; *a != nullptr; ++a) args.push_back(*a);
  args.push_back(nullptr);
  ::execv(trainer.c_str(), args.data());
  const int error = errno;
  ::unlink(file->c_str());
  return Fail(absl::StrCat("cannot execute ", trainer, " (the built-in trainer, installed beside ",
                           "chorus-rank): ", std::strerror(error)));
}

int Run(char** argv) {
  absl::StatusOr<RankLaunch> launch = RankLaunchFromEnvironment();
  if (!launch.ok()) return Fail(std::string(launch.status().message()));
  absl::StatusOr<ClientSecurity> security = LoadClientSecurity("", "", "", "");
  if (!security.ok()) return Fail(std::string(security.status().message()));
  ConfigureClient(*std::move(security));
  auto channel = MakeCoordinatorChannel(launch->coordinator);
  auto ranks = v1::RankService::NewStub(channel);
  v1::JoinRequest join = launch->join;
  // A program's supervisor can start it before its generation forms (Note
  // [Staged growth] in coordinator/scheduling/staged_growth.h).
  join.set_starts_program_first(true);
  // Note [The first join through the agent].
  std::shared_ptr<ProgressSender> agent = AgentChannelFromEnvironment();
  GenerationJoiner joiner(*ranks, AgentJoinChannel(agent));
  // A newcomer to an elastic job does not know yet that the job is elastic:
  // it joins again while its generation forms or is superseded.
  absl::StatusOr<v1::JoinResponse> joined =
      joiner.Join(join, absl::Now() + absl::Minutes(10), join.generation() > 1);
  if (!joined.ok()) return Fail(std::string(joined.status().message()));
  if (joined->spec().has_program()) {
    return SuperviseProgram(*joined, channel, *ranks, join.job_id(), launch->coordinator,
                            std::move(agent));
  }
  return BecomeTrainer(*joined, argv, agent.get());
}

}  // namespace
}  // namespace chorus

int main(int argc, char** argv) {
  chorus::InitRankLogging(argv[0], 0);
  // SIGTERM is how the agent stops a rank: a normal exit, not a crash report.
  signal(SIGTERM, SIG_DFL);
  signal(SIGPIPE, SIG_IGN);
  return chorus::Run(argv);
}
