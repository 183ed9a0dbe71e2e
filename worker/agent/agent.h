// Agent: the node agent inside chorus-worker. It holds an AgentService.Connect
// stream to the coordinator, offers its slots, starts one chorus-rank process
// per slot it is given (own process group, stdout/stderr captured), reports
// each exit with the last lines the process wrote, and stops ranks on order:
// SIGTERM to the process group, SIGKILL after the grace period. When the
// coordinator goes away it stops its ranks and reconnects with backoff.
// Processes are started through a RankLauncher (rank_launcher.h): the real
// one by default, a scripted one in tests. Its ranks' heartbeats go to the
// coordinator through it, one message per interval for all of them, and the
// coordinator's directives for them come back the same way (Note
// [Heartbeats through the agent] in agent.cc), and so do their joins of a
// generation and the answers (Note [Joins gathered by the agent] in agent.cc).
//
// Thread-safety: Run() on one thread; Stop() from any other (e.g. a signal
// thread). Every thread the agent starts is joined soon after it finishes,
// and all of them by the destructor.
//
// Example:
//   Agent agent(options);
//   std::thread signals([&] { WaitForSignal(); agent.Stop(); });
//   absl::Status s = agent.Run();
#ifndef CHORUS_WORKER_AGENT_AGENT_H_
#define CHORUS_WORKER_AGENT_AGENT_H_

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/clock.h"
#include "grpcpp/channel.h"
#include "worker/agent/rank_accounts.h"
#include "worker/agent/rank_cgroup.h"
#include "worker/agent/rank_launcher.h"
#include "worker/runtime/progress_channel.h"

namespace chorus {

struct AgentOptions {
  std::string coordinator = "127.0.0.1:29650";
  int slots = 1;
  v1::ResourceSpec::Device device = v1::ResourceSpec::CPU;
  int threads_per_rank = 1;
  // Start each rank bound to its slot's share of `cpus` (Note [Binding ranks
  // to CPUs] in common/cpu_binding.cc); nothing is bound when there are more
  // slots than CPUs.
  bool bind_cpus = true;
  // Run each rank in a cgroup of its own with its job's memory and process
  // limits and its slot's CPUs (Note [Rank cgroups] in rank_cgroup.cc);
  // where cgroups cannot be made the agent says so once and runs ranks
  // without.
  bool rank_cgroups = false;
  // The CPUs the slots share; empty: those this process may run on.
  std::vector<int> cpus;
  std::string host;
  // The rank program; default: chorus-rank next to this executable.
  std::string rank_binary;
  // Give up if the first connection does not succeed within this.
  absl::Duration connect_timeout = absl::Seconds(30);
  // How long stopped ranks get between SIGTERM and SIGKILL when the agent
  // itself stops.
  absl::Duration stop_grace = absl::Seconds(5);
  // When the coordinator goes away, ranks keep training this long while the
  // agent reconnects (a restarted coordinator takes their jobs back); after
  // that they are stopped, unless the coordinators say they are up and wait
  // for their state store (etcd without quorum): then another window starts.
  absl::Duration reconnect_window = absl::Seconds(60);
  // How often the ranks' heartbeats go to the coordinator (one message with
  // the newest of each rank heard from since the last).
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // How often the ranks' channels are read for heartbeats that must not wait
  // for the interval and for joins (Note [Urgent heartbeats], Note
  // [Joins gathered by the agent] in agent.cc); real time.
  absl::Duration channel_poll = absl::Milliseconds(50);
  // Times heartbeat_interval; null: the real clock.
  Clock* clock = nullptr;
  // This node's CPU pressure, sent with every heartbeats message and ping
  // (Note [A starved node] in coordinator/hang/hang_detector.h); null:
  // NodeCpuPressure() (common/cpu_pressure.h).
  std::function<double()> cpu_pressure;
  // Starts the rank processes; null: PosixRankLauncher.
  std::shared_ptr<RankLauncher> launcher;
  // Which account a rank runs as when its launch names none (Note [Rank
  // accounts] in rank_accounts.h): a uid of this range per job; unset: the
  // agent's own.
  std::optional<UidRange> rank_uid_range;
  // Where the job directories of ranks run as another account are made
  // (their TMPDIR); empty: none are.
  std::string rank_temp_root;
};

class Agent {
 public:
  explicit Agent(AgentOptions options);
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;
  ~Agent();

  // Serves the coordinator until Stop(). UNAVAILABLE if the first connection
  // never succeeds.
  absl::Status Run();
  // Makes Run() return and stops every rank (SIGTERM to its process group,
  // SIGKILL after stop_grace), including one being started right now
  // (Note [Stopping while launching] in agent.cc). Returns without waiting;
  // the destructor waits.
  void Stop();

  // Rank processes alive now (for tests).
  int live_ranks() const;
  // Threads the agent has started and not yet joined (for tests): those
  // running plus those finished since the last thread was started
  // (Note [Reaping threads] in agent.cc).
  int threads_held() const;

