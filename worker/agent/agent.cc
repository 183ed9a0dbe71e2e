#include "worker/agent/agent.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/backoff.h"
#include "common/cpu_binding.h"
#include "common/cpu_pressure.h"
#include "common/env_names.h"
#include "common/grpc_util.h"
#include "common/join_answers.h"
#include "common/memory_estimate.h"
#include "common/output_limits.h"
#include "common/paths.h"
#include "common/version.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"
#include "worker/agent/posix_rank_launcher.h"

extern char** environ;

namespace chorus {
namespace {

constexpr absl::Duration kLogFlushInterval = absl::Milliseconds(250);
// Reported when a rank's exit could not be observed (waiting for it failed).
constexpr int kUnknownExitCode = 255;
// How many written exits the next hello tells again (Note [Exits told
// again] in coordinator/scheduling/job_recovery.h): every slot's last few.
constexpr size_t kToldExitsKept = 64;

// Echoes one line of a rank's output on this agent's stderr (`chorus up`'s
// worker.log), prefixed with its job and slot. Each slot's output is
// forwarded by its own thread and glog writes there too, so the line goes
// out in one write(2): pieces written one by one interleave with other
// threads' and can leave a rank's text on a line that names another slot
// or none, where `grep job-000001` no longer finds it.
void EchoRankLine(const std::string& job_id, int slot, absl::string_view line) {
  const std::string text = absl::StrCat("[", job_id, " slot ", slot, "] ", line, "\n");
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr is gone; the coordinator still gets the line
    written += static_cast<size_t>(n);
  }
}

}  // namespace

Agent::Agent(AgentOptions options)
    : options_(std::move(options)),
      cpus_(options_.cpus.empty() ? AllowedCpus() : options_.cpus),
      launcher_(options_.launcher != nullptr ? options_.launcher
                                             : std::make_shared<PosixRankLauncher>()),
      // Clean-ups run as real processes, also beside a scripted launcher.
      accounts_(RankAccounts::Options{options_.rank_uid_range, geteuid(), options_.rank_temp_root,
                                      nullptr, nullptr}),
      clock_(options_.clock != nullptr ? *options_.clock : real_clock_),
      stub_(v1::AgentService::NewStub(MakeCoordinatorChannel(options_.coordinator))),
      patient_channel_(MakeCoordinatorChannel(options_.coordinator, kOneShotConnectTimeout)),
      patient_stub_(v1::AgentService::NewStub(patient_channel_)) {
  if (!options_.bind_cpus) {
    LOG(INFO) << "ranks are not bound to CPUs (--bind_cpus=false)";
  } else if (SlotCpus(cpus_, 0, options_.slots).empty()) {
    LOG(INFO) << "ranks are not bound to CPUs: " << options_.slots << " slots share "
              << cpus_.size() << " CPU(s) (" << FormatCpuList(cpus_) << ")";
  } else {
    LOG(INFO) << "each slot's rank is bound to its share of CPUs " << FormatCpuList(cpus_)
              << " (slot 0: " << FormatCpuList(SlotCpus(cpus_, 0, options_.slots)) << ")";
  }
  const auto [accounts, as_root] = accounts_.Describe();
  if (as_root) {
    LOG(WARNING) << accounts;
  } else {
    LOG(INFO) << accounts;
  }
  if (!options_.rank_cgroups) return;
  cgroups_ = std::make_unique<RankCgroups>(
      RankCgroups::ForThisHost(absl::StrCat("agent-", ::getpid())));
  if (cgroups_->enabled()) {
    LOG(INFO) << "each rank runs in a cgroup of its own (cgroup v" << cgroups_->version()
              << ") under " << absl::StrJoin(cgroups_->agent_dirs(), ", ");
  } else {
    LOG(WARNING) << "ranks run without memory, process and CPU limits: "
                 << cgroups_->why_disabled()
                 << " (cgroups need root or a delegated cgroup: docs/operating.md, Rank limits)";
  }
}

Agent::~Agent() {
  Stop();
  // A thread being joined may start another (a stop's SIGKILL escalation).
  while (true) {
    std::map<int64_t, std::thread> threads;
    {
      absl::MutexLock lock(&mu_);
      threads.swap(threads_);
      finished_.clear();
    }
    if (threads.empty()) break;
    for (auto& [id, t] : threads) t.join();
  }
}

int Agent::live_ranks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(children_.size());
}

int Agent::threads_held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

// Note [Reaping threads]
// Each rank gets a monitor thread, each stop a SIGKILL-escalation thread.
// A thread that has returned but is not joined keeps its stack mapped, so an
// agent that joined them only in its destructor grew by two memory maps per
// rank it ever ran (and would in the end fail to start threads at all). So
// every thread, as its last act, adds its number to finished_ under mu_,
// and StartThread joins the finished ones before starting another. The
// threads held are then those running plus at most the ones that finished
// since the last start: bounded by what runs at once, not by how many ranks
// the agent has run. A finished thread needs nothing more after it has
// released mu_, so joining it cannot wait on the caller; it is joined
// outside mu_ all the same. The destructor still joins whatever is left.
void Agent::StartThread(std::function<void()> body) {
  std::vector<std::thread> done;
  {
    absl::MutexLock lock(&mu_);
    for (int64_t id : finished_) {
      auto it = threads_.find(id);
      if (it == threads_.end()) continue;
      done.push_back(std::move(it->second));
      threads_.erase(it);
    }
    finished_.clear();
    const int64_t id = next_thread_++;
    // The new thread cannot say it finished before it is in threads_: that
    // takes mu_, held here until it is.
    threads_.emplace(id, std::thread([this, id, body = std::move(body)]() mutable {
                       body();
                       body = nullptr;  // what it holds (a rank's process) goes before the join
                       absl::MutexLock lock(&mu_);
                       finished_.push_back(id);
                     }));
  }
  for (std::thread& t : done) t.join();
}

