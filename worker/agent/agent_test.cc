// The real Agent against a fake coordinator (an AgentService on an in-process
// gRPC server on 127.0.0.1:0) and a fake launcher whose rank processes the
// test scripts: print lines, exit with a code or a signal, ignore SIGTERM.
// Asserts what users rely on: slots advertised, one process per launched
// rank with its environment, exits reported with code and last lines, stop
// = SIGTERM then SIGKILL after the grace, checkpoint = SIGUSR1, reports kept
// across a reconnect, Stop() stopping everything.
#include "worker/agent/agent.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/clock.h"
#include "common/env_names.h"
#include "common/join_answers.h"
#include "common/output_limits.h"
#include "common/tcp_relay_for_test.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "worker/agent/rank_launcher.h"
#include "worker/runtime/progress_channel.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// How long any wait in these tests may take before it counts as a failure.
constexpr absl::Duration kPatience = absl::Seconds(10);

// Polls `done` (bounded by kPatience).
bool Eventually(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + kPatience;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

struct SignalSent {
  int signal = 0;
  bool group = false;  // to the process group (else the process alone)
  absl::Time at;
};

// One scripted rank process. The agent holds it through FakeRankProcess;
// the test through the FakeLauncher.
class FakeRank {
 public:
  // Takes its own copy of the heartbeat channel the agent made for it (the
  // agent closes the rank's end once Start returns, as a real rank's copy
  // survives in the process).
  FakeRank(pid_t pid, RankCommand command) : pid_(pid), command_(std::move(command)) {
    int fd = -1;
    if (absl::SimpleAtoi(Env(kEnvAgentHeartbeatsFd), &fd)) {
      const int copy = dup(fd);
      if (copy >= 0) heartbeats_ = std::make_unique<ProgressSender>(copy);
    }
  }

  // Sends a heartbeat to the agent over its channel (as a rank's
  // HeartbeatStream does).
  absl::Status SendHeartbeat(const v1::RankHeartbeat& heartbeat) {
    if (heartbeats_ == nullptr) return absl::FailedPreconditionError("no heartbeat channel");
    return heartbeats_->Send(heartbeat);
  }
  // The next directive the agent passed on, waiting until `deadline`.
  absl::StatusOr<v1::Directive> ReceiveDirective(absl::Time deadline) {
    if (heartbeats_ == nullptr) return absl::FailedPreconditionError("no heartbeat channel");
    return heartbeats_->ReceiveDirective(deadline);
  }

  // Sends a join to the agent over its channel (as a rank's
  // GenerationJoiner does), and waits for the agent's answer.
  absl::Status SendJoin(const v1::JoinRequest& join) {
    if (heartbeats_ == nullptr) return absl::FailedPreconditionError("no heartbeat channel");
    return heartbeats_->SendJoin(join);
  }
  absl::StatusOr<v1::AgentJoinAnswer> ReceiveJoinAnswer(absl::Time deadline) {
    if (heartbeats_ == nullptr) return absl::FailedPreconditionError("no heartbeat channel");
    return heartbeats_->ReceiveJoinAnswer(deadline);
  }

  pid_t pid() const { return pid_; }
  const RankCommand& command() const { return command_; }

  // The value of `key` in its environment ("" if absent).
  std::string Env(const std::string& key) const {
    for (const std::string& e : command_.env) {
      if (absl::StartsWith(e, key + "=")) return e.substr(key.size() + 1);
    }
    return "";
  }
  int Slot() const { return std::stoi(Env("CHORUS_SLOT")); }

  void Print(const std::string& line) {
    absl::MutexLock lock(&mu_);
    output_.push_back(line);
  }
  // Ends the process: its output ends, Wait returns `code` (-N: signal N).
  void Exit(int code) {
    absl::MutexLock lock(&mu_);
    if (!exit_code_.has_value()) exit_code_ = code;
  }
  void IgnoreSigterm() {
    absl::MutexLock lock(&mu_);
    ignores_sigterm_ = true;
  }
  std::vector<SignalSent> signals() const {
    absl::MutexLock lock(&mu_);
    return signals_;
  }
  // Waits (bounded) until at least `n` signals were sent to it.
  bool AwaitSignals(size_t n) const {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return signals_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kPatience);
  }

  absl::StatusOr<std::string> ReadLine(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !output_.empty() || exit_code_.has_value();
    };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    if (!output_.empty()) {
      std::string line = std::move(output_.front());
      output_.pop_front();
      return line;
    }
    if (exit_code_.has_value()) return absl::OutOfRangeError("output ended");
    return absl::DeadlineExceededError("no line yet");
  }
  absl::StatusOr<int> Wait(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto exited = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return exit_code_.has_value(); };
    if (!mu_.AwaitWithDeadline(absl::Condition(&exited), deadline))
      return absl::DeadlineExceededError("still running");
    return *exit_code_;
  }
  // What the kernel would do with the signal to a process that handles
  // none but (maybe) ignores SIGTERM and has SIGUSR1 handled.
  void Receive(int signal, bool group) {
    absl::MutexLock lock(&mu_);
    signals_.push_back({signal, group, absl::Now()});
    if (exit_code_.has_value()) return;
    if (signal == SIGKILL || (signal == SIGTERM && !ignores_sigterm_)) exit_code_ = -signal;
  }

 private:
  const pid_t pid_;
  const RankCommand command_;
  mutable absl::Mutex mu_;
  std::deque<std::string> output_ ABSL_GUARDED_BY(mu_);
  std::optional<int> exit_code_ ABSL_GUARDED_BY(mu_);
  bool ignores_sigterm_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<SignalSent> signals_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ProgressSender> heartbeats_;
};

class FakeRankProcess final : public RankProcess {
 public:
  explicit FakeRankProcess(std::shared_ptr<FakeRank> rank) : rank_(std::move(rank)) {}
  pid_t pid() const override { return rank_->pid(); }
  absl::StatusOr<std::string> ReadLine(absl::Time deadline) override {
    return rank_->ReadLine(deadline);
  }
  absl::StatusOr<int> Wait(absl::Time deadline) override { return rank_->Wait(deadline); }
  void Signal(int signal) override { rank_->Receive(signal, /*group=*/false); }
  void SignalGroup(int signal) override { rank_->Receive(signal, /*group=*/true); }

 private:
  const std::shared_ptr<FakeRank> rank_;
};

class FakeLauncher final : public RankLauncher {
 public:
  absl::StatusOr<std::unique_ptr<RankProcess>> Start(const RankCommand& command) override {
    absl::MutexLock lock(&mu_);
    ++starts_;
    // A held start waits (bounded) for ReleaseStarts().
    auto released = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !holding_; };
    mu_.AwaitWithTimeout(absl::Condition(&released), kPatience);
    if (!start_error_.ok()) return start_error_;
    auto rank = std::make_shared<FakeRank>(next_pid_++, command);
    if (new_ranks_ignore_sigterm_) rank->IgnoreSigterm();
    ranks_.push_back(rank);
    return std::unique_ptr<RankProcess>(std::make_unique<FakeRankProcess>(rank));
  }

  void FailStarts(absl::Status error) {
    absl::MutexLock lock(&mu_);
    start_error_ = std::move(error);
  }
  // Ranks started from now on ignore SIGTERM.
  void IgnoreSigtermInNewRanks() {
    absl::MutexLock lock(&mu_);
    new_ranks_ignore_sigterm_ = true;
  }
  // Start() blocks from now until ReleaseStarts().
  void HoldStarts() {
    absl::MutexLock lock(&mu_);
    holding_ = true;
  }
  void ReleaseStarts() {
    absl::MutexLock lock(&mu_);
    holding_ = false;
  }
  // Waits (bounded) until Start() was called `n` times in all.
  bool AwaitStarts(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return starts_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kPatience);
  }
  int starts() {
    absl::MutexLock lock(&mu_);
    return starts_;
  }
  // Waits (bounded) until `n` ranks were started; all ranks started so far.
  std::vector<std::shared_ptr<FakeRank>> AwaitRanks(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return ranks_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), kPatience);
    return ranks_;
  }
  // The started rank of `job_id` in `slot` (null if none).
  std::shared_ptr<FakeRank> RankOf(const std::string& job_id, int slot) {
    absl::MutexLock lock(&mu_);
    for (const auto& rank : ranks_) {
      if (rank->Env("CHORUS_JOB_ID") == job_id && rank->Slot() == slot) return rank;
    }
    return nullptr;
  }
  // Ends every rank still running (so that no test can leave the agent
  // waiting on one).
  void ExitAll() {
    absl::MutexLock lock(&mu_);
    for (const auto& rank : ranks_) rank->Exit(-SIGKILL);
  }

 private:
  absl::Mutex mu_;
  int starts_ ABSL_GUARDED_BY(mu_) = 0;
  bool holding_ ABSL_GUARDED_BY(mu_) = false;
  bool new_ranks_ignore_sigterm_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status start_error_ ABSL_GUARDED_BY(mu_);
  pid_t next_pid_ ABSL_GUARDED_BY(mu_) = 4200;
  std::vector<std::shared_ptr<FakeRank>> ranks_ ABSL_GUARDED_BY(mu_);
};

