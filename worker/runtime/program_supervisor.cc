#include "worker/runtime/program_supervisor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/env_names.h"
#include "common/grpc_util.h"
#include "common/paths.h"
#include "common/program_spec.h"
#include "common/retry.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"
#include "worker/runtime/heartbeat_stream.h"
#include "worker/runtime/join_generation.h"
#include "worker/runtime/join_relay.h"
#include "worker/runtime/progress_channel.h"

extern char** environ;

namespace chorus {
namespace {

std::string Errno(int err) { return std::strerror(err); }

// What a child that could not exec writes to its parent.
struct ExecFailure {
  int stage;  // 0: entering the working directory, 1: exec
  int error;
};

// Starts `binary` with `argv` and `env` in `dir` (empty: here) as a child
// in this process group, stdout/stderr inherited, with an empty signal mask
// and default dispositions for the signals the supervisor handles.
absl::StatusOr<pid_t> StartChild(const std::string& binary, const std::vector<std::string>& argv,
                                 const std::vector<std::string>& env, const std::string& dir) {
  // Everything the child needs is prepared before fork: between fork and
  // exec only async-signal-safe calls are allowed (other threads may hold
  // the allocator's locks).
  std::vector<char*> argv_c, env_c;
  for (const std::string& a : argv) argv_c.push_back(const_cast<char*>(a.c_str()));
  argv_c.push_back(nullptr);
  for (const std::string& e : env) env_c.push_back(const_cast<char*>(e.c_str()));
  env_c.push_back(nullptr);
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("cannot create a pipe: ", Errno(errno)));
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(report[0]);
    ::close(report[1]);
    return absl::ResourceExhaustedError(absl::StrCat("cannot fork the program: ", Errno(err)));
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig : {SIGTERM, SIGUSR1, SIGPIPE, SIGINT}) ::sigaction(sig, &dfl, nullptr);
    ExecFailure failure{0, 0};
    if (!dir.empty() && ::chdir(dir.c_str()) != 0) {
      failure.error = errno;
    } else {
      ::execve(binary.c_str(), argv_c.data(), env_c.data());
      failure = {1, errno};
    }
    (void)!::write(report[1], &failure, sizeof(failure));
    ::_exit(127);
  }
  ::close(report[1]);
  ExecFailure failure{0, 0};
  ssize_t n;
  do {
    n = ::read(report[0], &failure, sizeof(failure));
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n != static_cast<ssize_t>(sizeof(failure))) return pid;  // exec closed the pipe
  int status;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (failure.stage == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("program.working_dir: cannot enter ", dir, ": ", Errno(failure.error)));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("program.argv[0]: cannot execute ", binary, ": ", Errno(failure.error)));
}

// The joins the program sent, to `relay`; dropped without one (the program
// was not told that joins may go this way).
void RelayJoins(ProgressReceiver& program, JoinRelay* relay) {
  for (v1::JoinRequest& join : program.TakeJoins()) {
    if (relay != nullptr) relay->Relay(std::move(join));
  }
}

}  // namespace