void Agent::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  StopRanks("", {}, options_.stop_grace);
}

// Note [Reports kept while disconnected]
// A report that cannot be written (a rank's exit; not output or heartbeats)
// waits in unsent_ and goes out on the next stream, first thing after the
// welcome. Send holds write_mu_ from looking at stream_ until the report is
// written or kept, and Serve takes write_mu_ to set stream_ and take what
// was kept: so a report is either kept before Serve takes the kept ones or
// written to the new stream, never kept after Serve looked (there it would
// wait for a reconnect that may never come, and the coordinator would wait
// for an exit it was never told of).
void Agent::Send(const v1::AgentMessage& message) {
  absl::MutexLock write_lock(&write_mu_);
  grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>* stream;
  {
    absl::MutexLock lock(&mu_);
    stream = stream_;
  }
  // Output lines are best effort (the local log has them too), and so are
  // heartbeats (newer ones follow); a rank's exit is kept and sent after
  // reconnecting.
  const bool written = stream != nullptr && stream->Write(message);
  if (written && message.has_rank_exited()) {
    // Written is not read: the coordinator may die before it reads it.
    absl::MutexLock lock(&mu_);
    told_exits_.push_back(message.rank_exited());
    while (told_exits_.size() > kToldExitsKept) told_exits_.pop_front();
  } else if (!written && !message.has_logs() && !message.has_heartbeats()) {
    LOG(WARNING) << "coordinator unreachable; will report after reconnecting: "
                 << message.ShortDebugString();
    absl::MutexLock lock(&mu_);
    unsent_.push_back(message);
  }
}

v1::AgentMessage Agent::Hello() {
  v1::AgentMessage hello;
  v1::AgentHello* h = hello.mutable_hello();
  h->set_host(options_.host);
  h->set_slots(options_.slots);
  h->set_device(options_.device);
  h->set_pid(::getpid());
  h->set_version(kVersion);
  h->set_threads_per_rank(options_.threads_per_rank);
  h->set_memory_bytes(MachineMemoryBytes());
  absl::MutexLock lock(&mu_);
  h->set_agent_id(agent_id_);  // the id of its last connection, empty at first
  for (const auto& [pid, child] : children_) {
    v1::RunningRank* r = h->add_running();
    r->set_job_id(child->job_id);
    r->set_generation(child->generation);
    r->set_slot(child->slot);
    r->set_pid(pid);
  }
  for (const v1::RankExited& exited : told_exits_) *h->add_exited() = exited;
  return hello;
}

void Agent::Serve(grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>& stream,
                  const v1::Welcome& welcome, int still_running) {
  std::vector<v1::AgentMessage> unsent;
  {
    // Note [Reports kept while disconnected]
    absl::MutexLock write_lock(&write_mu_);
    absl::MutexLock lock(&mu_);
    agent_id_ = welcome.agent_id();
    stream_ = &stream;
    unsent.swap(unsent_);
  }
  LOG(INFO) << "connected to " << options_.coordinator << " as " << welcome.agent_id() << " with "
            << options_.slots << " slot(s)"
            << (still_running > 0 ? absl::StrCat(", ", still_running, " rank(s) still running")
                                  : "");
  for (const v1::AgentMessage& m : unsent) Send(m);
  v1::CoordinatorMessage message;
  while (stream.Read(&message)) {
    if (message.has_launch()) {
      Launch(message.launch());
    } else if (message.has_checkpoint()) {
      SignalRanks(message.checkpoint().job_id(),
                  std::vector<int>(message.checkpoint().slots().begin(),
                                   message.checkpoint().slots().end()),
                  SIGUSR1);
    } else if (message.has_stop()) {
      StopRanks(message.stop().job_id(),
                std::vector<int>(message.stop().slots().begin(), message.stop().slots().end()),
                absl::Seconds(std::max(0.0, message.stop().grace_seconds())));
    } else if (message.has_directives()) {
      PassDirectives(message.directives());
    } else if (message.has_joined()) {
      PassJoinAnswers(message.joined());
    }
  }
  {
    absl::MutexLock write_lock(&write_mu_);
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
  }
  AnswerAwaitingDirectly("the agent's stream to the coordinator ended before the answer came");
}