// The coordinator's side of AgentService.Connect, scripted by the test: it
// welcomes the agent (unless refusing), records what the agent sends, and
// forwards the messages the test queues.
class FakeCoordinator final : public v1::AgentService::Service {
 public:
  static constexpr char kAgentId[] = "agent-7";

  struct Received {
    int connection = 0;  // 1 for the first accepted connection, ...
    v1::AgentMessage message;
  };

  grpc::Status Connect(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::AgentMessage>* stream) override {
    v1::AgentMessage hello;
    if (!stream->Read(&hello) || !hello.has_hello())
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "expected a hello");
    int connection = 0;
    {
      absl::MutexLock lock(&mu_);
      if (refusing_) {
        ++refused_;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the fake coordinator refuses");
      }
      hellos_.push_back(hello.hello());
      connection = static_cast<int>(hellos_.size());
      dropping_ = false;
      outgoing_.clear();
    }
    std::function<void()> before_welcome;
    {
      absl::MutexLock lock(&mu_);
      before_welcome = before_welcome_;
    }
    if (before_welcome) before_welcome();
    v1::CoordinatorMessage welcome;
    welcome.mutable_welcome()->set_agent_id(kAgentId);
    if (!stream->Write(welcome)) return grpc::Status(grpc::StatusCode::CANCELLED, "agent left");

    bool agent_done = false;  // guarded by mu_
    std::thread reader([&] {
      v1::AgentMessage message;
      while (stream->Read(&message)) {
        absl::MutexLock lock(&mu_);
        received_.push_back({connection, message});
      }
      absl::MutexLock lock(&mu_);
      agent_done = true;
    });
    bool dropped = false;
    while (true) {
      std::deque<v1::CoordinatorMessage> out;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
          return !outgoing_.empty() || dropping_ || agent_done;
        };
        if (!mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100))) {
          if (context->IsCancelled()) break;
          continue;
        }
        if (dropping_ || agent_done) {
          dropped = dropping_;
          break;
        }
        out.swap(outgoing_);
      }
      for (const v1::CoordinatorMessage& m : out) stream->Write(m);
    }
    context->TryCancel();  // ends the reader's Read
    reader.join();
    return dropped ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the fake coordinator dropped")
                   : grpc::Status::OK;
  }

  // Queues `message` for the agent connected now.
  void Send(const v1::CoordinatorMessage& message) {
    absl::MutexLock lock(&mu_);
    outgoing_.push_back(message);
  }
  // Ends the current connection.
  void Drop() {
    absl::MutexLock lock(&mu_);
    dropping_ = true;
  }
  // While refusing, connections get UNAVAILABLE instead of a welcome.
  void Refuse(bool refuse) {
    absl::MutexLock lock(&mu_);
    refusing_ = refuse;
  }
  int refused() {
    absl::MutexLock lock(&mu_);
    return refused_;
  }
  // Runs `hook` on every accepted connection just before its welcome.
  void BeforeWelcome(std::function<void()> hook) {
    absl::MutexLock lock(&mu_);
    before_welcome_ = std::move(hook);
  }

  // The hello of the n-th accepted connection (1-based), waiting (bounded).
  std::optional<v1::AgentHello> AwaitHello(size_t n, absl::Duration patience = kPatience) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return hellos_.size() >= n; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&enough), patience)) return std::nullopt;
    return hellos_[n - 1];
  }

  // The first exit report of `job_id` slot `slot`, waiting (bounded).
  std::optional<Received> AwaitExit(const std::string& job_id, int slot) {
    absl::MutexLock lock(&mu_);
    std::optional<Received> found;
    auto seen = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      for (const Received& r : received_) {
        if (r.message.has_rank_exited() && r.message.rank_exited().job_id() == job_id &&
            r.message.rank_exited().slot() == slot) {
          found = r;
          return true;
        }
      }
      return false;
    };
    mu_.AwaitWithTimeout(absl::Condition(&seen), kPatience);
    return found;
  }

  // Every heartbeats message received so far.
  std::vector<v1::RankHeartbeats> HeartbeatMessages() {
    absl::MutexLock lock(&mu_);
    std::vector<v1::RankHeartbeats> messages;
    for (const Received& r : received_) {
      if (r.message.has_heartbeats()) messages.push_back(r.message.heartbeats());
    }
    return messages;
  }

  // How many pings (AgentMessage.ping_time_us) were received so far.
  size_t Pings() {
    absl::MutexLock lock(&mu_);
    return std::count_if(received_.begin(), received_.end(), [](const Received& r) {
      return r.message.kind_case() == v1::AgentMessage::kPingTimeUs;
    });
  }

  // The cpu_pressure of every ping received so far.
  std::vector<float> PingPressures() {
    absl::MutexLock lock(&mu_);
    std::vector<float> pressures;
    for (const Received& r : received_) {
      if (r.message.kind_case() == v1::AgentMessage::kPingTimeUs) {
        pressures.push_back(r.message.cpu_pressure());
      }
    }
    return pressures;
  }

  // Every RankJoins message received so far.
  std::vector<v1::RankJoins> JoinMessages() {
    absl::MutexLock lock(&mu_);
    std::vector<v1::RankJoins> messages;
    for (const Received& r : received_) {
      if (r.message.has_joins()) messages.push_back(r.message.joins());
    }
    return messages;
  }

  // Every RankLogs message received so far of `job_id` slot `slot`.
  std::vector<v1::AgentMessage> LogMessages(const std::string& job_id, int slot) {
    absl::MutexLock lock(&mu_);
    std::vector<v1::AgentMessage> messages;
    for (const Received& r : received_) {
      if (r.message.has_logs() && r.message.logs().job_id() == job_id &&
          r.message.logs().slot() == slot) {
        messages.push_back(r.message);
      }
    }
    return messages;
  }

  // Every output line received so far of `job_id` slot `slot`, in order.
  std::vector<std::string> LogLines(const std::string& job_id, int slot) {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> lines;
    for (const Received& r : received_) {
      if (r.message.has_logs() && r.message.logs().job_id() == job_id &&
          r.message.logs().slot() == slot) {
        lines.insert(lines.end(), r.message.logs().lines().begin(), r.message.logs().lines().end());
      }
    }
    return lines;
  }

 private:
  absl::Mutex mu_;
  bool refusing_ ABSL_GUARDED_BY(mu_) = false;
  int refused_ ABSL_GUARDED_BY(mu_) = 0;
  bool dropping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<v1::AgentHello> hellos_ ABSL_GUARDED_BY(mu_);
  std::vector<Received> received_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::CoordinatorMessage> outgoing_ ABSL_GUARDED_BY(mu_);
  std::function<void()> before_welcome_ ABSL_GUARDED_BY(mu_);
};

v1::CoordinatorMessage LaunchMessage(const std::string& job_id, int64_t generation,
                                     const std::vector<int>& slots,
                                     const std::string& coordinator = "") {
  v1::CoordinatorMessage message;
  v1::LaunchRanks* launch = message.mutable_launch();
  launch->set_job_id(job_id);
  launch->set_generation(generation);
  launch->set_coordinator(coordinator);
  for (size_t i = 0; i < slots.size(); ++i) {
    v1::RankLaunch* rank = launch->add_ranks();
    rank->set_slot(slots[i]);
    rank->set_local_rank(static_cast<int>(i));
    rank->set_local_world_size(static_cast<int>(slots.size()));
  }
  return message;
}

v1::CoordinatorMessage StopMessage(const std::string& job_id, const std::vector<int>& slots,
                                   double grace_seconds) {
  v1::CoordinatorMessage message;
  message.mutable_stop()->set_job_id(job_id);
  for (int slot : slots) message.mutable_stop()->add_slots(slot);
  message.mutable_stop()->set_grace_seconds(grace_seconds);
  return message;
}

v1::CoordinatorMessage CheckpointMessage(const std::string& job_id, const std::vector<int>& slots) {
  v1::CoordinatorMessage message;
  message.mutable_checkpoint()->set_job_id(job_id);
  for (int slot : slots) message.mutable_checkpoint()->add_slots(slot);
  return message;
}