 private:
  struct Child {
    std::unique_ptr<RankProcess> process;
    // The rank's cgroup; null when it runs without one.
    std::unique_ptr<RankCgroup> cgroup;
    pid_t pid = 0;
    std::string job_id;
    int64_t generation = 0;
    int slot = 0;
    // The agent's end of the rank's heartbeat channel; null when it could
    // not be made (the rank then sends its heartbeats to the coordinator).
    std::unique_ptr<ProgressReceiver> heartbeats;
    // The generation and rank of the newest heartbeat forwarded, to find
    // the rank a directive without a slot is for.
    struct Forwarded {
      int64_t generation = 0;
      int rank = 0;
    };
    std::optional<Forwarded> forwarded ABSL_GUARDED_BY(mu);
    // Read from `heartbeats` (one reader at a time, under `mu`) and not
    // forwarded yet: the newest.
    std::optional<v1::RankHeartbeat> unsent ABSL_GUARDED_BY(mu);
    // The rank's program has said that it re-forms in its own process
    // (forwarded at once: Note [Urgent heartbeats]).
    bool declared_reforms ABSL_GUARDED_BY(mu) = false;
    // The newest output lines, within kMaxTailLines and kMaxTailBytes.
    std::deque<std::string> tail ABSL_GUARDED_BY(mu);
    mutable absl::Mutex mu;
  };
  // A rank's join (Note [Joins gathered by the agent] in agent.cc), and what
  // its answer is found by: job, slot and the generation asked for.
  struct PendingJoin {
    std::shared_ptr<Child> child;
    v1::JoinRequest request;
  };
  using JoinKey = std::tuple<std::string, int, int64_t>;