absl::Status Agent::Run() {
  const absl::Time first_deadline = absl::Now() + options_.connect_timeout;
  // At most a second apart: a restarted coordinator waits only its
  // recovery grace for the agents to bring their ranks back, and under
  // load a 5 s cap here left one attempt too late for a 4 s grace. Jittered
  // so that the agents of a cluster do not all knock at once (Note [Backoff]
  // in common/backoff.cc).
  BackoffOptions delays;
  delays.initial = absl::Milliseconds(200);
  delays.max = absl::Seconds(1);
  Backoff backoff(delays);
  bool ever_connected = false;
  absl::Time disconnected_since = absl::InfiniteFuture();
  int failed_attempts = 0;  // since the agent was last welcomed
  StartThread([this] { ForwardHeartbeats(); });
  StartThread([this] { WatchForUrgentHeartbeats(); });
  StartThread([this] { ForwardJoins(); });
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      context_ = &context;
    }
    // Note [Reconnecting over a slow link]
    const bool patient = ever_connected && failed_attempts % 2 == 1;
    if (patient) AwaitPatientChannel();
    auto stream = (patient ? patient_stub_ : stub_)->Connect(&context);
    const v1::AgentMessage hello = Hello();
    v1::CoordinatorMessage message;
    const bool welcomed = stream->Write(hello) && stream->Read(&message) && message.has_welcome();
    if (welcomed) {
      ever_connected = true;
      failed_attempts = 0;
      backoff.Reset();
      disconnected_since = absl::InfiniteFuture();
      Serve(*stream, message.welcome(), hello.hello().running_size());
    }
    grpc::Status status = stream->Finish();
    {
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
      if (stopping_) break;
    }
    if (!ever_connected && absl::Now() > first_deadline) {
      return absl::UnavailableError(absl::StrCat(
          "no coordinator answered at ", options_.coordinator, " within ",
          absl::FormatDuration(options_.connect_timeout), ": ", status.error_message()));
    }
    if (welcomed) {
      LOG(WARNING) << "lost the coordinator (" << status.error_message()
                   << "); reconnecting, ranks keep "
                   << "running for up to " << absl::FormatDuration(options_.reconnect_window);
      disconnected_since = absl::Now();
    } else if (ever_connected) {
      ++failed_attempts;
      // Why it is not back yet (a slow link's handshakes, a coordinator that
      // does not answer), once every 2 s of the reconnection at most.
      if (disconnected_since != absl::InfiniteFuture()) {
        LOG_EVERY_T(WARNING, 2) << "reconnecting to " << options_.coordinator << " ("
                                << absl::FormatDuration(absl::Now() - disconnected_since)
                                << " so far, attempt " << failed_attempts
                                << (patient ? ", a patient one" : "")
                                << "): " << status.error_message();
      }
    }
    if (absl::Now() - disconnected_since > options_.reconnect_window && live_ranks() > 0) {
      disconnected_since = AfterReconnectWindow();
    }
    absl::SleepFor(backoff.Next());
  }
  return absl::OkStatus();
}

// Note [Reconnecting over a slow link]
void Agent::AwaitPatientChannel() {
  const absl::Time deadline = absl::Now() + kOneShotConnectTimeout;
  while (absl::Now() < deadline) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(250));
    if (patient_channel_->WaitForConnected(absl::ToChronoTime(slice))) return;
  }
}

// Note [Ranks outlive a leaderless cluster]
absl::Time Agent::AfterReconnectWindow() {
  if (const std::string why = WhyNoCoordinatorLeads(); !why.empty()) {
    LOG(WARNING) << "no coordinator for " << absl::FormatDuration(options_.reconnect_window)
                 << ", but they are up and wait for their state (" << why
                 << "); the ranks keep training";
    return absl::Now();  // asked again after another window
  }
  LOG(WARNING) << "no coordinator for " << absl::FormatDuration(options_.reconnect_window)
               << "; stopping the ranks";
  StopRanks("", {}, options_.stop_grace);
  return absl::InfiniteFuture();
}

// Note [Reconnecting over a slow link]
// A connection attempt through stub_'s channel may take 0.2 s at first and
// never more than 2 s (kReconnectingConnectTimeout and the reconnect backoff
// in common/grpc_util.cc), so that a restarted coordinator is found within
// its recovery grace. Over a congested slow link (300 ms each way, lossy, its
// queue full of the training traffic that stalled during a cut) the TCP and
// HTTP/2 handshakes need longer: every attempt failed "handshaker shutdown"
// for 11-14 s after such a cut healed, and the coordinator's wait for the
// agent ran out. So once the agent has been welcomed, every second attempt
// after a failed one goes through patient_channel_, whose connection
// attempts may take kOneShotConnectTimeout; the others stay quick. Such a
// channel, used only now and then, is mostly backing off from its last
// failure, and a call on it would fail at once with that failure ("Connection
// refused" while the coordinator was restarting, although it serves by now).
// So a patient attempt first waits, up to kOneShotConnectTimeout, for the
// channel to connect (to the leader, on a list of coordinators), then calls.

// Note [Ranks outlive a leaderless cluster]
// Ranks keep training for reconnect_window after the coordinator went away,
// then the agent stops them: a coordinator that is gone for good must not
// leave ranks running forever. But coordinators sharing their state in etcd
// are all up and leaderless while etcd has no quorum, for as long as that
// lasts; their state is intact and a leader takes the running jobs back
// once etcd answers. So at the end of the window the agent asks its
// coordinators why none leads (Note [Why none leads] in
// common/grpc_util.cc), and while one says so the ranks train on and the
// window starts again.
std::string Agent::WhyNoCoordinatorLeads() {
  return NoLeaderReason(
      options_.coordinator, absl::Seconds(3),
      [](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context) {
        v1::CoordinatorLeader leader;
        return v1::JobService::NewStub(channel)->GetLeader(context, v1::GetLeaderRequest(),
                                                           &leader);
      });
}

// Note [Stopping while launching]
// Stop() marks the agent stopping and then stops the ranks it finds in
// children_. A rank whose process is being started at that moment is not
// there yet: Launch records it under the same lock that guards stopping_ and
// stops it itself if Stop() came first, so either Stop() sees it or Launch
// sees stopping_, and the destructor never waits on a rank nobody stopped.
// Ranks not yet started when the agent stops are not started at all.
void Agent::Launch(const v1::LaunchRanks& launch) {
  std::string agent_id;
  {
    absl::MutexLock lock(&mu_);
    agent_id = agent_id_;
  }
  for (const v1::RankLaunch& rank : launch.ranks()) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        LOG(INFO) << launch.job_id() << ": not starting slot " << rank.slot()
                  << ": the agent is stopping";
        continue;
      }
    }
    std::shared_ptr<Child> child = StartRank(launch, rank, agent_id);
    if (child == nullptr) continue;
    LOG(INFO) << launch.job_id() << ": started slot " << rank.slot() << " as pid " << child->pid;
    bool stop_now = false;
    {
      absl::MutexLock lock(&mu_);
      children_[child->pid] = child;
      stop_now = stopping_;  // Note [Stopping while launching]
    }
    StartThread([this, child] { Monitor(child); });
    if (stop_now) StopChildren({child}, options_.stop_grace);
  }
}