// JobService.GetLeader as a follower answers it: UNAVAILABLE, and while the
// test says no coordinator can lead, why, in the metadata chorus-no-leader.
class FakeFollower final : public v1::JobService::Service {
 public:
  void SetNoLeader(std::string why) {
    absl::MutexLock lock(&mu_);
    why_ = std::move(why);
  }
  grpc::Status GetLeader(grpc::ServerContext* context, const v1::GetLeaderRequest*,
                         v1::CoordinatorLeader*) override {
    absl::MutexLock lock(&mu_);
    if (!why_.empty()) context->AddTrailingMetadata("chorus-no-leader", why_);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, why_.empty() ? "follower" : why_);
  }

 private:
  absl::Mutex mu_;
  std::string why_ ABSL_GUARDED_BY(mu_);
};

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&coordinator_);
    builder.RegisterService(&follower_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    port_ = port;
    options_.coordinator = absl::StrCat("127.0.0.1:", port);
    options_.slots = 2;
    options_.host = "node-a";
    options_.rank_binary = "/opt/chorus/chorus-rank";
    options_.connect_timeout = kPatience;
    options_.stop_grace = absl::Milliseconds(200);
    options_.launcher = launcher_;
  }

  void StartAgent() {
    agent_ = std::make_unique<Agent>(options_);
    run_thread_ = std::thread([this] {
      run_status_ = agent_->Run();
      run_returned_.Notify();
    });
  }

  // Starts the agent and waits for its first connection.
  void Connect() {
    StartAgent();
    ASSERT_TRUE(coordinator_.AwaitHello(1).has_value());
  }

  bool RunReturns() { return run_returned_.WaitForNotificationWithTimeout(kPatience); }

  void TearDown() override {
    if (agent_ != nullptr) {
      agent_->Stop();
      EXPECT_TRUE(RunReturns());
      run_thread_.join();
      launcher_->ExitAll();
      agent_.reset();
    }
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  }

  FakeCoordinator coordinator_;
  FakeFollower follower_;
  std::shared_ptr<FakeLauncher> launcher_ = std::make_shared<FakeLauncher>();
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;  // the fake coordinator's
  AgentOptions options_;
  std::unique_ptr<Agent> agent_;
  std::thread run_thread_;
  absl::Notification run_returned_;
  absl::Status run_status_;
};

TEST_F(AgentTest, AdvertisesItsSlots) {
  options_.slots = 3;
  options_.threads_per_rank = 2;
  StartAgent();
  std::optional<v1::AgentHello> hello = coordinator_.AwaitHello(1);
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(hello->host(), "node-a");
  EXPECT_EQ(hello->slots(), 3);
  EXPECT_EQ(hello->device(), v1::ResourceSpec::CPU);
  EXPECT_EQ(hello->threads_per_rank(), 2);
  EXPECT_EQ(hello->pid(), getpid());
  EXPECT_EQ(hello->version(), kVersion);
  EXPECT_EQ(hello->running_size(), 0);
}

TEST_F(AgentTest, LaunchStartsOneProcessPerRankWithItsEnvironment) {
  setenv("CHORUS_AGENT_TEST_INHERITED", "kept", 1);
  setenv("CHORUS_JOB_ID", "stale", 1);
  options_.threads_per_rank = 3;
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 4, {0, 1}, "127.0.0.1:7777"));
  std::vector<std::shared_ptr<FakeRank>> ranks = launcher_->AwaitRanks(2);
  ASSERT_EQ(ranks.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(absl::StrCat("rank ", i));
    const FakeRank& rank = *ranks[i];
    EXPECT_THAT(rank.command().argv, ElementsAre("/opt/chorus/chorus-rank"));
    EXPECT_EQ(rank.Env("CHORUS_COORDINATOR"), "127.0.0.1:7777");
    EXPECT_EQ(rank.Env("CHORUS_JOB_ID"), "job-1");
    EXPECT_EQ(rank.Env("CHORUS_GENERATION"), "4");
    EXPECT_EQ(rank.Env("CHORUS_AGENT_ID"), FakeCoordinator::kAgentId);
    EXPECT_EQ(rank.Env("CHORUS_SLOT"), std::to_string(i));
    EXPECT_EQ(rank.Env("LOCAL_RANK"), std::to_string(i));
    EXPECT_EQ(rank.Env("LOCAL_WORLD_SIZE"), "2");
    EXPECT_EQ(rank.Env("OMP_NUM_THREADS"), "3");
    EXPECT_EQ(rank.Env("CHORUS_AGENT_TEST_INHERITED"), "kept");
    // The agent's own value is replaced, not left beside the new one.
    EXPECT_EQ(
        std::count_if(rank.command().env.begin(), rank.command().env.end(),
                      [](const std::string& e) { return absl::StartsWith(e, "CHORUS_JOB_ID="); }),
        1);
  }
  EXPECT_TRUE(Eventually([&] { return agent_->live_ranks() == 2; }));

  // Without an address in the launch, ranks dial the agent's coordinator.
  coordinator_.Send(LaunchMessage("job-2", 1, {2}));
  ranks = launcher_->AwaitRanks(3);
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[2]->Env("CHORUS_COORDINATOR"), options_.coordinator);
  EXPECT_EQ(ranks[2]->Env("CHORUS_JOB_ID"), "job-2");
  EXPECT_EQ(ranks[2]->Env("LOCAL_WORLD_SIZE"), "1");
  EXPECT_TRUE(Eventually([&] { return agent_->live_ranks() == 3; }));
  unsetenv("CHORUS_AGENT_TEST_INHERITED");
  unsetenv("CHORUS_JOB_ID");
}

// An agent given several coordinators reaches the one that leads through
// the list, and hands its ranks the whole list rather than the address the
// leader put in the launch: the leader may move while they run.
TEST_F(AgentTest, AnAgentGivenSeveralCoordinatorsHandsItsRanksTheList) {
  // Nothing listens on port 1; the fake coordinator (no health service,
  // which gRPC's health checking counts as serving) is the only one up.
  options_.coordinator = absl::StrCat("127.0.0.1:1,", options_.coordinator);
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0}, "127.0.0.1:7777"));
  std::vector<std::shared_ptr<FakeRank>> ranks = launcher_->AwaitRanks(1);
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0]->Env("CHORUS_COORDINATOR"), options_.coordinator);
}

// Note [Job credentials]: user code in a rank must not hold the agent's
// token, whether the agent got it from the environment or a file.
TEST_F(AgentTest, RanksGetTheirJobsCredentialAndNeverTheAgentsToken) {
  constexpr char kAgentToken[] = "agent-worker-token-0123456789";
  setenv("CHORUS_TOKEN", kAgentToken, 1);
  setenv("CHORUS_TOKEN_FILE", "/etc/chorus/worker.token", 1);
  Connect();
  v1::CoordinatorMessage launch = LaunchMessage("job-1", 1, {0, 1});
  launch.mutable_launch()->set_credential("chorus-job:job-1:0123abcd");
  coordinator_.Send(launch);
  std::vector<std::shared_ptr<FakeRank>> ranks = launcher_->AwaitRanks(2);
  ASSERT_EQ(ranks.size(), 2u);
  auto has = [](const FakeRank& rank, const std::string& text) {
    return std::any_of(rank.command().env.begin(), rank.command().env.end(),
                       [&](const std::string& e) { return absl::StrContains(e, text); });
  };
  for (const auto& rank : ranks) {
    EXPECT_EQ(rank->Env("CHORUS_TOKEN"), "chorus-job:job-1:0123abcd");
    EXPECT_FALSE(has(*rank, kAgentToken)) << "the agent's token reached a rank";
    EXPECT_FALSE(has(*rank, "CHORUS_TOKEN_FILE=")) << "the agent's token file reached a rank";
  }

  // A coordinator without tokens sends no credential: the ranks get none.
  coordinator_.Send(LaunchMessage("job-2", 1, {2}));
  ranks = launcher_->AwaitRanks(3);
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_FALSE(has(*ranks[2], "CHORUS_TOKEN")) << "a rank of job-2 got a token";
  unsetenv("CHORUS_TOKEN");
  unsetenv("CHORUS_TOKEN_FILE");
}