std::vector<std::string> ProgramEnvironment(const std::vector<std::string>& base,
                                            const ProgramRank& rank, const HostPort& master,
                                            const std::string& join_file, int progress_fd) {
  // Later entries replace earlier ones of the same name; the order of
  // first appearance is kept so the environment reads like the base one.
  std::vector<std::string> names;
  std::map<std::string, std::string> values;
  auto set = [&](const std::string& name, const std::string& value) {
    if (values.emplace(name, value).second) {
      names.push_back(name);
    } else {
      values[name] = value;
    }
  };
  for (const std::string& entry : base) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    // The supervisor's own channel to its agent, which the program does not
    // inherit.
    if (entry.compare(0, eq, kEnvAgentHeartbeatsFd) == 0) continue;
    // Whether its own channel takes joins is the supervisor's to say.
    if (entry.compare(0, eq, kEnvAgentJoins) == 0) continue;
    set(entry.substr(0, eq), entry.substr(eq + 1));
  }
  const v1::JoinResponse& j = rank.joined;
  // In name order, so that the result does not depend on the map's.
  std::map<std::string, std::string> user(j.spec().program().env().begin(),
                                          j.spec().program().env().end());
  for (const auto& [name, value] : user) set(name, value);
  set("RANK", std::to_string(j.rank()));
  set("WORLD_SIZE", std::to_string(j.world_size()));
  set("LOCAL_RANK", std::to_string(j.local_rank()));
  set("LOCAL_WORLD_SIZE", std::to_string(j.local_world_size()));
  // A staged newcomer starts before its generation has a master address
  // (Note [Staged growth] in coordinator/scheduling/staged_growth.h).
  if (!j.staged()) {
    set("MASTER_ADDR", master.host);
    set("MASTER_PORT", std::to_string(master.port));
  }
  // Note [torchrun's variables] in program_supervisor.h.
  set("GROUP_RANK", std::to_string(j.group_rank()));
  set("GROUP_WORLD_SIZE", std::to_string(j.group_world_size()));
  set("ROLE_NAME", kProgramRoleName);
  set("ROLE_RANK", std::to_string(j.rank()));
  set("ROLE_WORLD_SIZE", std::to_string(j.world_size()));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(j.restarts()));
  set("TORCHELASTIC_MAX_RESTARTS",
      std::to_string(j.spec().has_elastic() ? j.spec().elastic().max_restarts() : 0));
  set("TORCHELASTIC_RUN_ID", rank.job_id);
  set("TORCHELASTIC_USE_AGENT_STORE", "False");
  if (values.count("NCCL_ASYNC_ERROR_HANDLING") == 0) set("NCCL_ASYNC_ERROR_HANDLING", "1");
  set(kEnvCoordinator, rank.coordinator);
  set(kEnvJobId, rank.job_id);
  set(kEnvGeneration, std::to_string(j.generation()));
  set(kEnvRank, std::to_string(j.rank()));
  set(kEnvWorldSize, std::to_string(j.world_size()));
  set(kEnvStoreNamespace, j.store_namespace());
  set(kEnvRankHost, rank.rank_host);
  set(kEnvJoinFile, join_file);
  if (rank.supervisor_pid > 0) set(kEnvRankPid, std::to_string(rank.supervisor_pid));
  if (progress_fd >= 0) set(kEnvProgressFd, std::to_string(progress_fd));
  std::vector<std::string> env;
  env.reserve(names.size());
  for (const std::string& name : names) env.push_back(absl::StrCat(name, "=", values[name]));
  return env;
}

ProgramOutcome ProgramOutcome::FromWaitStatus(pid_t pid, int wait_status) {
  ProgramOutcome outcome;
  outcome.pid = pid;
  if (WIFSIGNALED(wait_status)) {
    outcome.signaled = true;
    outcome.signal = WTERMSIG(wait_status);
  } else {
    outcome.exit_code = WEXITSTATUS(wait_status);
  }
  return outcome;
}

absl::Status ProgramOutcome::ToStatus(const std::string& program) const {
  if (ok()) return absl::OkStatus();
  const std::string who = absl::StrCat("the program ", program, " (pid ", pid, ")");
  if (signaled) {
    const char* name = ::strsignal(signal);
    return absl::UnknownError(absl::StrCat(who, " was killed by signal ", signal,
                                           name != nullptr ? absl::StrCat(" (", name, ")") : ""));
  }
  return absl::UnknownError(absl::StrCat(who, " exited with code ", exit_code));
}

v1::ReportRequest FinalReport(const ProgramRank& rank, const ProgramOutcome& outcome,
                              const std::string& program, const v1::RankHeartbeat& newest) {
  v1::ReportRequest request;
  request.set_job_id(rank.job_id);
  request.set_generation(rank.joined.generation());
  request.set_rank(rank.joined.rank());
  request.set_final(true);
  const absl::Status status = outcome.ToStatus(program);
  request.set_success(status.ok());
  request.set_error(std::string(status.message()));
  if (newest.step() > 0) {
    v1::Metrics& m = *request.mutable_metrics();
    m.set_step(newest.step());
    m.set_epoch(newest.epoch());
    m.set_loss(newest.loss());
    m.set_samples_per_second(newest.samples_per_second());
  }
  return request;
}

bool IsProcessStopped(pid_t pid) {
  // The process may be reaped between open and read: then it is not stopped.
  const std::string stat = ReadSmallFile(absl::StrCat("/proc/", pid, "/stat")).value_or("");
  // "PID (COMM) STATE ...": COMM may hold spaces and parentheses, so the
  // state is after the last ')'.
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  const char state = stat[paren + 2];
  return state == 'T' || state == 't';
}