std::shared_ptr<Agent::Child> Agent::StartRank(const v1::LaunchRanks& launch,
                                               const v1::RankLaunch& rank,
                                               const std::string& agent_id) {
  RankCommand command = RankCommandFor(launch, rank, agent_id);
  // Note [Rank accounts] in rank_accounts.h.
  absl::StatusOr<RankAccounts::ForJob> account =
      accounts_.Acquire(launch.job_id(), launch.unix_account());
  if (!account.ok()) {
    ReportStartFailure(launch.job_id(), rank.slot(), account.status());
    return nullptr;
  }
  command.account = account->account;
  for (const auto& [key, value] : account->env) {
    const std::string prefix = key + "=";
    command.env.erase(std::remove_if(command.env.begin(), command.env.end(),
                                     [&](const std::string& e) { return e.rfind(prefix, 0) == 0; }),
                      command.env.end());
    if (!value.empty()) command.env.push_back(prefix + value);
  }
  std::unique_ptr<RankCgroup> cgroup = CgroupFor(launch, rank, command);
  int rank_fd = -1;
  std::unique_ptr<ProgressReceiver> heartbeats = OpenHeartbeatChannel(command, &rank_fd);
  absl::StatusOr<std::unique_ptr<RankProcess>> process = launcher_->Start(command);
  if (rank_fd >= 0) close(rank_fd);  // the rank has its own copy now
  if (!process.ok()) {
    accounts_.Release(launch.job_id());
    ReportStartFailure(launch.job_id(), rank.slot(), process.status());
    return nullptr;
  }
  auto child = std::make_shared<Child>();
  child->process = *std::move(process);
  child->cgroup = std::move(cgroup);
  child->pid = child->process->pid();
  child->job_id = launch.job_id();
  child->generation = launch.generation();
  child->slot = rank.slot();
  child->heartbeats = std::move(heartbeats);
  return child;
}

void Agent::ReportStartFailure(const std::string& job_id, int slot, const absl::Status& why) {
  LOG(ERROR) << job_id << ": slot " << slot << ": " << why;
  v1::AgentMessage exited;
  v1::RankExited* e = exited.mutable_rank_exited();
  e->set_job_id(job_id);
  e->set_slot(slot);
  e->set_exit_code(127);
  e->add_stderr_tail(absl::StrCat("chorus-worker ", why.message()));
  Send(exited);
}

std::unique_ptr<RankCgroup> Agent::CgroupFor(const v1::LaunchRanks& launch,
                                             const v1::RankLaunch& rank,
                                             RankCommand& command) const {
  if (cgroups_ == nullptr || !cgroups_->enabled()) return nullptr;
  CgroupLimits limits;
  limits.memory_bytes = launch.memory_limit_bytes();
  limits.max_processes = launch.max_processes();
  limits.cpus = command.cpus;
  absl::StatusOr<std::unique_ptr<RankCgroup>> cgroup = cgroups_->Create(
      launch.job_id(), absl::StrCat("slot-", rank.slot(), "-gen-", launch.generation()), limits);
  if (!cgroup.ok()) {
    LOG(WARNING) << launch.job_id() << ": slot " << rank.slot()
                 << " runs without a cgroup (no memory or process limit): "
                 << cgroup.status().message();
    return nullptr;
  }
  command.cgroup_procs = (*cgroup)->procs_files();
  return *std::move(cgroup);
}

void Agent::CloseCgroup(Child& child, v1::RankExited& exited) {
  if (child.cgroup == nullptr) return;
  // Note [Rank cgroups]: a rank that failed after the OOM killer fired in
  // its cgroup died of its memory limit (the killed process may have been
  // a program the rank supervises, which then exits 137 itself).
  const int64_t limit = child.cgroup->limits().memory_bytes;
  if (exited.exit_code() != 0 && limit > 0 && child.cgroup->OomKills() > 0) {
    exited.set_out_of_memory_limit_bytes(limit);
    // Said in the job's log too (`chorus logs`), after the rank's own last
    // line: the job's reason says it once more.
    const std::string line =
        absl::StrCat("chorus-worker: the rank was killed: out of memory: the job's limit is ",
                     FormatBinaryBytes(limit), " per rank (resources.memory_bytes)");
    EchoRankLine(child.job_id, child.slot, line);
    v1::AgentMessage logs;
    logs.mutable_logs()->set_job_id(child.job_id);
    logs.mutable_logs()->set_slot(child.slot);
    logs.mutable_logs()->add_lines(line);
    Send(logs);
  }
  if (absl::Status removed = child.cgroup->Remove(); !removed.ok()) {
    LOG(WARNING) << child.job_id << ": slot " << child.slot << ": " << removed.message();
  }
}