// Note [Rank accounts] in rank_accounts.h: the launch's account first,
// else a uid of the range; an account this node lacks fails the start
// saying so. The heartbeat channel is the one descriptor a rank inherits.
TEST_F(AgentTest, RanksRunAsTheAccountTheLaunchNamesElseAUidOfTheRange) {
  if (geteuid() != 0) GTEST_SKIP() << "only a root agent runs ranks as other accounts";
  options_.rank_uid_range = UidRange{61000, 61009};
  Connect();
  v1::CoordinatorMessage mapped = LaunchMessage("job-1", 1, {0});
  mapped.mutable_launch()->set_unix_account("nobody");
  coordinator_.Send(mapped);
  coordinator_.Send(LaunchMessage("job-2", 1, {1}));
  std::vector<std::shared_ptr<FakeRank>> ranks = launcher_->AwaitRanks(2);
  ASSERT_EQ(ranks.size(), 2u);
  const RankCommand& nobody = launcher_->RankOf("job-1", 0)->command();
  ASSERT_TRUE(nobody.account.has_value());
  EXPECT_EQ(nobody.account->uid, 65534u);
  EXPECT_EQ(launcher_->RankOf("job-1", 0)->Env("USER"), "nobody");
  const RankCommand& ranged = launcher_->RankOf("job-2", 1)->command();
  ASSERT_TRUE(ranged.account.has_value());
  EXPECT_EQ(ranged.account->uid, 61000u);
  EXPECT_EQ(ranged.account->gid, 61000u);
  for (const auto& rank : ranks) {
    EXPECT_THAT(rank->command().inherit_fds,
                ElementsAre(std::stoi(rank->Env(kEnvAgentHeartbeatsFd))));
  }

  v1::CoordinatorMessage unknown = LaunchMessage("job-3", 1, {0});
  unknown.mutable_launch()->set_unix_account("no-such-account-57");
  coordinator_.Send(unknown);
  std::optional<FakeCoordinator::Received> exit = coordinator_.AwaitExit("job-3", 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->message.rank_exited().exit_code(), 127);
  EXPECT_THAT(exit->message.rank_exited().stderr_tail(),
              ElementsAre(HasSubstr("chorus-worker the job's owner maps to Unix account "
                                    "\"no-such-account-57\" (unix= in the coordinator's token "
                                    "file), which this node does not have")));
}

TEST_F(AgentTest, EachSlotsRankIsBoundToItsShareOfTheCpus) {
  // As under taskset -c 4-7: the shares come from the agent's CPUs.
  options_.cpus = {4, 5, 6, 7};
  options_.slots = 2;
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {1, 0}));
  std::vector<std::shared_ptr<FakeRank>> ranks = launcher_->AwaitRanks(2);
  ASSERT_EQ(ranks.size(), 2u);
  for (const auto& rank : ranks) {
    SCOPED_TRACE(absl::StrCat("slot ", rank->Slot()));
    EXPECT_THAT(rank->command().cpus, rank->Slot() == 0 ? ElementsAre(4, 5) : ElementsAre(6, 7));
    EXPECT_EQ(rank->Env("CHORUS_CPUS"), rank->Slot() == 0 ? "4-5" : "6-7");
  }
}

TEST_F(AgentTest, NothingIsBoundWithMoreSlotsThanCpus) {
  setenv("CHORUS_CPUS", "stale", 1);
  options_.cpus = {0, 1};
  options_.slots = 4;
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0, 3}));
  std::vector<std::shared_ptr<FakeRank>> ranks = launcher_->AwaitRanks(2);
  ASSERT_EQ(ranks.size(), 2u);
  for (const auto& rank : ranks) {
    EXPECT_THAT(rank->command().cpus, IsEmpty());
    // Not inherited from the agent's own environment either.
    EXPECT_EQ(rank->Env("CHORUS_CPUS"), "");
  }
  unsetenv("CHORUS_CPUS");
}

TEST_F(AgentTest, NothingIsBoundWhenBindingIsOff) {
  options_.cpus = {0, 1, 2, 3};
  options_.slots = 2;
  options_.bind_cpus = false;
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0}));
  std::vector<std::shared_ptr<FakeRank>> ranks = launcher_->AwaitRanks(1);
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_THAT(ranks[0]->command().cpus, IsEmpty());
  EXPECT_EQ(ranks[0]->Env("CHORUS_CPUS"), "");
}

TEST_F(AgentTest, ExitIsReportedWithItsCodeAndLastLines) {
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0}));
  ASSERT_EQ(launcher_->AwaitRanks(1).size(), 1u);
  std::shared_ptr<FakeRank> rank = launcher_->RankOf("job-1", 0);
  std::vector<std::string> printed;
  for (int i = 0; i < 25; ++i) {
    printed.push_back(absl::StrCat("line ", i));
    rank->Print(printed.back());
  }
  rank->Exit(3);

  std::optional<FakeCoordinator::Received> exit = coordinator_.AwaitExit("job-1", 0);
  ASSERT_TRUE(exit.has_value());
  const v1::RankExited& exited = exit->message.rank_exited();
  EXPECT_EQ(exited.exit_code(), 3);
  EXPECT_EQ(exited.pid(), rank->pid());
  // The last 20 lines, oldest first.
  EXPECT_THAT(exited.stderr_tail(),
              ElementsAreArray(std::vector<std::string>(printed.begin() + 5, printed.end())));
  // Every line went to the coordinator before the exit.
  EXPECT_EQ(coordinator_.LogLines("job-1", 0), printed);
  EXPECT_TRUE(Eventually([&] { return agent_->live_ranks() == 0; }));
}

// Note [Bounded job output]: one 40 MB line once broke the agent's stream
// (gRPC's message limit) and with it every job on the node.
TEST_F(AgentTest, OutputIsSentInBoundedMessagesWhateverTheRankPrints) {
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0}));
  ASSERT_EQ(launcher_->AwaitRanks(1).size(), 1u);
  std::shared_ptr<FakeRank> rank = launcher_->RankOf("job-1", 0);
  // A launcher that did not bound its lines: one of 8 MB, then 300 of
  // 10 KB (3 MB in all), then the last word.
  rank->Print(std::string(8 << 20, 'x'));
  for (int i = 0; i < 300; ++i) rank->Print(absl::StrCat(i, std::string(10000, 'y')));
  rank->Print("error: the end");
  rank->Exit(1);

  std::optional<FakeCoordinator::Received> exit = coordinator_.AwaitExit("job-1", 0);
  ASSERT_TRUE(exit.has_value());
  const std::vector<v1::AgentMessage> batches = coordinator_.LogMessages("job-1", 0);
  size_t lines = 0;
  for (const v1::AgentMessage& batch : batches) {
    size_t bytes = 0;
    for (const std::string& line : batch.logs().lines()) {
      EXPECT_LE(line.size(), kMaxBoundedLineBytes + 64);
      bytes += line.size();
    }
    EXPECT_LE(static_cast<size_t>(batch.logs().lines_size()), kMaxLogBatchLines);
    EXPECT_LE(bytes, kMaxLogBatchBytes);
    lines += batch.logs().lines_size();
  }
  // Every line arrives, the long one cut with its marker.
  EXPECT_EQ(lines, 302u);
  const std::vector<std::string> all = coordinator_.LogLines("job-1", 0);
  ASSERT_EQ(all.size(), 302u);
  EXPECT_TRUE(absl::EndsWith(all[0], " bytes of this line dropped]")) << all[0].substr(0, 100);
  EXPECT_EQ(all[1].size(), 10001u);
  EXPECT_EQ(all.back(), "error: the end");

  const v1::RankExited& exited = exit->message.rank_exited();
  size_t tail_bytes = 0;
  for (const std::string& line : exited.stderr_tail()) tail_bytes += line.size();
  EXPECT_LE(static_cast<size_t>(exited.stderr_tail_size()), kMaxTailLines);
  EXPECT_LE(tail_bytes, kMaxTailBytes);
  ASSERT_GT(exited.stderr_tail_size(), 0);
  EXPECT_EQ(exited.stderr_tail(exited.stderr_tail_size() - 1), "error: the end");
  EXPECT_LT(exit->message.ByteSizeLong(), kMaxTailBytes + 4096);
}

TEST_F(AgentTest, DeathBySignalIsReportedAsMinusTheSignal) {
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {1}));
  ASSERT_EQ(launcher_->AwaitRanks(1).size(), 1u);
  std::shared_ptr<FakeRank> rank = launcher_->RankOf("job-1", 1);
  rank->Print("about to crash");
  rank->Exit(-SIGSEGV);
  std::optional<FakeCoordinator::Received> exit = coordinator_.AwaitExit("job-1", 1);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->message.rank_exited().exit_code(), -SIGSEGV);
  EXPECT_THAT(exit->message.rank_exited().stderr_tail(), ElementsAre("about to crash"));
}

TEST_F(AgentTest, RankThatCannotStartIsReportedAsExit127) {
  launcher_->FailStarts(
      absl::NotFoundError("could not start /opt/chorus/chorus-rank: No such file or directory"));
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0}));
  std::optional<FakeCoordinator::Received> exit = coordinator_.AwaitExit("job-1", 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->message.rank_exited().exit_code(), 127);
  EXPECT_THAT(exit->message.rank_exited().stderr_tail(),
              ElementsAre("chorus-worker could not start /opt/chorus/chorus-rank: No such file or "
                          "directory"));
  EXPECT_EQ(agent_->live_ranks(), 0);
}