bool CatchesSignal(pid_t pid, int signal) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("SigCgt:", 0) != 0) continue;
    uint64_t mask = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line.substr(7)), &mask)) return false;
    return signal >= 1 && signal <= 64 && ((mask >> (signal - 1)) & 1) != 0;
  }
  return false;
}

ProgramSupervisor::ProgramSupervisor(Options options) : options_(std::move(options)) {}

absl::Status ProgramSupervisor::SendFinalReport(const v1::ReportRequest& request,
                                                absl::Duration deadline) {
  RetryOptions retry;
  retry.deadline = deadline;
  retry.attempt_timeout = std::min(absl::Seconds(10), deadline);
  retry.max_backoff = absl::Seconds(1);
  return Retry(retry, [&](absl::Time attempt_deadline) {
    v1::ReportResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(attempt_deadline));
    context.set_wait_for_ready(true);
    return FromGrpcStatus(options_.ranks->Report(&context, request, &response));
  });
}

// The newest record the program sent and when it came, and whether the
// coordinator aborted the rank: written by the supervising loop and the
// heartbeat stream's directive callback, read by the heartbeat composer.
class ProgramSupervisor::Progress {
 public:
  void Record(v1::RankHeartbeat record) {
    absl::MutexLock lock(&mu_);
    record_ = std::move(record);
    received_ = absl::Now();
  }
  void Abort() {
    absl::MutexLock lock(&mu_);
    abort_ = true;
  }
  v1::RankHeartbeat Newest() const {
    absl::MutexLock lock(&mu_);
    return record_;
  }
  // Whether a record so far said the program re-forms in its own process.
  bool ReformsInProcess() const {
    absl::MutexLock lock(&mu_);
    return record_.reforms_in_process();
  }
  bool aborted() const {
    absl::MutexLock lock(&mu_);
    return abort_;
  }
  // The heartbeat of `rank` now: the program's newest record, its phase
  // seconds counted on to now, and the rank's job, generation and rank
  // unless the program joined a newer generation.
  v1::RankHeartbeat Heartbeat(const ProgramRank& rank) const {
    v1::RankHeartbeat hb;
    const absl::Time now = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      hb = record_;
      // The program said how long it had been in its phase when it sent
      // the record; it has been there since.
      if (hb.phase() != v1::PHASE_UNSPECIFIED) {
        hb.set_phase_seconds(hb.phase_seconds() + absl::ToDoubleSeconds(now - received_));
      }
    }
    hb.set_job_id(rank.job_id);
    // An elastic program that joined a newer generation says so, and so
    // does a staged newcomer's program once it has joined its own (its
    // rank is the coordinator's answer, not the planned one).
    if (hb.generation() < rank.joined.generation()) {
      hb.set_generation(rank.joined.generation());
      hb.set_rank(rank.joined.rank());
    }
    hb.clear_left_job();
    hb.set_time_us(absl::ToUnixMicros(now));
    return hb;
  }
  // The membership the program ended in (a newer generation it joined),
  // and whether it left the job at a drain.
  ProgramRank LastMembership(const ProgramRank& rank, bool* left) const {
    ProgramRank last = rank;
    absl::MutexLock lock(&mu_);
    if (record_.generation() >= rank.joined.generation()) {
      last.joined.set_generation(record_.generation());
      last.joined.set_rank(record_.rank());
    }
    *left = record_.left_job();
    return last;
  }

 private:
  mutable absl::Mutex mu_;
  v1::RankHeartbeat record_ ABSL_GUARDED_BY(mu_);
  absl::Time received_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool abort_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status ProgramSupervisor::Refuse(const absl::Status& why, const std::string& shown) {
  ProgramOutcome not_started;
  not_started.exit_code = 1;
  v1::ReportRequest request = FinalReport(options_.rank, not_started, shown);
  request.set_error(std::string(why.message()));
  if (absl::Status s = SendFinalReport(request, options_.report_deadline); !s.ok()) {
    LOG(WARNING) << "final report: " << s.message();
  }
  return why;
}