RankCommand Agent::RankCommandFor(const v1::LaunchRanks& launch, const v1::RankLaunch& rank,
                                  const std::string& agent_id) const {
  RankCommand command;
  command.argv.push_back(options_.rank_binary.empty() ? ExecutableDir() + "/chorus-rank"
                                                      : options_.rank_binary);
  std::vector<std::string>& env = command.env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  auto unset = [&env](const std::string& key) {
    env.erase(std::remove_if(env.begin(), env.end(),
                             [&](const std::string& e) { return e.rfind(key + "=", 0) == 0; }),
              env.end());
  };
  auto set = [&](const std::string& key, const std::string& value) {
    unset(key);
    env.push_back(key + "=" + value);
  };
  // The launch names the coordinator that sent it; an agent given several
  // coordinators hands its ranks the whole list instead, so that they too
  // follow the leader when it moves (Note [Following the leader] in
  // common/grpc_util.cc).
  const bool several = options_.coordinator.find(',') != std::string::npos;
  set(kEnvCoordinator,
      launch.coordinator().empty() || several ? options_.coordinator : launch.coordinator());
  set(kEnvJobId, launch.job_id());
  // Note [Job credentials] (common/job_credentials.h): the ranks run user
  // code, so they get their job's credential, never the agent's token.
  unset(kEnvTokenFile);
  if (launch.credential().empty()) {
    unset(kEnvToken);
  } else {
    set(kEnvToken, launch.credential());
  }
  set(kEnvGeneration, std::to_string(launch.generation()));
  set(kEnvAgentId, agent_id);
  set(kEnvSlot, std::to_string(rank.slot()));
  unset(kEnvAgentHeartbeatsFd);  // OpenHeartbeatChannel sets this rank's own
  unset(kEnvAgentJoins);
  set("LOCAL_RANK", std::to_string(rank.local_rank()));
  set("LOCAL_WORLD_SIZE", std::to_string(rank.local_world_size()));
  set("OMP_NUM_THREADS", std::to_string(options_.threads_per_rank));
  if (options_.bind_cpus) command.cpus = SlotCpus(cpus_, rank.slot(), options_.slots);
  // Where the rank may run, for its own log and for programs that size
  // thread pools (as Slurm's SLURM_CPU_BIND_LIST tells them); unset unbound.
  if (command.cpus.empty()) {
    unset(kEnvCpus);
  } else {
    set(kEnvCpus, FormatCpuList(command.cpus));
  }
  return command;
}

// Note [Heartbeats through the agent]
// At 16,384 ranks one heartbeat stream per rank costs the coordinator most
// of a core (Note [Aggregated heartbeats] in coordinator/scheduling/rank_messages.h), so
// the agent collects its ranks' heartbeats and sends them in one
// AgentMessage.heartbeats per heartbeat_interval. Each rank gets one end of
// a SOCK_SEQPACKET pair (worker/runtime/progress_channel.h) at its start,
// its number in CHORUS_AGENT_HEARTBEATS_FD: no address to find or guard,
// only the rank holds it (chorus-rank makes it close-on-exec before it
// starts a program), and a rank's heartbeat is one datagram. Its
// HeartbeatStream sends there instead of opening its own stream; a rank
// without the variable (started by an older agent, or when the pair could
// not be made) keeps its own stream, and one whose agent's end closes goes
// back to it.
// Once per interval ForwardHeartbeats drains every rank's channel without
// waiting and sends the newest heartbeat of each rank that sent any since
// the last message (a ping when none did). A rank that sent nothing is absent, so a dead, hung or
// stopped rank (a program's supervisor withholds heartbeats while the
// program is SIGSTOPped) ages into DEAD at the coordinator while its agent
// is alive. While the agent is disconnected the heartbeats are dropped, not
// kept: the next ones after reconnecting are newer. The coordinator answers
// with RankDirectives naming the slot (or, for a rank it no longer places,
// the generation and rank of the heartbeat); PassDirectives hands each to
// the rank of that job, slot or rank, and generation over its channel, and
// the rank's on_directive gets it as from its own stream.
std::unique_ptr<ProgressReceiver> Agent::OpenHeartbeatChannel(RankCommand& command, int* rank_fd) {
  *rank_fd = -1;
  absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
  if (!pair.ok()) {
    LOG(WARNING) << "no heartbeat channel for a rank (it sends its heartbeats to the "
                 << "coordinator itself): " << pair.status().message();
    return nullptr;
  }
  *rank_fd = pair->program_fd;
  command.inherit_fds.push_back(pair->program_fd);
  command.env.push_back(absl::StrCat(kEnvAgentHeartbeatsFd, "=", pair->program_fd));
  // Note [Joins gathered by the agent]: the rank may send its joins here too.
  command.env.push_back(absl::StrCat(kEnvAgentJoins, "=1"));
  return std::make_unique<ProgressReceiver>(pair->supervisor_fd);
}

// Note [Urgent heartbeats]
// A program that re-forms in its own process says so in its heartbeats
// (reforms_in_process), and until the coordinator has heard it, a lost rank
// of its job restarts every rank (Note [Restart-all] in
// coordinator/scheduling/running_job.h). Through the agent that word could wait a
// whole interval more than on the rank's own stream, long enough for a rank
// lost early in the job to restart survivors that would have re-formed. So a
// watcher reads the channels every channel_poll (real time, 50 ms) and
// wakes the forwarder as soon as a rank's heartbeat first carries the
// declaration; every other heartbeat waits for the interval.

std::vector<std::shared_ptr<Agent::Child>> Agent::HeartbeatChildren() const {
  std::vector<std::shared_ptr<Child>> children;
  for (const auto& [pid, child] : children_) {
    if (child->heartbeats != nullptr) children.push_back(child);
  }
  return children;
}