TEST_F(AgentTest, StopSendsSigtermThenSigkillAfterTheGrace) {
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0, 1, 2}));
  ASSERT_EQ(launcher_->AwaitRanks(3).size(), 3u);
  std::shared_ptr<FakeRank> stubborn = launcher_->RankOf("job-1", 0);
  std::shared_ptr<FakeRank> polite = launcher_->RankOf("job-1", 1);
  std::shared_ptr<FakeRank> spared = launcher_->RankOf("job-1", 2);
  stubborn->IgnoreSigterm();
  EXPECT_TRUE(Eventually([&] { return agent_->live_ranks() == 3; }));

  coordinator_.Send(StopMessage("job-1", {0, 1}, 0.3));
  std::optional<FakeCoordinator::Received> polite_exit = coordinator_.AwaitExit("job-1", 1);
  ASSERT_TRUE(polite_exit.has_value());
  EXPECT_EQ(polite_exit->message.rank_exited().exit_code(), -SIGTERM);
  std::optional<FakeCoordinator::Received> stubborn_exit = coordinator_.AwaitExit("job-1", 0);
  ASSERT_TRUE(stubborn_exit.has_value());
  EXPECT_EQ(stubborn_exit->message.rank_exited().exit_code(), -SIGKILL);

  std::vector<SignalSent> signals = stubborn->signals();
  ASSERT_EQ(signals.size(), 2u);
  EXPECT_EQ(signals[0].signal, SIGTERM);
  EXPECT_TRUE(signals[0].group);
  EXPECT_EQ(signals[1].signal, SIGKILL);
  EXPECT_TRUE(signals[1].group);
  EXPECT_GE(signals[1].at - signals[0].at, absl::Milliseconds(300));
  // The one that left on SIGTERM gets nothing more, even after the grace.
  absl::SleepFor(absl::Milliseconds(400));
  signals = polite->signals();
  ASSERT_EQ(signals.size(), 1u);
  EXPECT_EQ(signals[0].signal, SIGTERM);
  EXPECT_TRUE(signals[0].group);
  EXPECT_THAT(spared->signals(), IsEmpty());
  EXPECT_EQ(agent_->live_ranks(), 1);
}

TEST_F(AgentTest, CheckpointSendsSigusr1ToTheRankProcessOnly) {
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0, 1}));
  coordinator_.Send(LaunchMessage("job-2", 1, {2}));
  ASSERT_EQ(launcher_->AwaitRanks(3).size(), 3u);
  // One slot, then (no slots) the whole job.
  coordinator_.Send(CheckpointMessage("job-1", {1}));
  coordinator_.Send(CheckpointMessage("job-1", {}));
  std::shared_ptr<FakeRank> slot0 = launcher_->RankOf("job-1", 0);
  ASSERT_TRUE(launcher_->RankOf("job-1", 1)->AwaitSignals(2));
  ASSERT_TRUE(slot0->AwaitSignals(1));
  // Both checkpoints are handled now: the job-2 rank was never among the
  // ranks to signal.
  std::vector<SignalSent> signals = launcher_->RankOf("job-1", 1)->signals();
  ASSERT_EQ(signals.size(), 2u);
  for (const SignalSent& s : signals) {
    EXPECT_EQ(s.signal, SIGUSR1);
    EXPECT_FALSE(s.group);
  }
  signals = slot0->signals();
  ASSERT_EQ(signals.size(), 1u);
  EXPECT_EQ(signals[0].signal, SIGUSR1);
  EXPECT_FALSE(signals[0].group);
  EXPECT_THAT(launcher_->RankOf("job-2", 2)->signals(), IsEmpty());
  EXPECT_EQ(agent_->live_ranks(), 3);
}

TEST_F(AgentTest, ExitWhileDisconnectedIsReportedAfterReconnecting) {
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 5, {0, 1}));
  ASSERT_EQ(launcher_->AwaitRanks(2).size(), 2u);
  EXPECT_TRUE(Eventually([&] { return agent_->live_ranks() == 2; }));

  coordinator_.Refuse(true);
  coordinator_.Drop();
  // The agent has noticed once it has tried again.
  ASSERT_TRUE(Eventually([&] { return coordinator_.refused() >= 1; }));
  std::shared_ptr<FakeRank> leaving = launcher_->RankOf("job-1", 0);
  leaving->Print("lost my data");
  leaving->Exit(2);
  ASSERT_TRUE(Eventually([&] { return agent_->live_ranks() == 1; }));
  coordinator_.Refuse(false);

  std::optional<v1::AgentHello> first = coordinator_.AwaitHello(1);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->agent_id(), "") << "nothing to be recognized by on a first connection";
  std::optional<v1::AgentHello> hello = coordinator_.AwaitHello(2);
  ASSERT_TRUE(hello.has_value());
  // Note [Agent reconnect grace]: the id it was welcomed with, by which a
  // coordinator still holding its old stream knows it.
  EXPECT_EQ(hello->agent_id(), FakeCoordinator::kAgentId);
  // The rank still running is announced so the coordinator can take it back.
  ASSERT_EQ(hello->running_size(), 1);
  EXPECT_EQ(hello->running(0).job_id(), "job-1");
  EXPECT_EQ(hello->running(0).generation(), 5);
  EXPECT_EQ(hello->running(0).slot(), 1);
  EXPECT_EQ(hello->running(0).pid(), launcher_->RankOf("job-1", 1)->pid());
  EXPECT_THAT(hello->exited(), IsEmpty()) << "an exit never written follows the welcome";
  std::optional<FakeCoordinator::Received> exit = coordinator_.AwaitExit("job-1", 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->connection, 2);
  EXPECT_EQ(exit->message.rank_exited().exit_code(), 2);
  EXPECT_THAT(exit->message.rank_exited().stderr_tail(), ElementsAre("lost my data"));
  // The surviving rank was left alone.
  EXPECT_THAT(launcher_->RankOf("job-1", 1)->signals(), IsEmpty());
}

// Note [Reports kept while disconnected]: ranks that exit while the agent
// is being welcomed back race its taking of the kept reports; every exit
// must reach the coordinator on that connection, none wait for another.
TEST_F(AgentTest, EveryExitDuringAReconnectionIsReportedOnTheNewConnection) {
  constexpr int kRounds = 6;
  constexpr int kRanks = 8;
  Connect();
  std::vector<int> slots(kRanks);
  std::iota(slots.begin(), slots.end(), 0);
  for (int round = 0; round < kRounds; ++round) {
    const std::string job = absl::StrCat("job-", round);
    coordinator_.Send(LaunchMessage(job, 1, slots));
    const size_t launched = static_cast<size_t>((round + 1) * kRanks);
    ASSERT_EQ(launcher_->AwaitRanks(launched).size(), launched);
    ASSERT_TRUE(Eventually([&] { return agent_->live_ranks() == kRanks; }));
    coordinator_.Refuse(true);
    coordinator_.Drop();
    ASSERT_TRUE(Eventually([&] { return coordinator_.refused() >= round + 1; }));
    // The ranks exit while the agent's next connection is being welcomed.
    coordinator_.BeforeWelcome([&, job] {
      for (int slot : slots) launcher_->RankOf(job, slot)->Exit(0);
      absl::SleepFor(absl::Microseconds(200 * (round % 3)));
    });
    coordinator_.Refuse(false);
    ASSERT_TRUE(coordinator_.AwaitHello(round + 2).has_value());
    for (int slot : slots) {
      std::optional<FakeCoordinator::Received> exit = coordinator_.AwaitExit(job, slot);
      ASSERT_TRUE(exit.has_value()) << job << " slot " << slot << " was never reported";
      EXPECT_EQ(exit->connection, round + 2) << job << " slot " << slot;
    }
    coordinator_.BeforeWelcome(nullptr);
  }
}

// Note [Exits told again] in coordinator/scheduling/job_recovery.h: an exit written to a
// coordinator that may have died before reading it is told again in the
// next hello, with its generation; the newest few only.
TEST_F(AgentTest, ExitsWrittenLatelyAreToldAgainInTheNextHello) {
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 3, {0, 1}));
  ASSERT_EQ(launcher_->AwaitRanks(2).size(), 2u);
  launcher_->RankOf("job-1", 0)->Print("done");
  launcher_->RankOf("job-1", 0)->Exit(0);
  std::optional<FakeCoordinator::Received> first = coordinator_.AwaitExit("job-1", 0);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->message.rank_exited().generation(), 3);

  coordinator_.Drop();
  std::optional<v1::AgentHello> hello = coordinator_.AwaitHello(2);
  ASSERT_TRUE(hello.has_value());
  ASSERT_EQ(hello->exited_size(), 1);
  EXPECT_EQ(hello->exited(0).job_id(), "job-1");
  EXPECT_EQ(hello->exited(0).slot(), 0);
  EXPECT_EQ(hello->exited(0).generation(), 3);
  EXPECT_EQ(hello->exited(0).exit_code(), 0);
  EXPECT_THAT(hello->exited(0).stderr_tail(), ElementsAre("done"));
  ASSERT_EQ(hello->running_size(), 1);
  EXPECT_EQ(hello->running(0).slot(), 1);

  // 70 more exits: the hello keeps the newest 64.
  std::vector<int> slots(70);
  std::iota(slots.begin(), slots.end(), 0);
  coordinator_.Send(LaunchMessage("job-2", 1, slots));
  ASSERT_EQ(launcher_->AwaitRanks(72).size(), 72u);
  for (int slot : slots) launcher_->RankOf("job-2", slot)->Exit(1);
  for (int slot : slots) ASSERT_TRUE(coordinator_.AwaitExit("job-2", slot).has_value());
  coordinator_.Drop();
  hello = coordinator_.AwaitHello(3);
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(hello->exited_size(), 64);
  for (const v1::RankExited& e : hello->exited()) EXPECT_EQ(e.job_id(), "job-2");
}