absl::StatusOr<ProgramSupervisor::Launched> ProgramSupervisor::Launch(const std::string& binary) {
  const ProgramRank& rank = options_.rank;
  const v1::ProgramSpec& program = rank.joined.spec().program();
  if (binary.empty()) {
    return absl::InvalidArgumentError(
        "program.argv[0]: neither an absolute path nor one under an absolute working_dir");
  }
  HostPort master;
  if (!rank.joined.staged()) {
    ASSIGN_OR_RETURN(master, AgreeMasterAddress(*options_.store, rank.joined.rank(),
                                                rank.rank_host, absl::Now() + options_.master_wait));
  }
  std::string dir = options_.join_file_dir;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  Launched launched;
  ASSIGN_OR_RETURN(launched.join_file.path, WriteJoinFile(dir, rank.joined));
  ASSIGN_OR_RETURN(ProgressChannelPair channel, CreateProgressChannel());
  launched.receiver = std::make_unique<ProgressReceiver>(channel.supervisor_fd);
  std::vector<std::string> base = options_.base_environment;
  if (base.empty()) {
    for (char** e = environ; *e != nullptr; ++e) base.emplace_back(*e);
  }
  std::vector<std::string> env =
      ProgramEnvironment(base, rank, master, launched.join_file.path, channel.program_fd);
  // Its joins go through this process to the agent (join_relay.h).
  if (AgentJoinChannel(options_.agent_heartbeats) != nullptr) {
    env.push_back(absl::StrCat(kEnvAgentJoins, "=1"));
  }
  std::vector<std::string> argv(program.argv().begin(), program.argv().end());
  // Logged before the start: the program's output and this process's log
  // share the rank's output, and once the program runs, its last lines are
  // what a failure's reason quotes.
  LOG(INFO) << rank.job_id << ": rank " << rank.joined.rank() << " of " << rank.joined.world_size()
            << " starts " << binary << " (MASTER_ADDR " << master.host << ", MASTER_PORT "
            << master.port << ")";
  absl::StatusOr<pid_t> started = StartChild(binary, argv, env, program.working_dir());
  ::close(channel.program_fd);
  if (!started.ok()) return started.status();
  launched.pid = *started;
  return launched;
}

void ProgramSupervisor::PassOnRequests(pid_t pid, Requests& seen) {
  if (options_.terminate_requests != nullptr) {
    const int64_t now = options_.terminate_requests->load();
    if (now != seen.terminates) {
      seen.terminates = now;
      seen.terminating = true;
      ::kill(pid, SIGTERM);
    }
  }
  if (options_.checkpoint_requests != nullptr) {
    const int64_t now = options_.checkpoint_requests->load();
    if (now != seen.checkpoints) {
      seen.checkpoints = now;
      if (CatchesSignal(pid, SIGUSR1)) {
        ::kill(pid, SIGUSR1);
      } else {
        LOG(WARNING) << options_.rank.job_id << ": checkpoint request not passed on: the program "
                     << "has no SIGUSR1 handler (it would die of the signal)";
      }
    }
  }
}