void Agent::ForwardHeartbeats() {
  absl::MutexLock lock(&mu_);
  absl::Time next = clock_.Now() + options_.heartbeat_interval;
  while (true) {
    auto wake = [](Agent* a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a->mu_) {
      return a->stopping_ || a->urgent_heartbeat_;
    };
    clock_.AwaitWithDeadline(mu_, absl::Condition(+wake, this), next);
    if (stopping_) return;
    if (!urgent_heartbeat_) next = clock_.Now() + options_.heartbeat_interval;
    urgent_heartbeat_ = false;
    const std::vector<std::shared_ptr<Child>> children = HeartbeatChildren();
    mu_.Unlock();
    v1::AgentMessage message = CollectHeartbeats(children);
    // Note [A silent agent's ranks] in coordinator/hang/hang_detector.h: a
    // message every interval, a ping when no rank sent a heartbeat, so
    // that the coordinator tells a silent rank from a silent agent.
    if (message.heartbeats().heartbeats_size() == 0) {
      message.set_ping_time_us(absl::ToUnixMicros(clock_.Now()));
    }
    // Note [A starved node] in coordinator/hang/hang_detector.h.
    message.set_cpu_pressure(
        static_cast<float>(options_.cpu_pressure ? options_.cpu_pressure() : NodeCpuPressure()));
    Send(message);
    mu_.Lock();
  }
}

void Agent::WatchForUrgentHeartbeats() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.channel_poll);
    if (stopping_) return;
    const std::vector<std::shared_ptr<Child>> children = HeartbeatChildren();
    mu_.Unlock();
    bool urgent = false;
    std::vector<PendingJoin> joins;
    for (const std::shared_ptr<Child>& child : children) {
      urgent = ReadHeartbeats(child, joins) || urgent;
    }
    mu_.Lock();
    if (urgent) urgent_heartbeat_ = true;
    QueueJoinsLocked(std::move(joins));
  }
}

bool Agent::ReadHeartbeats(const std::shared_ptr<Child>& child, std::vector<PendingJoin>& joins) {
  absl::MutexLock lock(&child->mu);
  const bool urgent = ReadHeartbeatsLocked(*child);
  for (v1::JoinRequest& join : child->heartbeats->TakeJoins()) {
    joins.push_back({child, std::move(join)});
  }
  return urgent;
}

void Agent::QueueJoinsLocked(std::vector<PendingJoin> joins) {
  for (PendingJoin& join : joins) pending_joins_.push_back(std::move(join));
}

bool Agent::ReadHeartbeatsLocked(Child& child) {
  absl::StatusOr<v1::RankHeartbeat> newest = child.heartbeats->Receive(absl::InfinitePast());
  if (!newest.ok()) {
    if (!absl::IsDeadlineExceeded(newest.status()) && !absl::IsOutOfRange(newest.status())) {
      LOG(WARNING) << child.job_id << ": slot " << child.slot << ": "
                   << newest.status().message();
    }
    return false;
  }
  if (newest->job_id() != child.job_id) {
    LOG_EVERY_N(WARNING, 60) << child.job_id << ": slot " << child.slot
                             << " sent a heartbeat of job " << newest->job_id()
                             << "; not forwarded";
    return false;
  }
  const bool declares = newest->reforms_in_process() && !child.declared_reforms;
  if (declares) child.declared_reforms = true;
  child.unsent = *std::move(newest);
  return declares;
}

v1::AgentMessage Agent::CollectHeartbeats(const std::vector<std::shared_ptr<Child>>& children) {
  v1::AgentMessage message;
  v1::RankHeartbeats& batch = *message.mutable_heartbeats();
  std::vector<PendingJoin> joins;
  for (const std::shared_ptr<Child>& child : children) {
    ReadHeartbeats(child, joins);
    absl::MutexLock lock(&child->mu);
    if (!child->unsent.has_value()) continue;
    child->forwarded = Child::Forwarded{child->unsent->generation(), child->unsent->rank()};
    *batch.add_heartbeats() = *std::move(child->unsent);
    child->unsent.reset();
  }
  // All of this pass's joins at once, so that they go in one message.
  absl::MutexLock lock(&mu_);
  QueueJoinsLocked(std::move(joins));
  return message;
}

void Agent::PassDirectives(const v1::RankDirectives& directives) {
  for (const v1::RankDirectives::Entry& entry : directives.entries()) {
    for (const std::shared_ptr<Child>& child : Ranks(entry.job_id(), {})) {
      if (child->heartbeats == nullptr) continue;
      {
        absl::MutexLock lock(&child->mu);
        const bool same_rank =
            entry.slot() >= 0 ? child->slot == entry.slot()
                              : child->forwarded.has_value() && child->forwarded->rank == entry.rank();
        if (!same_rank || !child->forwarded.has_value() ||
            child->forwarded->generation != entry.generation()) {
          continue;
        }
      }
      if (absl::Status sent = child->heartbeats->SendDirective(entry.directive()); !sent.ok()) {
        LOG(WARNING) << entry.job_id() << ": slot " << child->slot << ": passing on "
                     << v1::Directive::Kind_Name(entry.directive().kind()) << ": "
                     << sent.message();
      }
    }
  }
}