TEST_F(AgentTest, RanksStopWhenTheCoordinatorStaysAwayPastTheWindow) {
  options_.reconnect_window = absl::Milliseconds(300);
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0}));
  ASSERT_EQ(launcher_->AwaitRanks(1).size(), 1u);
  std::shared_ptr<FakeRank> rank = launcher_->RankOf("job-1", 0);
  EXPECT_TRUE(Eventually([&] { return agent_->live_ranks() == 1; }));
  coordinator_.Refuse(true);
  const absl::Time dropped = absl::Now();
  coordinator_.Drop();
  ASSERT_TRUE(rank->AwaitSignals(1));
  const std::vector<SignalSent> signals = rank->signals();
  EXPECT_EQ(signals[0].signal, SIGTERM);
  EXPECT_TRUE(signals[0].group);
  EXPECT_GE(signals[0].at - dropped, absl::Milliseconds(300));
  EXPECT_TRUE(Eventually([&] { return agent_->live_ranks() == 0; }));
}

// Note [Ranks outlive a leaderless cluster]: while the coordinators say none
// can lead (etcd without quorum) the ranks outlive the window; once they no
// longer say so, the window stops them.
TEST_F(AgentTest, RanksKeepTrainingPastTheWindowWhileTheCoordinatorsWaitForTheirState) {
  options_.reconnect_window = absl::Milliseconds(300);
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0}));
  ASSERT_EQ(launcher_->AwaitRanks(1).size(), 1u);
  std::shared_ptr<FakeRank> rank = launcher_->RankOf("job-1", 0);
  EXPECT_TRUE(Eventually([&] { return agent_->live_ranks() == 1; }));
  follower_.SetNoLeader("no coordinator can lead: etcd at 127.0.0.1:1: range: no quorum");
  coordinator_.Refuse(true);
  coordinator_.Drop();

  // Four windows and more: the rank is left alone.
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_THAT(rank->signals(), IsEmpty());
  EXPECT_EQ(agent_->live_ranks(), 1);

  const absl::Time answered = absl::Now();
  follower_.SetNoLeader("");
  ASSERT_TRUE(rank->AwaitSignals(1));
  EXPECT_EQ(rank->signals()[0].signal, SIGTERM);
  EXPECT_LE(rank->signals()[0].at - answered, absl::Seconds(3));
}

TEST_F(AgentTest, StopStopsEveryRankAndRunReturns) {
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0, 1}));
  ASSERT_EQ(launcher_->AwaitRanks(2).size(), 2u);
  std::shared_ptr<FakeRank> stubborn = launcher_->RankOf("job-1", 0);
  std::shared_ptr<FakeRank> polite = launcher_->RankOf("job-1", 1);
  stubborn->IgnoreSigterm();
  EXPECT_TRUE(Eventually([&] { return agent_->live_ranks() == 2; }));

  agent_->Stop();
  ASSERT_TRUE(RunReturns());
  EXPECT_TRUE(run_status_.ok()) << run_status_;
  EXPECT_TRUE(Eventually([&] { return agent_->live_ranks() == 0; }));
  std::vector<SignalSent> signals = polite->signals();
  ASSERT_EQ(signals.size(), 1u);
  EXPECT_EQ(signals[0].signal, SIGTERM);
  signals = stubborn->signals();
  ASSERT_EQ(signals.size(), 2u);
  EXPECT_EQ(signals[0].signal, SIGTERM);
  EXPECT_EQ(signals[1].signal, SIGKILL);
  EXPECT_GE(signals[1].at - signals[0].at, options_.stop_grace);
}

// Note [Stopping while launching] in agent.cc: Stop() while Launch is
// inside Start() for one rank of a launch.
TEST_F(AgentTest, StopWhileARankIsStartingStopsThatRank) {
  launcher_->HoldStarts();
  launcher_->IgnoreSigtermInNewRanks();
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0, 1}));
  ASSERT_TRUE(launcher_->AwaitStarts(1));
  agent_->Stop();
  launcher_->ReleaseStarts();
  ASSERT_TRUE(RunReturns());
  std::vector<std::shared_ptr<FakeRank>> ranks = launcher_->AwaitRanks(1);
  ASSERT_GE(ranks.size(), 1u);
  // The rank that was starting is stopped like any other: SIGTERM, then
  // SIGKILL after the grace (it ignores SIGTERM)...
  ASSERT_TRUE(ranks[0]->AwaitSignals(2));
  const std::vector<SignalSent> signals = ranks[0]->signals();
  EXPECT_EQ(signals[0].signal, SIGTERM);
  EXPECT_EQ(signals[1].signal, SIGKILL);
  EXPECT_GE(signals[1].at - signals[0].at, options_.stop_grace);
  EXPECT_TRUE(Eventually([&] { return agent_->live_ranks() == 0; }));
  // ...and the rest of the launch is not started at all.
  EXPECT_EQ(launcher_->starts(), 1);
}

// Note [Reaping threads] in agent.cc: each rank's monitor and each stop's
// SIGKILL escalation is a thread; finished ones once stayed unjoined (two
// memory maps each) until the agent ended.
TEST_F(AgentTest, ThreadsOfFinishedRanksAndStopsAreJoinedWhileTheAgentRuns) {
  options_.slots = 1;
  Connect();
  constexpr int kJobs = 50;
  constexpr int kThreadsHeld = 10;
  for (int i = 0; i < kJobs; ++i) {
    const std::string job_id = absl::StrCat("job-", i);
    coordinator_.Send(LaunchMessage(job_id, 1, {0}));
    ASSERT_EQ(launcher_->AwaitRanks(i + 1).size(), static_cast<size_t>(i + 1));
    std::shared_ptr<FakeRank> rank = launcher_->RankOf(job_id, 0);
    ASSERT_NE(rank, nullptr);
    if (i % 2 == 0) {
      rank->Print("done");
      rank->Exit(0);
    } else {
      ASSERT_TRUE(Eventually([&] { return agent_->live_ranks() == 1; }));
      coordinator_.Send(StopMessage(job_id, {0}, 0.01));  // leaves on SIGTERM
    }
    ASSERT_TRUE(coordinator_.AwaitExit(job_id, 0).has_value()) << job_id;
    // The heartbeat forwarder, its urgent watcher and the join forwarder,
    // plus the last few ranks' monitors and stops' escalations, finished
    // since the last reaping or (on a loaded machine) still returning.
    EXPECT_LE(agent_->threads_held(), kThreadsHeld) << "after " << job_id;
  }
  EXPECT_TRUE(Eventually([&] { return agent_->live_ranks() == 0; }));
  // Not one per rank or stop the agent has seen (75 here).
  EXPECT_LE(agent_->threads_held(), kThreadsHeld);
}

// Note [Reconnecting over a slow link]: new connections' handshakes take
// 3 s, longer than the quick channel's attempts may (at most 2.4 s, its
// capped and jittered backoff), so only a patient attempt gets through.
TEST_F(AgentTest, ReconnectsOverALinkWhoseHandshakesOutlastAQuickAttempt) {
  TcpRelay relay(port_);
  ASSERT_GT(relay.port(), 0);
  options_.coordinator = absl::StrCat("127.0.0.1:", relay.port());
  Connect();
  // Welcomed, not only heard: patient attempts begin once the agent has
  // been welcomed, and a cut between its hello and the welcome left it
  // making quick attempts only (the test failed so, 2 runs in 3 beside each
  // other). A ping goes out only on a stream the agent was welcomed on.
  ASSERT_TRUE(Eventually([&] { return coordinator_.Pings() >= 1; }));
  relay.HoldNewConnections(absl::Seconds(3));
  const absl::Time cut = absl::Now();
  relay.Cut();

  // A patient attempt has 2 s over the 3 s hold (kOneShotConnectTimeout is
  // 5 s), which a loaded machine may eat; every second attempt is patient,
  // so a longer wait gives several. Without patient attempts no connection
  // gets through, however long the wait.
  constexpr absl::Duration kSeveralPatientAttempts = absl::Seconds(30);
  std::optional<v1::AgentHello> hello = coordinator_.AwaitHello(2, kSeveralPatientAttempts);
  ASSERT_TRUE(hello.has_value()) << "not welcomed again within " << kSeveralPatientAttempts
                                 << " after " << relay.accepted() << " connection(s)";
  EXPECT_EQ(hello->agent_id(), FakeCoordinator::kAgentId);
  EXPECT_GE(absl::Now() - cut, absl::Seconds(3)) << "a connection held back 3 s carried it";
  EXPECT_GE(relay.accepted(), 3) << "the first connection, then a quick and a patient attempt";
}