int ProgramSupervisor::Supervise(Launched& launched, Progress& progress, Requests& seen) {
  const ProgramRank& rank = options_.rank;
  const pid_t pid = launched.pid;
  ProgressReceiver& receiver = *launched.receiver;
  HeartbeatStream::Options heartbeat_options;
  heartbeat_options.interval = options_.heartbeat_interval;
  heartbeat_options.paused = [pid] { return IsProcessStopped(pid); };
  heartbeat_options.agent = options_.agent_heartbeats;
  heartbeat_options.on_directive = [&](const v1::Directive& directive) {
    if (directive.kind() == v1::Directive::RE_RENDEZVOUS ||
        directive.kind() == v1::Directive::REFORM_AT_STEP_BOUNDARY) {
      // For an elastic program (the SDK acts on them; others ignore them).
      if (absl::Status s = receiver.SendDirective(directive); !s.ok()) {
        LOG(WARNING) << rank.job_id << ": passing a directive on: " << s.message();
      }
      return;
    }
    if (directive.kind() != v1::Directive::ABORT) return;
    LOG(WARNING) << rank.job_id << ": the coordinator aborts the rank: " << directive.reason();
    progress.Abort();
  };
  HeartbeatStream heartbeats(
      *options_.ranks, [&] { return progress.Heartbeat(rank); }, heartbeat_options);
  // An SDK program's joins of a next generation go on to the agent.
  std::shared_ptr<ProgressSender> agent_joins = AgentJoinChannel(options_.agent_heartbeats);
  std::unique_ptr<JoinRelay> relay =
      agent_joins != nullptr ? std::make_unique<JoinRelay>(receiver, agent_joins) : nullptr;
  bool channel_open = true;
  absl::Time kill_at = absl::InfiniteFuture();
  for (;;) {
    int wait_status = 0;
    const pid_t done = ::waitpid(pid, &wait_status, WNOHANG);
    if (done == pid) {
      // What the program sent just before it ended (its last steps) is
      // still in the channel.
      while (channel_open) {
        absl::StatusOr<v1::RankHeartbeat> record = receiver.Receive(absl::Now());
        if (!record.ok()) break;
        progress.Record(*std::move(record));
      }
      return wait_status;
    }
    if (done < 0 && errno != EINTR) {
      // Not our child any more (cannot happen unless someone reaped it).
      LOG(ERROR) << "waitpid " << pid << ": " << Errno(errno);
      return 0;
    }
    // A stop requested while the program was being started is passed on
    // as soon as it runs.
    PassOnRequests(pid, seen);
    if (progress.aborted() && kill_at == absl::InfiniteFuture()) {
      seen.terminating = true;
      ::kill(pid, SIGTERM);
      kill_at = absl::Now() + options_.kill_grace;
    }
    if (absl::Now() >= kill_at) {
      ::kill(pid, SIGKILL);
      kill_at = absl::InfiniteFuture() - absl::Seconds(1);  // sent once
    }
    const absl::Time tick = absl::Now() + absl::Milliseconds(100);
    if (!channel_open) {
      absl::SleepFor(tick - absl::Now());
      continue;
    }
    absl::StatusOr<v1::RankHeartbeat> record = receiver.Receive(tick);
    RelayJoins(receiver, relay.get());
    if (record.ok()) {
      // Note [Urgent heartbeats] in worker/agent/agent.cc.
      const bool declares = record->reforms_in_process() && !progress.ReformsInProcess();
      progress.Record(*std::move(record));
      if (declares) heartbeats.SendNow();
    } else if (absl::IsOutOfRange(record.status())) {
      channel_open = false;  // the program closed its end (or exec'd away from it)
    } else if (!absl::IsDeadlineExceeded(record.status())) {
      LOG(WARNING) << rank.job_id << ": progress channel: " << record.status().message();
    }
  }
}

absl::StatusOr<ProgramOutcome> ProgramSupervisor::Run() {
  const ProgramRank& rank = options_.rank;
  const v1::ProgramSpec& program = rank.joined.spec().program();
  const std::string shown = program.argv_size() > 0 ? program.argv(0) : "";
  // Failures before the program runs end the rank with a failed report.
  absl::StatusOr<Launched> launched = Launch(ProgramBinaryPath(program));
  if (!launched.ok()) return Refuse(launched.status(), shown);
  child_.store(launched->pid);
  Progress progress;
  Requests seen;
  seen.checkpoints =
      options_.checkpoint_requests != nullptr ? options_.checkpoint_requests->load() : 0;
  const int wait_status = Supervise(*launched, progress, seen);
  child_.store(0);

  const ProgramOutcome outcome = ProgramOutcome::FromWaitStatus(launched->pid, wait_status);
  bool left = false;
  const ProgramRank last = progress.LastMembership(rank, &left);
  if (left && outcome.ok()) {
    LOG(INFO) << rank.job_id << ": the program left the job (its agent is draining) and exited "
              << "with code 0";
    return outcome;
  }
  if (outcome.ok()) {
    LOG(INFO) << rank.job_id << ": rank " << last.joined.rank()
              << ": the program exited with code 0";
  }
  v1::ReportRequest request = FinalReport(last, outcome, shown, progress.Newest());
  // A rank being stopped (cancel, Ctrl-C) has seconds before SIGKILL, and
  // the coordinator may be going away too.
  absl::Status reported =
      SendFinalReport(request, seen.terminating ? absl::Seconds(2) : options_.report_deadline);
  if (!reported.ok() && !seen.terminating) LOG(WARNING) << "final report: " << reported.message();
  return outcome;
}

}  // namespace chorus
