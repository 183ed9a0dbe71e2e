#include "worker/agent/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_util.h"
#include "common/memory_estimate.h"
#include "common/paths.h"
#include "common/version.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"

extern char** environ;

namespace chorus {
namespace {

constexpr size_t kTailLines = 20;
constexpr size_t kLogBatchLines = 256;
constexpr absl::Duration kLogFlushInterval = absl::Milliseconds(250);

}  // namespace

Agent::Agent(AgentOptions options)
    : options_(std::move(options)),
      stub_(v1::AgentService::NewStub(MakeCoordinatorChannel(options_.coordinator))) {}

Agent::~Agent() {
  Stop();
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
}

int Agent::live_ranks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(children_.size());
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

void Agent::Send(const v1::AgentMessage& message) {
  absl::MutexLock write_lock(&write_mu_);
  grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>* stream;
  {
    absl::MutexLock lock(&mu_);
    stream = stream_;
  }
  // Output lines are best effort (the local log has them too); a rank's
  // exit is kept and sent after reconnecting.
  if ((stream == nullptr || !stream->Write(message)) && !message.has_logs()) {
    LOG(WARNING) << "coordinator unreachable; will report after reconnecting: "
                 << message.ShortDebugString();
    absl::MutexLock lock(&mu_);
    unsent_.push_back(message);
  }
}

absl::Status Agent::Run() {
  const absl::Time first_deadline = absl::Now() + options_.connect_timeout;
  absl::Duration backoff = absl::Milliseconds(200);
  bool ever_connected = false;
  absl::Time disconnected_since = absl::InfiniteFuture();
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      context_ = &context;
    }
    auto stream = stub_->Connect(&context);
    v1::AgentMessage hello;
    v1::AgentHello* h = hello.mutable_hello();
    h->set_host(options_.host);
    h->set_slots(options_.slots);
    h->set_device(options_.device);
    h->set_pid(::getpid());
    h->set_version(kVersion);
    h->set_threads_per_rank(options_.threads_per_rank);
    h->set_memory_bytes(MachineMemoryBytes());
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [pid, child] : children_) {
        v1::RunningRank* r = h->add_running();
        r->set_job_id(child->job_id);
        r->set_generation(child->generation);
        r->set_slot(child->slot);
        r->set_pid(pid);
      }
    }
    v1::CoordinatorMessage message;
    bool welcomed = stream->Write(hello) && stream->Read(&message) && message.has_welcome();
    if (welcomed) {
      ever_connected = true;
      backoff = absl::Milliseconds(200);
      {
        absl::MutexLock lock(&mu_);
        agent_id_ = message.welcome().agent_id();
        stream_ = stream.get();
      }
      LOG(INFO) << "connected to " << options_.coordinator << " as " << message.welcome().agent_id()
                << " with " << options_.slots << " slot(s)"
                << (h->running_size() > 0
                        ? absl::StrCat(", ", h->running_size(), " rank(s) still running")
                        : "");
      disconnected_since = absl::InfiniteFuture();
      std::vector<v1::AgentMessage> unsent;
      {
        absl::MutexLock lock(&mu_);
        unsent.swap(unsent_);
      }
      for (const v1::AgentMessage& m : unsent) Send(m);
      while (stream->Read(&message)) {
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
        }
      }
      {
        absl::MutexLock write_lock(&write_mu_);
        absl::MutexLock lock(&mu_);
        stream_ = nullptr;
      }
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
    }
    if (absl::Now() - disconnected_since > options_.reconnect_window && live_ranks() > 0) {
      LOG(WARNING) << "no coordinator for " << absl::FormatDuration(options_.reconnect_window)
                   << "; stopping the ranks";
      StopRanks("", {}, options_.stop_grace);
      disconnected_since = absl::InfiniteFuture();
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
  return absl::OkStatus();
}

void Agent::Launch(const v1::LaunchRanks& launch) {
  const std::string binary =
      options_.rank_binary.empty() ? ExecutableDir() + "/chorus-rank" : options_.rank_binary;
  std::string agent_id;
  {
    absl::MutexLock lock(&mu_);
    agent_id = agent_id_;
  }
  for (const v1::RankLaunch& rank : launch.ranks()) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    auto set = [&env](const std::string& key, const std::string& value) {
      env.erase(std::remove_if(env.begin(), env.end(),
                               [&](const std::string& e) { return e.rfind(key + "=", 0) == 0; }),
                env.end());
      env.push_back(key + "=" + value);
    };
    set("CHORUS_COORDINATOR",
        launch.coordinator().empty() ? options_.coordinator : launch.coordinator());
    set("CHORUS_JOB_ID", launch.job_id());
    set("CHORUS_GENERATION", std::to_string(launch.generation()));
    set("CHORUS_AGENT_ID", agent_id);
    set("CHORUS_SLOT", std::to_string(rank.slot()));
    set("LOCAL_RANK", std::to_string(rank.local_rank()));
    set("LOCAL_WORLD_SIZE", std::to_string(rank.local_world_size()));
    set("OMP_NUM_THREADS", std::to_string(options_.threads_per_rank));
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string binary_copy = binary;
    char* argv[] = {binary_copy.data(), nullptr};

    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      LOG(ERROR) << "pipe: " << std::strerror(errno);
      continue;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Its own process group, default dispositions, and only SIGUSR1 blocked:
    // the agent blocks SIGINT/SIGTERM for its signal thread, and a rank must
    // not inherit that or SIGTERM could never stop it. SIGUSR1 (`chorus
    // checkpoint`) would kill a rank that has not yet installed its handler
    // (loading its libraries takes a while), so it stays pending until
    // chorus-rank's main has and unblocks it.
    posix_spawnattr_setflags(
        &attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&attr, 0);
    sigset_t blocked, defaults;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGUSR1);
    posix_spawnattr_setsigmask(&attr, &blocked);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGTERM);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    pid_t pid = 0;
    int rc = posix_spawn(&pid, binary.c_str(), &actions, &attr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    close(fds[1]);
    if (rc != 0) {
      close(fds[0]);
      v1::AgentMessage exited;
      v1::RankExited* e = exited.mutable_rank_exited();
      e->set_job_id(launch.job_id());
      e->set_slot(rank.slot());
      e->set_exit_code(127);
      e->add_stderr_tail(
          absl::StrCat("chorus-worker could not start ", binary, ": ", std::strerror(rc)));
      Send(exited);
      continue;
    }
    auto child = std::make_shared<Child>();
    child->pid = pid;
    child->job_id = launch.job_id();
    child->generation = launch.generation();
    child->slot = rank.slot();
    LOG(INFO) << launch.job_id() << ": started slot " << rank.slot() << " as pid " << pid;
    absl::MutexLock lock(&mu_);
    children_[pid] = child;
    threads_.emplace_back([this, child, fd = fds[0]] { Monitor(child, fd); });
  }
}