TEST_F(AgentTest, FirstConnectionGivesUpAfterTheConnectTimeout) {
  coordinator_.Refuse(true);
  options_.connect_timeout = absl::Milliseconds(300);
  StartAgent();
  ASSERT_TRUE(RunReturns());
  EXPECT_TRUE(absl::IsUnavailable(run_status_)) << run_status_;
  EXPECT_THAT(run_status_.message(),
              HasSubstr(absl::StrCat("no coordinator answered at ", options_.coordinator)));
  EXPECT_GE(coordinator_.refused(), 1);
}

}  // namespace
}  // namespace chorus

namespace chorus {
namespace {

v1::RankHeartbeat RankHeartbeatOf(const std::string& job_id, int64_t generation, int rank,
                                  int64_t step) {
  v1::RankHeartbeat heartbeat;
  heartbeat.set_job_id(job_id);
  heartbeat.set_generation(generation);
  heartbeat.set_rank(rank);
  heartbeat.set_step(step);
  return heartbeat;
}

// The ranks (rank numbers) in `message`, and the step of each.
std::map<int, int64_t> StepsByRank(const v1::RankHeartbeats& message) {
  std::map<int, int64_t> steps;
  for (const v1::RankHeartbeat& heartbeat : message.heartbeats()) {
    steps[heartbeat.rank()] = heartbeat.step();
  }
  return steps;
}

class AgentHeartbeatsTest : public AgentTest {
 protected:
  static constexpr absl::Duration kInterval = absl::Seconds(1);

  void SetUp() override {
    AgentTest::SetUp();
    options_.heartbeat_interval = kInterval;
    options_.clock = &clock_;
  }

  // Moves the agent's clock on an interval at a time until the coordinator
  // has `n` heartbeats messages in all (bounded by kPatience); those. The
  // agent sends only a ping for an interval without heartbeats, so extra
  // intervals add no heartbeats message.
  std::vector<v1::RankHeartbeats> AdvanceUntilMessages(size_t n) {
    const absl::Time deadline = absl::Now() + kPatience;
    std::vector<v1::RankHeartbeats> messages = coordinator_.HeartbeatMessages();
    while (messages.size() < n && absl::Now() < deadline) {
      clock_.Advance(kInterval);
      absl::SleepFor(absl::Milliseconds(10));
      messages = coordinator_.HeartbeatMessages();
    }
    return messages;
  }

  FakeClock clock_;
};

// Note [Heartbeats through the agent]: one message per interval with the
// newest heartbeat of each rank heard from, and nothing for a rank that fell
// silent.
TEST_F(AgentHeartbeatsTest, ForwardsItsRanksNewestHeartbeatsInOneMessageAndLeavesOutASilentRank) {
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 3, {0, 1}));
  std::vector<std::shared_ptr<FakeRank>> ranks = launcher_->AwaitRanks(2);
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_NE(ranks[0]->Env(kEnvAgentHeartbeatsFd), "");
  // Both are the agent's ranks (not only started) before the interval ends:
  // a rank it has not recorded yet would miss the first message.
  ASSERT_TRUE(Eventually([&] { return agent_->live_ranks() == 2; }));
  // Slot 0 is rank 5, slot 1 rank 6; both send two heartbeats at once: only
  // the newer goes on.
  for (int step : {1, 2}) {
    ASSERT_TRUE(ranks[0]->SendHeartbeat(RankHeartbeatOf("job-1", 3, 5, step)).ok());
    ASSERT_TRUE(ranks[1]->SendHeartbeat(RankHeartbeatOf("job-1", 3, 6, 10 + step)).ok());
  }
  std::vector<v1::RankHeartbeats> messages = AdvanceUntilMessages(1);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(StepsByRank(messages[0]), (std::map<int, int64_t>{{5, 2}, {6, 12}}));

  // Now only slot 0 sends: slot 1 is absent from every later message.
  for (int step = 3; step <= 5; ++step) {
    ASSERT_TRUE(ranks[0]->SendHeartbeat(RankHeartbeatOf("job-1", 3, 5, step)).ok());
    messages = AdvanceUntilMessages(messages.size() + 1);
  }
  ASSERT_EQ(messages.size(), 4u) << "one message per interval, none without heartbeats";
  for (size_t i = 1; i < messages.size(); ++i) {
    EXPECT_EQ(StepsByRank(messages[i]), (std::map<int, int64_t>{{5, static_cast<int64_t>(i + 2)}}))
        << "message " << i;
  }
}

// Note [A silent agent's ranks] in coordinator/hang/hang_detector.h: an interval
// in which no rank sent a heartbeat (an idle agent, or one whose only rank is
// stopped) still sends a message, a ping, so that the coordinator knows the
// agent and its link are alive. Each carries the node's CPU pressure (Note
// [A starved node]).
TEST_F(AgentHeartbeatsTest, AnIntervalWithoutHeartbeatsSendsAPing) {
  options_.cpu_pressure = [] { return 0.625; };
  Connect();
  const size_t before = coordinator_.Pings();
  const absl::Time deadline = absl::Now() + kPatience;
  while (coordinator_.Pings() < before + 3 && absl::Now() < deadline) {
    clock_.Advance(kInterval);
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(coordinator_.Pings(), before + 3);
  EXPECT_TRUE(coordinator_.HeartbeatMessages().empty());
  const std::vector<float> pressures = coordinator_.PingPressures();
  ASSERT_FALSE(pressures.empty());
  EXPECT_EQ(pressures.back(), 0.625f);
}

// Note [Urgent heartbeats]: a rank's first heartbeat saying its program
// re-forms in its own process goes on at once; later ones wait for the
// interval like any other.
TEST_F(AgentHeartbeatsTest, ForwardsAProgramsFirstWordThatItReformsInProcessAtOnce) {
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0}));
  std::vector<std::shared_ptr<FakeRank>> ranks = launcher_->AwaitRanks(1);
  ASSERT_EQ(ranks.size(), 1u);
  ASSERT_TRUE(Eventually([&] { return agent_->live_ranks() == 1; }));
  v1::RankHeartbeat declaring = RankHeartbeatOf("job-1", 1, 0, 3);
  declaring.set_reforms_in_process(true);
  ASSERT_TRUE(ranks[0]->SendHeartbeat(declaring).ok());
  // The agent's clock stands still: only the urgent path can send it.
  const absl::Time deadline = absl::Now() + kPatience;
  while (coordinator_.HeartbeatMessages().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::vector<v1::RankHeartbeats> messages = coordinator_.HeartbeatMessages();
  ASSERT_EQ(messages.size(), 1u) << "forwarded before the interval ended";
  EXPECT_TRUE(messages[0].heartbeats(0).reforms_in_process());

  declaring.set_step(4);
  ASSERT_TRUE(ranks[0]->SendHeartbeat(declaring).ok());
  absl::SleepFor(absl::Milliseconds(300));  // six of the watcher's looks
  EXPECT_EQ(coordinator_.HeartbeatMessages().size(), 1u) << "said once, urgent once";
  messages = AdvanceUntilMessages(2);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(StepsByRank(messages[1]), (std::map<int, int64_t>{{0, 4}}));
}