// Note [Joins gathered by the agent]
// When one rank of a 16,384-rank elastic job is lost, every survivor joins
// the next generation; one RankService.Join per rank took the coordinator
// 1.6-4.8 s, one RankJoins message per agent 0.2-0.5 s (Note [Joins through
// the agent] in coordinator/scheduling/agent_join_outbox.h, docs/benchmarks.md). So a rank
// whose agent sets CHORUS_AGENT_JOINS=1 sends its JoinRequest over its
// heartbeat channel (GenerationJoiner in worker/runtime/join_generation.h)
// and waits there for the answer. The watcher that reads the channels for
// urgent heartbeats every channel_poll (50 ms) also takes the joins they
// hold, those of all channels at once, into pending_joins_, and
// ForwardJoins sends what is pending as one message at once; the joins that
// come while that message is being written go in the next. No wait is
// added to gather more: the survivors of one failure fail their
// collectives within milliseconds of each other, and the poll and the
// write are the window that batches them. The agent speaks for the rank it
// started: job and slot are the child's, whatever the request says. Each
// join awaits its answer in awaiting_joins_, found by job, slot and asked
// generation; PassJoinAnswers gives the rank its whole JoinResponse
// (JoinAnswerFor) or the coordinator's error, which the rank treats as its
// own Join's (retries included). The answer of a rank that exited is
// dropped. A join with no stream to go on, or whose stream ends before the
// answer, is answered join_directly, and the rank calls RankService.Join
// itself at once rather than wait out its deadline; the coordinator counts
// a rank's completion once whichever way it joined. A rank started by an
// older agent (no variable), or whose agent's end is closed, joins directly.
void Agent::ForwardJoins() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !pending_joins_.empty();
    };
    mu_.Await(absl::Condition(&wake));
    if (stopping_) return;
    std::vector<PendingJoin> joins;
    joins.swap(pending_joins_);
    mu_.Unlock();
    SendJoins(std::move(joins));
    mu_.Lock();
  }
}

namespace {

void AnswerJoinDirectly(ProgressReceiver& channel, const std::string& job_id, int slot,
                        int64_t generation, const std::string& why) {
  v1::AgentJoinAnswer answer;
  answer.set_job_id(job_id);
  answer.set_asked_generation(generation);
  answer.set_join_directly(true);
  answer.set_message(why);
  if (absl::Status sent = channel.SendJoinAnswer(answer); !sent.ok()) {
    LOG(WARNING) << job_id << ": slot " << slot << ": telling the rank to join directly: "
                 << sent.message();
  }
}

}  // namespace

void Agent::SendJoins(std::vector<PendingJoin> joins) {
  v1::AgentMessage message;
  std::vector<JoinKey> keys;
  for (PendingJoin& join : joins) {
    v1::JoinRequest& request = *message.mutable_joins()->add_joins();
    request = std::move(join.request);
    request.set_job_id(join.child->job_id);
    request.set_slot(join.child->slot);
    keys.emplace_back(request.job_id(), request.slot(), request.generation());
  }
  std::vector<size_t> unsent;
  bool written = false;
  {
    absl::MutexLock write_lock(&write_mu_);
    grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>* stream;
    {
      absl::MutexLock lock(&mu_);
      stream = stream_;
      // Awaiting before the write: the answer may come before it returns.
      for (size_t i = 0; stream != nullptr && i < joins.size(); ++i) {
        awaiting_joins_[keys[i]] = joins[i].child;
      }
    }
    written = stream != nullptr && stream->Write(message);
    if (!written) {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < joins.size(); ++i) {
        if (stream != nullptr) {
          auto it = awaiting_joins_.find(keys[i]);
          // Answered meanwhile, or told by the ended stream's cleanup.
          if (it == awaiting_joins_.end() || it->second != joins[i].child) continue;
          awaiting_joins_.erase(it);
        }
        unsent.push_back(i);
      }
    }
  }
  for (size_t i : unsent) {
    AnswerJoinDirectly(*joins[i].child->heartbeats, std::get<0>(keys[i]), std::get<1>(keys[i]),
                       std::get<2>(keys[i]), "the node agent is not connected to the coordinator");
  }
  if (!written) return;
  const v1::JoinRequest& first = message.joins().joins(0);
  LOG(INFO) << first.job_id() << ": sent " << joins.size()
            << " rank join(s) to the coordinator in one message (generation "
            << first.generation() << ")";
}

void Agent::PassJoinAnswers(const v1::RankJoinAnswers& answers) {
  for (const v1::RankJoinAnswers::Entry& entry : answers.entries()) {
    std::shared_ptr<Child> child;
    {
      absl::MutexLock lock(&mu_);
      auto it = awaiting_joins_.find({entry.job_id(), entry.slot(), entry.asked_generation()});
      if (it == awaiting_joins_.end()) continue;  // its rank exited, or it went directly
      child = std::move(it->second);
      awaiting_joins_.erase(it);
      if (!IsLive(*child)) continue;
    }
    v1::AgentJoinAnswer answer;
    answer.set_job_id(entry.job_id());
    answer.set_asked_generation(entry.asked_generation());
    absl::StatusOr<v1::JoinResponse> joined = JoinAnswerFor(answers, entry);
    if (joined.ok()) {
      *answer.mutable_response() = *std::move(joined);
    } else {
      answer.set_code(static_cast<int>(joined.status().code()));
      answer.set_message(std::string(joined.status().message()));
    }
    if (absl::Status sent = child->heartbeats->SendJoinAnswer(answer); !sent.ok()) {
      LOG(WARNING) << entry.job_id() << ": slot " << entry.slot()
                   << ": passing on its join's answer: " << sent.message();
    }
  }
}

void Agent::AnswerAwaitingDirectly(const std::string& why) {
  std::map<JoinKey, std::shared_ptr<Child>> awaiting;
  {
    absl::MutexLock lock(&mu_);
    awaiting.swap(awaiting_joins_);
  }
  for (const auto& [key, child] : awaiting) {
    AnswerJoinDirectly(*child->heartbeats, std::get<0>(key), std::get<1>(key), std::get<2>(key),
                       why);
  }
}