void Agent::Monitor(std::shared_ptr<Child> child, int fd) {
  // Output goes to the coordinator in batches: when kLogBatchLines are
  // pending, when the process has been quiet for kLogFlushInterval, and
  // before its exit is reported.
  std::vector<std::string> batch;
  auto flush = [&] {
    if (batch.empty()) return;
    v1::AgentMessage message;
    v1::RankLogs* logs = message.mutable_logs();
    logs->set_job_id(child->job_id);
    logs->set_slot(child->slot);
    for (std::string& line : batch) logs->add_lines(std::move(line));
    batch.clear();
    Send(message);
  };
  auto add_line = [&](std::string line) {
    std::cerr << "[" << child->job_id << " slot " << child->slot << "] " << line << "\n";
    {
      absl::MutexLock lock(&child->mu);
      child->tail.push_back(line);
      if (child->tail.size() > kTailLines) child->tail.pop_front();
    }
    batch.push_back(std::move(line));
    if (batch.size() >= kLogBatchLines) flush();
  };
  std::string pending;
  char buffer[4096];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(kLogFlushInterval)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      flush();
      continue;
    }
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, n);
    size_t newline;
    while ((newline = pending.find('\n')) != std::string::npos) {
      add_line(pending.substr(0, newline));
      pending.erase(0, newline + 1);
    }
  }
  close(fd);
  if (!pending.empty()) add_line(std::move(pending));
  flush();
  int status = 0;
  while (waitpid(child->pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  // Nothing of the rank may outlive it: its process group goes too.
  kill(-child->pid, SIGKILL);
  LOG(INFO) << child->job_id << ": slot " << child->slot << " (pid " << child->pid
            << ") exited with "
            << (code < 0 ? absl::StrCat("signal ", -code) : absl::StrCat("code ", code));
  v1::AgentMessage exited;
  v1::RankExited* e = exited.mutable_rank_exited();
  e->set_job_id(child->job_id);
  e->set_slot(child->slot);
  e->set_pid(child->pid);
  e->set_exit_code(code);
  {
    absl::MutexLock lock(&child->mu);
    for (const std::string& line : child->tail) e->add_stderr_tail(line);
  }
  {
    absl::MutexLock lock(&mu_);
    children_.erase(child->pid);
  }
  Send(exited);
}

std::vector<pid_t> Agent::RankPids(const std::string& job_id, const std::vector<int>& slots) {
  absl::MutexLock lock(&mu_);
  std::vector<pid_t> pids;
  for (const auto& [pid, child] : children_) {
    if (!job_id.empty() && child->job_id != job_id) continue;
    if (!slots.empty() && std::find(slots.begin(), slots.end(), child->slot) == slots.end())
      continue;
    pids.push_back(pid);
  }
  return pids;
}

void Agent::SignalRanks(const std::string& job_id, const std::vector<int>& slots, int signal) {
  for (pid_t pid : RankPids(job_id, slots))
    kill(pid, signal);  // the rank process only, not its process group
}

void Agent::StopRanks(const std::string& job_id, const std::vector<int>& slots,
                      absl::Duration grace) {
  const std::vector<pid_t> pids = RankPids(job_id, slots);
  if (pids.empty()) return;
  for (pid_t pid : pids) kill(-pid, SIGTERM);
  // Escalate to SIGKILL for whatever is still alive after the grace period.
  absl::MutexLock lock(&mu_);
  threads_.emplace_back([this, pids, grace] {
    const absl::Time deadline = absl::Now() + grace;
    while (absl::Now() < deadline) {
      {
        absl::MutexLock lock(&mu_);
        if (std::none_of(pids.begin(), pids.end(), [&](pid_t p) { return children_.count(p) > 0; }))
          return;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    absl::MutexLock lock(&mu_);
    for (pid_t p : pids) {
      if (children_.count(p)) kill(-p, SIGKILL);
    }
  });
}

}  // namespace chorus