  // The hello of a (re)connection: slots, device, and the ranks still
  // running from before.
  v1::AgentMessage Hello() ABSL_LOCKS_EXCLUDED(mu_);
  // One welcomed connection: sends what could not be sent before, then
  // carries out the coordinator's messages until the stream ends.
  void Serve(grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>& stream,
             const v1::Welcome& welcome, int still_running);
  void Launch(const v1::LaunchRanks& launch);
  // Starts one rank of `launch`; null (its exit reported) if it could not.
  std::shared_ptr<Child> StartRank(const v1::LaunchRanks& launch, const v1::RankLaunch& rank,
                                   const std::string& agent_id);
  // Tells the coordinator that slot `slot` of `job_id` could not start.
  void ReportStartFailure(const std::string& job_id, int slot, const absl::Status& why);
  // The command that runs slot `rank.slot()` of `launch`.
  RankCommand RankCommandFor(const v1::LaunchRanks& launch, const v1::RankLaunch& rank,
                             const std::string& agent_id) const;
  // The cgroup the rank `command` starts goes into, its procs files in
  // `command`; null when ranks run without cgroups or it cannot be made.
  std::unique_ptr<RankCgroup> CgroupFor(const v1::LaunchRanks& launch, const v1::RankLaunch& rank,
                                        RankCommand& command) const;
  // After `child` was reaped: in `exited`, whether the OOM killer took it;
  // then removes its cgroup.
  void CloseCgroup(Child& child, v1::RankExited& exited);
  void StopRanks(const std::string& job_id, const std::vector<int>& slots, absl::Duration grace);
  // What a follower coordinator says about why none leads; empty when none
  // says (Note [Ranks outlive a leaderless cluster] in agent.cc).
  std::string WhyNoCoordinatorLeads();
  // Once the coordinator has been gone reconnect_window with ranks running:
  // keeps them if the coordinators wait for their state, else stops them.
  // Returns when the next window starts (never, once they are stopped).
  absl::Time AfterReconnectWindow();
  // Waits up to kOneShotConnectTimeout for patient_channel_ to be ready,
  // connecting meanwhile; returns early if the agent stops.
  void AwaitPatientChannel() ABSL_LOCKS_EXCLUDED(mu_);
  // SIGTERM to each child's process group now, SIGKILL to those still alive
  // after `grace` (from a thread the agent joins).
  void StopChildren(std::vector<std::shared_ptr<Child>> children, absl::Duration grace);
  // The rank processes of `job_id` in `slots` (empty job id / slots: all).
  std::vector<std::shared_ptr<Child>> Ranks(const std::string& job_id,
                                            const std::vector<int>& slots);
  // Sends `signal` to the rank processes of `job_id` in `slots`, not their
  // groups (SIGUSR1: checkpoint now).
  void SignalRanks(const std::string& job_id, const std::vector<int>& slots, int signal);
  // Whether `child` is still in children_ (it has not exited).
  bool IsLive(const Child& child) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the child's output until it ends, waits for its exit, reports it.
  void Monitor(std::shared_ptr<Child> child);
  // Monitor's parts: passes the child's output on until it ends; waits for
  // its exit and returns the code.
  void ForwardOutput(Child& child);
  int AwaitExit(Child& child);
  void Send(const v1::AgentMessage& message);
  // A heartbeat channel for the rank `command` starts: the agent's end, and
  // the variable naming the rank's end (`*rank_fd`, for the caller to close
  // once the rank has started) in `command`. Null (and no variable) when no
  // channel could be made.
  std::unique_ptr<ProgressReceiver> OpenHeartbeatChannel(RankCommand& command, int* rank_fd);
  // Every heartbeat_interval until Stop(): one message with the newest
  // heartbeat of each rank heard from since the last.
  void ForwardHeartbeats() ABSL_LOCKS_EXCLUDED(mu_);
  v1::AgentMessage CollectHeartbeats(const std::vector<std::shared_ptr<Child>>& children);
  // Every channel_poll (real time) until Stop(): reads the ranks' channels
  // and wakes ForwardHeartbeats when a heartbeat must not wait for the
  // interval (Note [Urgent heartbeats]).
  void WatchForUrgentHeartbeats() ABSL_LOCKS_EXCLUDED(mu_);
  // Moves what `child`'s channel holds into child->unsent, and the joins it
  // sent to `joins`; whether a heartbeat is urgent.
  bool ReadHeartbeats(const std::shared_ptr<Child>& child, std::vector<PendingJoin>& joins)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool ReadHeartbeatsLocked(Child& child) ABSL_EXCLUSIVE_LOCKS_REQUIRED(child.mu);
  // Hands `joins` to ForwardJoins.
  void QueueJoinsLocked(std::vector<PendingJoin> joins) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Until Stop(): sends the joins pending as one RankJoins message as soon
  // as there are any, and those that come meanwhile in the next (Note
  // [Joins gathered by the agent]).
  void ForwardJoins() ABSL_LOCKS_EXCLUDED(mu_);
  // Sends `joins` as one message, to be answered in awaiting_joins_; tells
  // the ranks to join directly when there is no stream to send it on.
  void SendJoins(std::vector<PendingJoin> joins) ABSL_LOCKS_EXCLUDED(mu_);
  // Hands each answer to the rank waiting for it (JoinAnswerFor).
  void PassJoinAnswers(const v1::RankJoinAnswers& answers) ABSL_LOCKS_EXCLUDED(mu_);
  // Tells every rank whose join awaits an answer to join directly (the
  // stream ended), with `why`.
  void AnswerAwaitingDirectly(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<Child>> HeartbeatChildren() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands each directive to the rank it is for.
  void PassDirectives(const v1::RankDirectives& directives);
  // Runs `body` on a new thread the agent owns, after joining the threads
  // that have finished (Note [Reaping threads]).
  void StartThread(std::function<void()> body) ABSL_LOCKS_EXCLUDED(mu_);

  const AgentOptions options_;
  // The CPUs the slots share (options_.cpus, or this process's).
  const std::vector<int> cpus_;
  const std::shared_ptr<RankLauncher> launcher_;
  RankAccounts accounts_;
  // Null unless options_.rank_cgroups.
  std::unique_ptr<RankCgroups> cgroups_;
  RealClock real_clock_;
  Clock& clock_;
  std::unique_ptr<v1::AgentService::Stub> stub_;
  // The same coordinators through a channel whose connection attempts may
  // take kOneShotConnectTimeout (Note [Reconnecting over a slow link]).
  const std::shared_ptr<grpc::Channel> patient_channel_;
  std::unique_ptr<v1::AgentService::Stub> patient_stub_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // A heartbeat to forward before the interval ends.
  bool urgent_heartbeat_ ABSL_GUARDED_BY(mu_) = false;
  std::string agent_id_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>* stream_ ABSL_GUARDED_BY(mu_) =
      nullptr;
  std::map<pid_t, std::shared_ptr<Child>> children_ ABSL_GUARDED_BY(mu_);
  // Every thread the agent started and has not joined, by a number of its
  // own; finished_ lists those that have returned (Note [Reaping threads]).
  std::map<int64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> finished_ ABSL_GUARDED_BY(mu_);
  int64_t next_thread_ ABSL_GUARDED_BY(mu_) = 0;
  // Note [Joins gathered by the agent]: joins read from the ranks' channels and
  // not sent yet, and those sent and not answered.
  std::vector<PendingJoin> pending_joins_ ABSL_GUARDED_BY(mu_);
  std::map<JoinKey, std::shared_ptr<Child>> awaiting_joins_ ABSL_GUARDED_BY(mu_);
  // Reports (rank exits) that could not be sent while disconnected; sent
  // first after reconnecting.
  std::vector<v1::AgentMessage> unsent_ ABSL_GUARDED_BY(mu_);
  // The exits written to a stream lately, newest last (at most
  // kToldExitsKept): the next hello tells them again (Note [Exits told
  // again] in coordinator/scheduling/job_recovery.h).
  std::deque<v1::RankExited> told_exits_ ABSL_GUARDED_BY(mu_);
  absl::Mutex write_mu_;  // one writer on the stream at a time
};

}  // namespace chorus

#endif  // CHORUS_WORKER_AGENT_AGENT_H_