void Agent::ForwardOutput(Child& child) {
  // Output goes to the coordinator in batches: when kMaxLogBatchLines or
  // kMaxLogBatchBytes are pending, when the process has been quiet for
  // kLogFlushInterval, and before its exit is reported. Lines come bounded
  // from the launcher; they are bounded here again all the same, since a
  // launcher is a seam anyone can implement (Note [Bounded job output]).
  std::vector<std::string> batch;
  size_t batch_bytes = 0;
  auto flush = [&] {
    if (batch.empty()) return;
    v1::AgentMessage message;
    v1::RankLogs* logs = message.mutable_logs();
    logs->set_job_id(child.job_id);
    logs->set_slot(child.slot);
    for (std::string& line : batch) logs->add_lines(std::move(line));
    batch.clear();
    batch_bytes = 0;
    Send(message);
  };
  auto add_line = [&](const std::string& text) {
    std::string line = BoundReceivedLine(text);
    EchoRankLine(child.job_id, child.slot, line);
    {
      absl::MutexLock lock(&child.mu);
      child.tail.push_back(line);
      BoundTail(child.tail);
    }
    if (batch_bytes + line.size() > kMaxLogBatchBytes) flush();
    batch_bytes += line.size();
    batch.push_back(std::move(line));
    if (batch.size() >= kMaxLogBatchLines) flush();
  };
  while (true) {
    absl::StatusOr<std::string> line = child.process->ReadLine(absl::Now() + kLogFlushInterval);
    if (line.ok()) {
      add_line(*std::move(line));
    } else if (absl::IsDeadlineExceeded(line.status())) {
      flush();
    } else {
      if (!absl::IsOutOfRange(line.status())) LOG(WARNING) << child.job_id << ": " << line.status();
      break;
    }
  }
  flush();
}

int Agent::AwaitExit(Child& child) {
  // The output has ended; the process normally exits right after. Until it
  // does, it is still a live rank that StopRanks can reach.
  while (true) {
    absl::StatusOr<int> exit = child.process->Wait(absl::Now() + absl::Seconds(1));
    if (exit.ok()) return *exit;
    if (!absl::IsDeadlineExceeded(exit.status())) {
      LOG(ERROR) << child.job_id << ": slot " << child.slot << ": " << exit.status();
      // The last line of the exit's report says why its code is unknown.
      const std::string line = BoundReceivedLine(
          absl::StrCat("chorus-worker lost track of this rank: ", exit.status().message()));
      EchoRankLine(child.job_id, child.slot, line);
      absl::MutexLock lock(&child.mu);
      child.tail.push_back(line);
      BoundTail(child.tail);
      return kUnknownExitCode;
    }
  }
}

void Agent::Monitor(std::shared_ptr<Child> child) {
  ForwardOutput(*child);
  const int code = AwaitExit(*child);
  LOG(INFO) << child->job_id << ": slot " << child->slot << " (pid " << child->pid
            << ") exited with "
            << (code < 0 ? absl::StrCat("signal ", -code) : absl::StrCat("code ", code));
  v1::AgentMessage exited;
  v1::RankExited* e = exited.mutable_rank_exited();
  e->set_job_id(child->job_id);
  e->set_slot(child->slot);
  e->set_pid(child->pid);
  e->set_exit_code(code);
  e->set_generation(child->generation);
  {
    absl::MutexLock lock(&child->mu);
    for (const std::string& line : child->tail) e->add_stderr_tail(line);
  }
  CloseCgroup(*child, *e);
  {
    absl::MutexLock lock(&mu_);
    auto it = children_.find(child->pid);
    if (it != children_.end() && it->second == child) children_.erase(it);
    // A join of its own that is still to be answered has no one to go to.
    for (auto join = awaiting_joins_.begin(); join != awaiting_joins_.end();) {
      join = join->second == child ? awaiting_joins_.erase(join) : std::next(join);
    }
  }
  accounts_.Release(child->job_id);  // Acquired in StartRank
  Send(exited);
}

void Agent::SignalRanks(const std::string& job_id, const std::vector<int>& slots, int signal) {
  for (const auto& child : Ranks(job_id, slots)) child->process->Signal(signal);
}

bool Agent::IsLive(const Child& child) const {
  auto it = children_.find(child.pid);
  return it != children_.end() && it->second.get() == &child;
}

std::vector<std::shared_ptr<Agent::Child>> Agent::Ranks(const std::string& job_id,
                                                        const std::vector<int>& slots) {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Child>> ranks;
  for (const auto& [pid, child] : children_) {
    if (!job_id.empty() && child->job_id != job_id) continue;
    if (!slots.empty() && std::find(slots.begin(), slots.end(), child->slot) == slots.end())
      continue;
    ranks.push_back(child);
  }
  return ranks;
}

void Agent::StopRanks(const std::string& job_id, const std::vector<int>& slots,
                      absl::Duration grace) {
  StopChildren(Ranks(job_id, slots), grace);
}

void Agent::StopChildren(std::vector<std::shared_ptr<Child>> children, absl::Duration grace) {
  if (children.empty()) return;
  for (const auto& child : children) child->process->SignalGroup(SIGTERM);
  // Escalate to SIGKILL for whatever is still alive after the grace period.
  StartThread([this, children = std::move(children), grace] {
    absl::MutexLock lock(&mu_);
    auto all_exited = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::none_of(children.begin(), children.end(),
                          [&](const std::shared_ptr<Child>& c) { return IsLive(*c); });
    };
    if (mu_.AwaitWithTimeout(absl::Condition(&all_exited), grace)) return;
    for (const auto& child : children) {
      if (IsLive(*child)) {
        LOG(WARNING) << child->job_id << ": slot " << child->slot << " (pid " << child->pid
                     << ") still running " << absl::FormatDuration(grace)
                     << " after SIGTERM; sending SIGKILL";
        child->process->SignalGroup(SIGKILL);
      }
    }
  });
}

}  // namespace chorus