TEST_F(AgentHeartbeatsTest, PassesEachDirectiveToTheRankItIsFor) {
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 2, {0, 1}));
  std::vector<std::shared_ptr<FakeRank>> ranks = launcher_->AwaitRanks(2);
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_TRUE(Eventually([&] { return agent_->live_ranks() == 2; }));
  ASSERT_TRUE(ranks[0]->SendHeartbeat(RankHeartbeatOf("job-1", 2, 0, 7)).ok());
  ASSERT_TRUE(ranks[1]->SendHeartbeat(RankHeartbeatOf("job-1", 2, 1, 7)).ok());
  std::vector<v1::RankHeartbeats> messages = AdvanceUntilMessages(1);
  ASSERT_EQ(messages.size(), 1u);
  ASSERT_EQ(messages[0].heartbeats_size(), 2);

  v1::CoordinatorMessage message;
  // By slot: REFORM for slot 1 only.
  v1::RankDirectives::Entry* by_slot = message.mutable_directives()->add_entries();
  by_slot->set_job_id("job-1");
  by_slot->set_slot(1);
  by_slot->set_rank(1);
  by_slot->set_generation(2);
  by_slot->mutable_directive()->set_kind(v1::Directive::REFORM_AT_STEP_BOUNDARY);
  by_slot->mutable_directive()->set_generation(3);
  // Without a slot: found by the generation and rank of its heartbeat.
  v1::RankDirectives::Entry* by_rank = message.mutable_directives()->add_entries();
  by_rank->set_job_id("job-1");
  by_rank->set_slot(-1);
  by_rank->set_rank(0);
  by_rank->set_generation(2);
  by_rank->mutable_directive()->set_kind(v1::Directive::RE_RENDEZVOUS);
  by_rank->mutable_directive()->set_generation(3);
  // For another job's slot 1 on this agent: nobody here.
  v1::RankDirectives::Entry* other = message.mutable_directives()->add_entries();
  *other = *by_slot;
  other->set_job_id("job-9");
  coordinator_.Send(message);

  absl::StatusOr<v1::Directive> to_slot1 = ranks[1]->ReceiveDirective(absl::Now() + kPatience);
  ASSERT_TRUE(to_slot1.ok()) << to_slot1.status();
  EXPECT_EQ(to_slot1->kind(), v1::Directive::REFORM_AT_STEP_BOUNDARY);
  EXPECT_EQ(to_slot1->generation(), 3);
  absl::StatusOr<v1::Directive> to_slot0 = ranks[0]->ReceiveDirective(absl::Now() + kPatience);
  ASSERT_TRUE(to_slot0.ok()) << to_slot0.status();
  EXPECT_EQ(to_slot0->kind(), v1::Directive::RE_RENDEZVOUS);
  // Each got its own and nothing else.
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::Directive> more =
        ranks[i]->ReceiveDirective(absl::Now() + absl::Milliseconds(200));
    EXPECT_TRUE(absl::IsDeadlineExceeded(more.status())) << "slot " << i << ": " << more.status();
  }
}

v1::JoinRequest JoinRequestOf(const std::string& job_id, int64_t generation, int slot) {
  v1::JoinRequest join;
  join.set_job_id(job_id);
  join.set_generation(generation);
  join.set_slot(slot);
  join.set_pid(5000 + slot);
  return join;
}

class AgentJoinsTest : public AgentHeartbeatsTest {
 protected:
  void SetUp() override {
    AgentHeartbeatsTest::SetUp();
    // The channels are read only when the test moves the clock on an
    // interval (one pass over every rank), so that what the ranks sent
    // before is read at once.
    options_.channel_poll = absl::Hours(1);
  }

  // Moves the clock on until the coordinator has `n` joins messages in all
  // (bounded by kPatience); those.
  std::vector<v1::RankJoins> AdvanceUntilJoins(size_t n) {
    const absl::Time deadline = absl::Now() + kPatience;
    std::vector<v1::RankJoins> messages = coordinator_.JoinMessages();
    while (messages.size() < n && absl::Now() < deadline) {
      clock_.Advance(kInterval);
      absl::SleepFor(absl::Milliseconds(10));
      messages = coordinator_.JoinMessages();
    }
    return messages;
  }
};

// Note [Joins gathered by the agent] in agent.cc: the joins its ranks sent go
// to the coordinator as one RankJoins message, and each answer goes back to
// the rank whose join it answers, whole.
TEST_F(AgentJoinsTest, BatchesItsRanksJoinsInOneMessageAndPassesEachAnswerToItsRank) {
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0, 1}));
  std::vector<std::shared_ptr<FakeRank>> ranks = launcher_->AwaitRanks(2);
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_EQ(ranks[0]->Env(kEnvAgentJoins), "1");
  // Both are the agent's ranks (not only started) before they send.
  ASSERT_TRUE(Eventually([&] { return agent_->live_ranks() == 2; }));
  ASSERT_TRUE(ranks[0]->SendJoin(JoinRequestOf("job-1", 2, 0)).ok());
  // A rank speaks for its own slot only: the agent sends its slot, 1.
  ASSERT_TRUE(ranks[1]->SendJoin(JoinRequestOf("job-1", 2, 7)).ok());
  std::vector<v1::RankJoins> messages = AdvanceUntilJoins(1);
  ASSERT_EQ(messages.size(), 1u);
  ASSERT_EQ(messages[0].joins_size(), 2) << messages[0].ShortDebugString();
  std::vector<int> slots;
  for (const v1::JoinRequest& join : messages[0].joins()) {
    EXPECT_EQ(join.job_id(), "job-1");
    EXPECT_EQ(join.generation(), 2);
    slots.push_back(join.slot());
  }
  std::sort(slots.begin(), slots.end());
  EXPECT_THAT(slots, ElementsAre(0, 1));

  // Slot 1 is rank 0 of 2; slot 0 is told the generation has not formed;
  // slot 5 has no rank here.
  v1::JoinResponse joined;
  joined.set_rank(0);
  joined.set_world_size(2);
  joined.set_generation(2);
  joined.set_store_namespace("job-1/2/");
  v1::CoordinatorMessage answers;
  AddJoinAnswer("job-1", 1, 2, joined, *answers.mutable_joined());
  AddJoinAnswer("job-1", 0, 2, absl::UnavailableError("generation 2 has not formed yet"),
                *answers.mutable_joined());
  AddJoinAnswer("job-1", 5, 2, joined, *answers.mutable_joined());
  coordinator_.Send(answers);

  absl::StatusOr<v1::AgentJoinAnswer> to_slot1 =
      ranks[1]->ReceiveJoinAnswer(absl::Now() + kPatience);
  ASSERT_TRUE(to_slot1.ok()) << to_slot1.status();
  EXPECT_EQ(to_slot1->code(), 0);
  EXPECT_FALSE(to_slot1->join_directly());
  EXPECT_EQ(to_slot1->asked_generation(), 2);
  EXPECT_EQ(to_slot1->response().rank(), 0);
  EXPECT_EQ(to_slot1->response().world_size(), 2) << "the shared part merged in";
  EXPECT_EQ(to_slot1->response().store_namespace(), "job-1/2/");
  absl::StatusOr<v1::AgentJoinAnswer> to_slot0 =
      ranks[0]->ReceiveJoinAnswer(absl::Now() + kPatience);
  ASSERT_TRUE(to_slot0.ok()) << to_slot0.status();
  EXPECT_EQ(to_slot0->code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(to_slot0->message(), "generation 2 has not formed yet");
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::AgentJoinAnswer> more =
        ranks[i]->ReceiveJoinAnswer(absl::Now() + absl::Milliseconds(200));
    EXPECT_TRUE(absl::IsDeadlineExceeded(more.status())) << "slot " << i << ": " << more.status();
  }
}

// A join whose answer can no longer come over the stream (it ended) is
// answered join_directly at once, and so is one sent while the agent is
// not connected: the rank then calls RankService.Join itself instead of
// waiting out its deadline.
TEST_F(AgentJoinsTest, RanksWaitingWhenTheStreamBreaksAreToldToJoinDirectly) {
  Connect();
  coordinator_.Send(LaunchMessage("job-1", 1, {0}));
  std::vector<std::shared_ptr<FakeRank>> ranks = launcher_->AwaitRanks(1);
  ASSERT_EQ(ranks.size(), 1u);
  ASSERT_TRUE(ranks[0]->SendJoin(JoinRequestOf("job-1", 2, 0)).ok());
  ASSERT_EQ(AdvanceUntilJoins(1).size(), 1u);
  coordinator_.Refuse(true);  // it stays away after the drop
  coordinator_.Drop();
  absl::StatusOr<v1::AgentJoinAnswer> answer = ranks[0]->ReceiveJoinAnswer(absl::Now() + kPatience);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->join_directly());
  EXPECT_EQ(answer->asked_generation(), 2);
  EXPECT_THAT(answer->message(), HasSubstr("stream to the coordinator ended"));

  ASSERT_TRUE(Eventually([&] { return coordinator_.refused() >= 1; }));
  ASSERT_TRUE(ranks[0]->SendJoin(JoinRequestOf("job-1", 2, 0)).ok());
  const absl::Time deadline = absl::Now() + kPatience;
  do {
    clock_.Advance(kInterval);
    answer = ranks[0]->ReceiveJoinAnswer(absl::Now() + absl::Milliseconds(20));
  } while (absl::IsDeadlineExceeded(answer.status()) && absl::Now() < deadline);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->join_directly());
  EXPECT_THAT(answer->message(), HasSubstr("not connected to the coordinator"));
  EXPECT_EQ(coordinator_.JoinMessages().size(), 1u);
}

}  // namespace
}  // namespace chorus
