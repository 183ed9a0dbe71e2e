// load_bench: the coordinator under many simulated ranks (no training).
//
// For each world size (default 256 and 1024; at most 16,384) a fresh
// chorus-coordinator process is started; simulated agents
// (--ranks_per_agent slots each, 64 by default) connect over
// AgentService, a job for every slot is submitted, and when the launch orders
// arrive every rank joins at once: through its agent, one RankJoins message
// per agent as chorus-worker sends them (--joins agent, the default), or
// with its own RankService.Join (--joins rank; asynchronous stubs). The
// rendezvous time is from the first join sent to the last answer. Then every
// rank streams a heartbeat each second for --heartbeat_seconds while
// GetJobStatus and the job page's JSON (GET /api/jobs/JOB on the HTTP port)
// are called back to back and /metrics is scraped every second: heartbeats
// per second sustained, the coordinator's CPU use (from /proc), and
// GetJobStatus, page JSON and scrape p50/p99. Then, for as long again, only
// heartbeats and the 1 Hz scrape: the coordinator's CPU as a Prometheus
// server would see it (SCRAPE_CPU_%), and as long with heartbeats alone
// (HB_CPU_%). Last, a hang: every rank but one waits in a collective the
// other never issued, and GetJobStatus is polled until it names that rank
// NEVER_JOINED (NEVER_JOINED_S, from the hang's start; the job's
// stall_after_seconds is 5). With --heartbeats agent the ranks'
// heartbeats go as one message per agent per second on the agent's stream
// (Note [Aggregated heartbeats] in coordinator/scheduling/rank_messages.h) instead of one stream per
// rank (--heartbeats rank, the default). With --reform 1 the job is elastic
// and, last, one rank exits with an error: the time until every rank of the
// next generation has joined, the joins going through the agents, one
// RankJoins message per agent (Note [Joins through the agent] in
// coordinator/scheduling/agent_join_outbox.h; --joins agent, the default), or one RankService.Join per
// rank (--joins rank).
//
// Peer, same run: TorchElastic's dynamic rendezvous with 64 participants
// (tests/bench/torchelastic_rendezvous_peer.py, python3-torch), against
// Chorus's rendezvous of 64 ranks. The last line is a result line (docs/benchmarks.md) with
// ratio = Chorus / TorchElastic at 64 (< 1: Chorus faster).
//
// With --state etcd every size runs twice, on SQLite and then on a one-member
// etcd this bench starts (--state etcd://.../PREFIX, docs/ha.md), and each
// run ends with 200 submissions one after another (SUBMITS/S, jobs that
// wait PENDING: every slot is taken). The result lines compare the two:
// ratio = etcd / SQLite for the rendezvous time and for the time per
// submission (the TorchElastic comparison is left out).
//
//   bazel run -c opt //bench:load_bench -- [--sizes 256,1024] [--heartbeat_seconds 5]
//       [--ranks_per_agent 64] [--heartbeats rank|agent] [--reform 1] [--joins agent|rank]
//       [--lose_rank R] [--state etcd]
// --lose_rank R: the rank --reform loses (default: ranks/2 + 1). With
// --state etcd, a run with --reform also prints the size of the job's elastic
// record in etcd after the re-formation (elastic_record_bytes_N_ranks).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/grpc_util.h"
#include "common/job_spec.h"
#include "common/join_answers.h"
#include "common/paths.h"
#include "common/status_macros.h"
#include "coordinator/etcd/etcd_client.h"
#include "coordinator/etcd/etcd_test_cluster.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "httplib.h"

extern char** environ;

namespace chorus {
namespace {

// The largest job one coordinator is shown to hold (the job spec's
// resources.max_ranks cap).
constexpr int kMaxRanks = 16384;

struct Options {
  double heartbeat_seconds = 5;
  // Ranks per simulated agent (its slots): 64 as before, 8 for the 2,048
  // agents of a 16,384-rank job.
  int ranks_per_agent = 64;
  // Heartbeats on one stream per rank (as a rank sends them on its own), or
  // collected per agent: one RankHeartbeats message per agent per second
  // (Note [Aggregated heartbeats] in coordinator/scheduling/rank_messages.h).
  bool aggregated = false;
  // The job is elastic and, at the end, one rank exits with an error: the
  // time until its next generation has formed (REFORM_S).
  bool reform = false;
  // Every rank joins generation 1 and, with --reform, the survivors and the
  // newcomer join the next one through their agents (one RankJoins message
  // per agent, as chorus-worker sends them: Note [Joins through the agent]
  // in coordinator/scheduling/agent_join_outbox.h), or each with its own RankService.Join
  // (--joins rank, as ranks without an agent channel do).
  bool joins_through_agents = true;
  // Extra chorus-coordinator flags of the state (--state etcd: the etcd URL
  // and the checkpoint directory); empty = SQLite in its --state_dir.
  std::vector<std::string> state_flags;
  // Time kTimedSubmits submissions at the end (--state etcd).
  bool time_submits = false;
  // --reform: the rank that exits (-1: the one the hang names, ranks/2 + 1).
  // Losing rank 0 renumbers every survivor.
  int lost_rank = -1;
  // --state etcd: where the state lives, to read the elastic record's size
  // after the re-formation (Note [A bounded history]).
  std::string etcd_endpoints;
  std::string etcd_prefix;
};

// Submissions timed at the end of each run (--state etcd).
constexpr int kTimedSubmits = 200;

// The collective of the simulated hang, and how long the ranks inside it
// wait before it is a stall (the job's hang_detection.stall_after_seconds).
constexpr int64_t kHangSeq = 1000000;
constexpr int kStallAfterSeconds = 5;

// What `rank` says at `second`. Once a hang began (`hang_since_us` > 0),
// every rank but `culprit` waits inside collective kHangSeq since then,
// and `culprit` never issued it (it is loading data).
v1::RankHeartbeat HeartbeatOf(const std::string& job_id, int rank, int second,
                              int64_t hang_since_us = 0, int culprit = -1) {
  v1::RankHeartbeat hb;
  hb.set_job_id(job_id);
  hb.set_generation(1);
  hb.set_rank(rank);
  hb.set_step(second);
  hb.set_phase(v1::FORWARD);
  hb.set_time_us(absl::ToUnixMicros(absl::Now()));
  hb.mutable_flight_recorder()->set_last_completed_seq(second * 4);
  // Per-step timings as a trainer sends them (the status rows' straggler
  // attribution works on them): every rank's wait differs a little.
  hb.mutable_timings()->set_step_seconds(0.5);
  hb.mutable_timings()->set_comm_wait_seconds(0.001 * (rank % 97));
  hb.mutable_timings()->set_compute_seconds(0.5 - 0.001 * (rank % 97));
  if (hang_since_us <= 0) return hb;
  v1::FlightRecorderSummary& recorder = *hb.mutable_flight_recorder();
  recorder.set_last_completed_seq(kHangSeq - 1);
  if (rank == culprit) {
    hb.set_phase(v1::DATA);
    recorder.set_last_enqueued_seq(kHangSeq - 1);
    return hb;
  }
  hb.set_phase(v1::COLLECTIVE);
  recorder.set_last_enqueued_seq(kHangSeq);
  recorder.set_last_started_seq(kHangSeq);
  v1::CollectiveRecord& waiting = *recorder.add_records();
  waiting.set_seq(kHangSeq);
  waiting.mutable_fingerprint()->set_op("allreduce/avg");
  waiting.mutable_fingerprint()->set_tag("ddp:model/bucket0");
  waiting.mutable_fingerprint()->set_dtype("float32");
  waiting.mutable_fingerprint()->set_count(1 << 20);
  waiting.set_state(v1::CollectiveRecord::STARTED);
  waiting.set_started_us(hang_since_us);
  return hb;
}

// From the moment a hang begins (`hang_since_us` set here, which the
// heartbeats then carry) until GetJobStatus names `culprit` NEVER_JOINED;
// an error after `limit`.
absl::StatusOr<double> TimeNeverJoined(v1::JobService::Stub& jobs, const std::string& job_id,
                                       int culprit, std::atomic<int64_t>& hang_since_us,
                                       absl::Duration limit) {
  const absl::Time start = absl::Now();
  hang_since_us.store(absl::ToUnixMicros(start));
  while (absl::Now() - start < limit) {
    v1::GetJobStatusRequest request;
    request.set_job_id(job_id);
    request.set_rank_limit(1);
    v1::JobStatus status;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    RETURN_IF_ERROR(FromGrpcStatus(jobs.GetJobStatus(&context, request, &status)));
    for (const v1::Diagnosis& d : status.diagnoses()) {
      if (d.kind() == v1::Diagnosis::NEVER_JOINED &&
          std::find(d.ranks().begin(), d.ranks().end(), culprit) != d.ranks().end()) {
        return absl::ToDoubleSeconds(absl::Now() - start);
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("rank ", culprit, " was not named NEVER_JOINED ",
                                                  absl::FormatDuration(limit),
                                                  " after the hang began"));
}

struct Coordinator {
  pid_t pid = -1;
  std::string address;
  std::string dir;
  int http_port = 0;
};

absl::StatusOr<Coordinator> StartCoordinator(const std::string& binary,
                                             const std::vector<std::string>& state_flags) {
  Coordinator c;
  char tmpl[] = "/tmp/chorus-load-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  c.dir = tmpl;
  std::vector<std::string> args = {binary,          "--listen",         "127.0.0.1:0",
                                   "--state_dir",   c.dir + "/state",   "--port_file",
                                   c.dir + "/port", "--http_port_file", c.dir + "/http_port"};
  for (const std::string& flag : state_flags) {
    args.push_back(absl::StrReplaceAll(flag, {{"$DIR", c.dir}}));
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, (c.dir + "/coordinator.log").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int rc = posix_spawn(&c.pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    return absl::NotFoundError(absl::StrCat("cannot start ", binary, ": ", std::strerror(rc)));
  for (int i = 0; i < 300; ++i) {
    std::ifstream in(c.dir + "/port");
    std::string port;
    if (std::getline(in, port) && !port.empty()) {
      c.address = "127.0.0.1:" + port;
      std::ifstream http(c.dir + "/http_port");  // written before the port file
      std::string http_port;
      std::getline(http, http_port);
      if (!absl::SimpleAtoi(http_port, &c.http_port)) {
        kill(c.pid, SIGKILL);
        return absl::InternalError("the coordinator wrote no --http_port_file");
      }
      return c;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  kill(c.pid, SIGKILL);
  return absl::DeadlineExceededError("the coordinator did not start; see " + c.dir +
                                     "/coordinator.log");
}

// A coordinator on etcd state writes its port file while it still follows
// (its follower server answers there, Note [A follower that cannot elect] in
// coordinator/service/follower_server.h): waits until it leads, by the health
// service leaders serve.
absl::Status WaitUntilLeading(const Coordinator& c, absl::Duration timeout) {
  const std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(c.address, grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    context.set_wait_for_ready(true);
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(kLeaderHealthService);
    grpc::health::v1::HealthCheckResponse response;
    if (health->Check(&context, request, &response).ok() &&
        response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat("the coordinator at ", c.address,
                                                  " did not lead within ",
                                                  absl::FormatDuration(timeout), "; see ", c.dir,
                                                  "/coordinator.log"));
}

void StopCoordinator(Coordinator& c) {
  if (c.pid <= 0) return;
  kill(c.pid, SIGTERM);
  waitpid(c.pid, nullptr, 0);
  std::filesystem::remove_all(c.dir);
  c.pid = -1;
}

// utime + stime of `pid`, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(line.substr(close + 2), ' ');
  double utime = 0, stime = 0;
  if (fields.size() > 12) {
    (void)absl::SimpleAtod(fields[11], &utime);
    (void)absl::SimpleAtod(fields[12], &stime);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Separate TCP connections, as separate hosts would have.
std::shared_ptr<grpc::Channel> Channel(const std::string& address, int index) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("chorus.load_bench.channel", index);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

struct SimAgent {
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>> stream;
  std::string id;
  std::vector<int> launched_slots;
};

// One rank's Join, asynchronous: it lives until its callback has run.
struct JoinCall {
  grpc::ClientContext context;
  v1::JoinRequest request;
  v1::JoinResponse response;
};

// The simulated side of one run, filled in by RunOnce's phases in order:
// the connections to the coordinator, the agents, the job, and generation
// 1's Join of every launched slot.
struct SimCluster {
  int ranks = 0;
  // Separate connections (Channel), at most 32, shared round-robin.
  std::vector<std::shared_ptr<grpc::Channel>> pool;
  std::vector<std::unique_ptr<v1::RankService::Stub>> rank_stubs;
  std::unique_ptr<v1::JobService::Stub> jobs;
  std::vector<SimAgent> agents;
  std::string job_id;
  // One per launched slot, agent by agent; agent_of_call[i] is the index of
  // calls[i]'s agent.
  std::vector<std::unique_ptr<JoinCall>> calls;
  std::vector<int> agent_of_call;
};

SimCluster NewSimCluster(const std::string& address, int ranks) {
  SimCluster cluster;
  cluster.ranks = ranks;
  const int channels = std::max(1, std::min(32, ranks / 32));
  for (int i = 0; i < channels; ++i) {
    cluster.pool.push_back(Channel(address, i));
    cluster.rank_stubs.push_back(v1::RankService::NewStub(cluster.pool[i]));
  }
  cluster.jobs = v1::JobService::NewStub(cluster.pool[0]);
  return cluster;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

struct Result {
  int ranks = 0;
  double rendezvous_seconds = 0;
  double heartbeats_per_second = 0;
  double coordinator_cpu_percent = 0;
  double status_p50_ms = 0;
  double status_p99_ms = 0;
  int status_calls = 0;
  double page_p50_ms = 0;
  double page_p99_ms = 0;
  double scrape_p50_ms = 0;
  double scrape_p99_ms = 0;
  int scrapes = 0;
  size_t scrape_bytes = 0;
  double scrape_cpu_percent = 0;
  // Heartbeats alone (no scrape, no status).
  double heartbeat_cpu_percent = 0;
  // From a hang's start until one rank is named NEVER_JOINED.
  double never_joined_seconds = 0;
  // --reform: from one rank's exit until its next generation formed.
  double reform_seconds = 0;
  // --state etcd: submissions per second, one after another.
  double submits_per_second = 0;
  // --state etcd with --reform: the job's elastic record in etcd after the
  // re-formation, in bytes.
  size_t elastic_record_bytes = 0;
  // CPU seconds spent during the rendezvous by the coordinator and by this
  // bench (its simulated ranks share the machine's cores).
  double rendezvous_coordinator_cpu = 0;
  double rendezvous_bench_cpu = 0;
  // The same during the re-formation (--reform), and how its joins went.
  double reform_coordinator_cpu = 0;
  double reform_bench_cpu = 0;
  std::string reform_joins;
};

// Generation `generation`'s Join of every rank in `slots`, one RankService
// call per rank (asynchronous stubs), as ranks without an agent channel
// join; OK once all are answered, an error naming how many failed.
absl::Status JoinEachRank(std::vector<SimAgent>& agents,
                          const std::vector<std::unique_ptr<v1::RankService::Stub>>& stubs,
                          const std::string& job_id, const std::vector<std::pair<int, int>>& slots,
                          int64_t generation) {
  std::mutex mu;
  std::condition_variable cv;
  int done = 0, failed = 0;
  std::string first_error;
  std::vector<std::unique_ptr<JoinCall>> calls;
  calls.reserve(slots.size());
  for (size_t rank = 0; rank < slots.size(); ++rank) {
    JoinCall* call = calls.emplace_back(std::make_unique<JoinCall>()).get();
    call->request.set_job_id(job_id);
    call->request.set_generation(generation);
    call->request.set_agent_id(agents[slots[rank].first].id);
    call->request.set_slot(slots[rank].second);
    call->request.set_pid(400000 + static_cast<int>(rank));
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    stubs[rank % stubs.size()]->async()->Join(
        &call->context, &call->request, &call->response, [&](grpc::Status s) {
          std::lock_guard<std::mutex> lock(mu);
          if (!s.ok() && failed++ == 0) first_error = s.error_message();
          ++done;
          cv.notify_all();
        });
  }
  std::unique_lock<std::mutex> lock(mu);
  // Every call has a deadline, so every callback runs; wait for all of them.
  cv.wait(lock, [&] { return done == static_cast<int>(calls.size()); });
  if (failed > 0) {
    return absl::InternalError(absl::StrCat("generation ", generation, ": ", failed, " of ",
                                            slots.size(), " joins failed: ", first_error));
  }
  return absl::OkStatus();
}

// Generation `generation`'s joins through the agents, as chorus-worker
// sends them (Note [Joins through the agent] in coordinator/scheduling/agent_join_outbox.h):
// each agent writes one RankJoins message with its ranks' joins and reads
// its stream until every one is answered (RankJoinAnswers; other messages
// are skipped). kSenders threads share the agents. OK once all are
// answered, an error naming the first failure. `joined` (may be null) gets
// each answer by (agent index, slot).
absl::Status JoinThroughAgents(std::vector<SimAgent>& agents, const std::string& job_id,
                               const std::vector<std::pair<int, int>>& slots, int64_t generation,
                               std::map<std::pair<int, int>, v1::JoinResponse>* joined = nullptr) {
  constexpr int kSenders = 8;
  std::vector<std::vector<int>> slots_of(agents.size());
  for (const auto& [agent, slot] : slots) slots_of[agent].push_back(slot);
  std::mutex mu;
  std::string first_error;
  int failed = 0;
  auto fail = [&](const std::string& error) {
    std::lock_guard<std::mutex> lock(mu);
    if (failed++ == 0) first_error = error;
  };
  auto serve = [&](int t) {
    for (size_t a = t; a < agents.size(); a += kSenders) {
      v1::AgentMessage joins;
      for (int slot : slots_of[a]) {
        v1::JoinRequest& join = *joins.mutable_joins()->add_joins();
        join.set_job_id(job_id);
        join.set_generation(generation);
        join.set_slot(slot);
        join.set_pid(400000 + static_cast<int>(a) * 1000 + slot);
      }
      if (!slots_of[a].empty() && !agents[a].stream->Write(joins)) fail("an agent's stream closed");
    }
    for (size_t a = t; a < agents.size(); a += kSenders) {
      size_t answered = 0;
      v1::CoordinatorMessage m;
      while (answered < slots_of[a].size() && agents[a].stream->Read(&m)) {
        if (!m.has_joined()) continue;
        for (const v1::RankJoinAnswers::Entry& entry : m.joined().entries()) {
          ++answered;
          absl::StatusOr<v1::JoinResponse> answer = JoinAnswerFor(m.joined(), entry);
          if (!answer.ok()) {
            fail(std::string(answer.status().message()));
          } else if (joined != nullptr) {
            std::lock_guard<std::mutex> lock(mu);
            (*joined)[{static_cast<int>(a), entry.slot()}] = *std::move(answer);
          }
        }
      }
      if (answered < slots_of[a].size()) fail("an agent's stream ended before its answers");
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kSenders; ++t) threads.emplace_back(serve, t);
  for (std::thread& t : threads) t.join();
  if (failed > 0) {
    return absl::InternalError(absl::StrCat("generation ", generation, ": ", failed,
                                            " failures joining through the agents: ", first_error));
  }
  return absl::OkStatus();
}

// From rank `lost`'s exit (its agent reports code 1) until every rank of
// the next generation has its Join answered, through the agents or (not
// `through_agents`) each rank on its own. The ranks join once the lost
// rank's agent has the launch order for the freed slot, which the
// coordinator sends when it has planned the generation (a survivor that
// joins earlier is told to join again shortly). `slots`: each rank's
// (agent index, slot) in generation 1. Past 60 s every agent's stream is
// cancelled, which ends the waits with an error.
absl::StatusOr<double> TimeReformation(SimCluster& cluster,
                                       const std::vector<std::pair<int, int>>& slots, int lost,
                                       bool through_agents) {
  std::vector<SimAgent>& agents = cluster.agents;
  SimAgent& agent = agents[slots[lost].first];
  const absl::Time start = absl::Now();
  v1::AgentMessage exited;
  exited.mutable_rank_exited()->set_job_id(cluster.job_id);
  exited.mutable_rank_exited()->set_slot(slots[lost].second);
  exited.mutable_rank_exited()->set_pid(300000);
  exited.mutable_rank_exited()->set_exit_code(1);
  if (!agent.stream->Write(exited)) return absl::UnavailableError("the agent's stream closed");
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished; })) return;
    for (SimAgent& a : agents) a.context->TryCancel();
  });
  // The launch order (other messages, such as directives, are skipped).
  v1::CoordinatorMessage m;
  while (agent.stream->Read(&m) && !(m.has_launch() && m.launch().generation() == 2)) {
  }
  absl::Status joined = absl::UnavailableError("no launch order for generation 2");
  if (m.has_launch() && m.launch().generation() == 2) {
    joined = through_agents ? JoinThroughAgents(agents, cluster.job_id, slots, 2)
                            : JoinEachRank(agents, cluster.rank_stubs, cluster.job_id, slots, 2);
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  {
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
    cv.notify_all();
  }
  watchdog.join();
  RETURN_IF_ERROR(joined);
  return seconds;
}

// GET `path` on 127.0.0.1:port; its milliseconds, or an error naming it.
absl::StatusOr<double> TimedGet(httplib::Client& client, const std::string& path,
                                size_t* bytes = nullptr) {
  const absl::Time start = absl::Now();
  httplib::Result got = client.Get(path.c_str());
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (!got || got->status != 200) {
    return absl::InternalError(
        absl::StrCat("GET ", path, ": ",
                     got ? absl::StrCat("HTTP ", got->status) : httplib::to_string(got.error())));
  }
  if (bytes != nullptr) *bytes = got->body.size();
  return ms;
}

// Connects an agent per `slots_per_agent` ranks (the last one may have
// fewer slots) and waits for each one's welcome.
absl::Status ConnectAgents(SimCluster& cluster, int slots_per_agent) {
  const int ranks = cluster.ranks;
  const int agent_count = (ranks + slots_per_agent - 1) / slots_per_agent;
  cluster.agents.resize(agent_count);
  for (int a = 0; a < agent_count; ++a) {
    SimAgent& agent = cluster.agents[a];
    agent.context = std::make_unique<grpc::ClientContext>();
    agent.stream = v1::AgentService::NewStub(cluster.pool[a % cluster.pool.size()])
                       ->Connect(agent.context.get());
    v1::AgentMessage hello;
    hello.mutable_hello()->set_host(absl::StrCat("sim-", a));
    hello.mutable_hello()->set_slots(std::min(slots_per_agent, ranks - a * slots_per_agent));
    hello.mutable_hello()->set_pid(100000 + a);
    v1::CoordinatorMessage welcome;
    if (!agent.stream->Write(hello) || !agent.stream->Read(&welcome) || !welcome.has_welcome()) {
      return absl::UnavailableError(absl::StrCat("agent ", a, " was not welcomed"));
    }
    agent.id = welcome.welcome().agent_id();
  }
  return absl::OkStatus();
}

// Submits the job, one rank per slot (elastic with --reform), and reads
// every agent's launch order.
absl::Status SubmitJob(SimCluster& cluster, const Options& options) {
  const int ranks = cluster.ranks;
  v1::SubmitJobRequest submit;
  ASSIGN_OR_RETURN(
      *submit.mutable_spec(),
      ParseJobSpec(
          absl::StrCat(
              "name: \"load\" model { mlp {} } data { synthetic {} } resources { min_ranks: ",
              options.reform ? std::max(1, ranks - 1) : ranks, " max_ranks: ", ranks,
              " } hang_detection { dead_after_seconds: 600 stall_after_seconds: ",
              kStallAfterSeconds, " }", options.reform ? " elastic { max_restarts: 3 }" : ""),
          SpecFormat::kTextProto, "load_bench"));
  v1::SubmitJobResponse submitted;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  RETURN_IF_ERROR(FromGrpcStatus(cluster.jobs->SubmitJob(&context, submit, &submitted)));
  cluster.job_id = submitted.job_id();
  for (SimAgent& agent : cluster.agents) {
    v1::CoordinatorMessage m;
    if (!agent.stream->Read(&m) || !m.has_launch()) return absl::InternalError("no launch order");
    for (const v1::RankLaunch& r : m.launch().ranks()) agent.launched_slots.push_back(r.slot());
  }
  return absl::OkStatus();
}

// Generation 1's Join of every launched slot, agent by agent (not sent yet).
void PrepareJoins(SimCluster& cluster) {
  for (SimAgent& agent : cluster.agents) {
    for (int slot : agent.launched_slots) {
      cluster.agent_of_call.push_back(static_cast<int>(&agent - cluster.agents.data()));
      auto call = std::make_unique<JoinCall>();
      call->request.set_job_id(cluster.job_id);
      call->request.set_generation(1);
      call->request.set_agent_id(agent.id);
      call->request.set_slot(slot);
      call->request.set_pid(200000 + static_cast<int>(cluster.calls.size()));
      call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
      cluster.calls.push_back(std::move(call));
    }
  }
}

// Generation 1's joins through the agents (one RankJoins per agent, as
// chorus-worker sends its ranks' first joins: Note [The first join through
// the agent] in worker/rank_main.cc); each call's response is filled in.
absl::Status FirstJoinsThroughAgents(SimCluster& cluster) {
  std::vector<std::pair<int, int>> slots;
  for (size_t i = 0; i < cluster.calls.size(); ++i) {
    slots.emplace_back(cluster.agent_of_call[i], cluster.calls[i]->request.slot());
  }
  std::map<std::pair<int, int>, v1::JoinResponse> joined;
  RETURN_IF_ERROR(JoinThroughAgents(cluster.agents, cluster.job_id, slots, 1, &joined));
  for (size_t i = 0; i < cluster.calls.size(); ++i) {
    auto it = joined.find(slots[i]);
    if (it == joined.end()) {
      return absl::InternalError(absl::StrCat("no answer for slot ", slots[i].second,
                                              " of agent ", slots[i].first));
    }
    cluster.calls[i]->response = it->second;
  }
  return absl::OkStatus();
}

// Rendezvous: every rank joins at once, through the agents
// (`through_agents`) or each with its own RankService.Join. Sets the
// result's rendezvous time (first join sent to last answer) and the CPU the
// coordinator and this bench spent meanwhile; an error unless every join
// succeeded.
absl::Status TimeRendezvous(SimCluster& cluster, pid_t coordinator_pid, bool through_agents,
                            Result& result) {
  PrepareJoins(cluster);
  if (through_agents) {
    const absl::Time t0 = absl::Now();
    const double coordinator_cpu0 = CpuSeconds(coordinator_pid);
    const double bench_cpu0 = CpuSeconds(getpid());
    const absl::Status joined = FirstJoinsThroughAgents(cluster);
    result.rendezvous_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    result.rendezvous_coordinator_cpu = CpuSeconds(coordinator_pid) - coordinator_cpu0;
    result.rendezvous_bench_cpu = CpuSeconds(getpid()) - bench_cpu0;
    return joined;
  }
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  int failed = 0;
  std::string first_error;
  const absl::Time t0 = absl::Now();
  const double coordinator_cpu0 = CpuSeconds(coordinator_pid);
  const double bench_cpu0 = CpuSeconds(getpid());
  for (size_t i = 0; i < cluster.calls.size(); ++i) {
    JoinCall* call = cluster.calls[i].get();
    cluster.rank_stubs[i % cluster.rank_stubs.size()]->async()->Join(
        &call->context, &call->request, &call->response, [&](grpc::Status s) {
          std::lock_guard<std::mutex> lock(mu);
          if (!s.ok()) {
            if (failed++ == 0) first_error = s.error_message();
          }
          ++done;
          cv.notify_all();
        });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(150),
                [&] { return done == static_cast<int>(cluster.calls.size()); });
  }
  result.rendezvous_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  result.rendezvous_coordinator_cpu = CpuSeconds(coordinator_pid) - coordinator_cpu0;
  result.rendezvous_bench_cpu = CpuSeconds(getpid()) - bench_cpu0;
  if (done != static_cast<int>(cluster.calls.size()) || failed > 0) {
    return absl::InternalError(absl::StrCat(done, "/", cluster.calls.size(), " joins answered, ",
                                            failed, " failed: ", first_error));
  }
  return absl::OkStatus();
}

// Heartbeats at 1 Hz from every rank of generation 1 over kSenders threads,
// on the ranks' own streams or (aggregated) one message per agent. Once
// hang_since_us is set they describe a hang that names `culprit`
// (HeartbeatOf). The threads run from Start() until Stop() or destruction.
struct HeartbeatSenders {
  static constexpr int kSenders = 8;

  struct RankStream {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::RankHeartbeat, v1::Directive>> stream;
    int rank = 0;
  };

  // Opens the ranks' heartbeat streams (none when `aggregated`).
  HeartbeatSenders(SimCluster& cluster, bool aggregated, int culprit)
      : cluster(cluster), aggregated(aggregated), culprit(culprit) {
    streams.resize(aggregated ? 0 : cluster.calls.size());
    for (size_t i = 0; i < streams.size(); ++i) {
      streams[i].context = std::make_unique<grpc::ClientContext>();
      streams[i].stream =
          cluster.rank_stubs[i % cluster.rank_stubs.size()]->Heartbeat(streams[i].context.get());
      streams[i].rank = cluster.calls[i]->response.rank();
    }
  }
  ~HeartbeatSenders() { Stop(); }

  // Second 0 of every sender is `at`.
  void Start(absl::Time at) {
    start = at;
    for (int t = 0; t < kSenders; ++t) threads.emplace_back([this, t] { Send(t); });
  }

  void Stop() {
    stop.store(true);
    for (std::thread& t : threads) t.join();
    threads.clear();
  }

  // Sender `t`'s share: every kSenders-th stream, and the agents whose index
  // is t modulo kSenders.
  void Send(int t) {
    for (int second = 0; !stop.load(); ++second) {
      absl::SleepFor(start + absl::Seconds(second) - absl::Now());
      for (size_t i = t; i < streams.size() && !stop.load(); i += kSenders) {
        if (streams[i].stream->Write(HeartbeatOf(cluster.job_id, streams[i].rank, second,
                                                 hang_since_us.load(), culprit))) {
          sent.fetch_add(1);
        }
      }
      if (aggregated) SendAgentBatches(t, second);
    }
  }

  void SendAgentBatches(int t, int second) {
    std::vector<v1::AgentMessage> batches(cluster.agents.size());
    for (size_t i = 0; i < cluster.calls.size(); ++i) {
      const int agent = cluster.agent_of_call[i];
      if (agent % kSenders != t) continue;
      *batches[agent].mutable_heartbeats()->add_heartbeats() = HeartbeatOf(
          cluster.job_id, cluster.calls[i]->response.rank(), second, hang_since_us.load(), culprit);
    }
    for (size_t a = t; a < cluster.agents.size() && !stop.load(); a += kSenders) {
      const int n = batches[a].heartbeats().heartbeats_size();
      if (n > 0 && cluster.agents[a].stream->Write(batches[a])) sent.fetch_add(n);
    }
  }

  SimCluster& cluster;
  const bool aggregated;
  const int culprit;
  std::vector<RankStream> streams;
  absl::Time start;
  std::atomic<int64_t> sent{0};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> hang_since_us{0};
  std::vector<std::thread> threads;
};

// GET /metrics once a second from `start`, as Prometheus would, on a thread
// of its own from Start() until Stop() or destruction.
struct MetricsScraper {
  MetricsScraper(int http_port, absl::Time start) : http_port(http_port), start(start) {}
  ~MetricsScraper() { (void)Stop(); }

  void Start() {
    thread = std::thread([this] { Scrape(); });
  }

  // The first failed scrape's error, if one failed.
  absl::Status Stop() {
    stop.store(true);
    if (thread.joinable()) thread.join();
    return error.empty() ? absl::OkStatus() : absl::InternalError(error);
  }

  void Scrape() {
    httplib::Client client("127.0.0.1", http_port);
    client.set_read_timeout(10);
    for (int second = 0; !stop.load(); ++second) {
      absl::StatusOr<double> ms = TimedGet(client, "/metrics", &bytes);
      if (!ms.ok()) {
        error = std::string(ms.status().message());
        return;
      }
      scrape_ms.push_back(*ms);
      const absl::Time next = start + absl::Seconds(second + 1);
      while (!stop.load() && absl::Now() < next) absl::SleepFor(absl::Milliseconds(10));
    }
  }

  const int http_port;
  const absl::Time start;
  // Written by the thread; read after Stop().
  std::vector<double> scrape_ms;
  size_t bytes = 0;
  std::string error;
  std::atomic<bool> stop{false};
  std::thread thread;
};

// GetJobStatus and the job page's JSON, timed back to back until `end`;
// an error if either fails or the status lacks ranks.
absl::Status TimeStatusAndPage(SimCluster& cluster, int http_port, absl::Time end,
                               std::vector<double>& status_ms, std::vector<double>& page_ms) {
  httplib::Client page_client("127.0.0.1", http_port);
  page_client.set_read_timeout(10);
  while (absl::Now() < end) {
    ASSIGN_OR_RETURN(const double page, TimedGet(page_client, "/api/jobs/" + cluster.job_id));
    page_ms.push_back(page);
    v1::GetJobStatusRequest request;
    request.set_job_id(cluster.job_id);
    v1::JobStatus status;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    const absl::Time start = absl::Now();
    grpc::Status s = cluster.jobs->GetJobStatus(&context, request, &status);
    if (!s.ok()) return absl::InternalError("GetJobStatus: " + s.error_message());
    status_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    // A coordinator before the rank summary sent every row.
    if (std::max(status.rank_summary().ranks(), status.ranks_size()) != cluster.ranks)
      return absl::InternalError("status lacks ranks");
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::OkStatus();
}

// The CPU `pid` uses over the next `span` (this thread sleeps), in percent
// of one core.
double CpuPercentOver(pid_t pid, absl::Duration span) {
  const absl::Time start = absl::Now();
  const double cpu_start = CpuSeconds(pid);
  absl::SleepFor(span);
  return 100.0 * (CpuSeconds(pid) - cpu_start) / absl::ToDoubleSeconds(absl::Now() - start);
}

// (agent index, slot) of each rank of generation 1.
std::vector<std::pair<int, int>> LaunchedSlots(const SimCluster& cluster) {
  std::vector<std::pair<int, int>> slots;
  for (size_t i = 0; i < cluster.calls.size(); ++i) {
    slots.emplace_back(cluster.agent_of_call[i], cluster.calls[i]->request.slot());
  }
  return slots;
}

// Submits `n` two-rank jobs one after another; submissions per second.
// Every slot is taken, so they wait PENDING (each is a job and its event
// written to the state before the answer).
absl::StatusOr<double> TimeSubmits(v1::JobService::Stub& jobs, int n) {
  v1::SubmitJobRequest submit;
  ASSIGN_OR_RETURN(*submit.mutable_spec(),
                   ParseJobSpec("name: \"queued\" model { mlp {} } data { synthetic {} } "
                                "resources { min_ranks: 2 max_ranks: 2 }",
                                SpecFormat::kTextProto, "load_bench"));
  const absl::Time start = absl::Now();
  for (int i = 0; i < n; ++i) {
    v1::SubmitJobResponse submitted;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    RETURN_IF_ERROR(FromGrpcStatus(jobs.SubmitJob(&context, submit, &submitted)));
  }
  return n / absl::ToDoubleSeconds(absl::Now() - start);
}

// The size of job `job_id`'s elastic record in the etcd state under
// `prefix` (EtcdStateStore keeps it at PREFIX/elastic/JOB).
absl::StatusOr<size_t> ElasticRecordBytes(const std::string& endpoints, const std::string& prefix,
                                          const std::string& job_id) {
  EtcdOptions etcd;
  etcd.endpoints = endpoints;
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client, EtcdClient::Connect(etcd));
  etcdserverpb::RangeRequest request;
  request.set_key(absl::StrCat(prefix, "/elastic/", job_id));
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse response, client->Range(request));
  if (response.kvs_size() != 1) {
    return absl::NotFoundError(absl::StrCat("no elastic record of ", job_id, " in etcd"));
  }
  return response.kvs(0).value().size();
}

// One world size, on a fresh coordinator: the phases in the file comment.
absl::StatusOr<Result> RunOnce(const std::string& binary, int ranks, const Options& options) {
  ASSIGN_OR_RETURN(Coordinator coordinator, StartCoordinator(binary, options.state_flags));
  struct Stop {
    Coordinator& c;
    ~Stop() { StopCoordinator(c); }
  } stop{coordinator};
  if (!options.state_flags.empty()) RETURN_IF_ERROR(WaitUntilLeading(coordinator, absl::Seconds(30)));
  SimCluster cluster = NewSimCluster(coordinator.address, ranks);
  RETURN_IF_ERROR(ConnectAgents(cluster, options.ranks_per_agent));
  RETURN_IF_ERROR(SubmitJob(cluster, options));
  Result result;
  result.ranks = ranks;
  RETURN_IF_ERROR(TimeRendezvous(cluster, coordinator.pid, options.joins_through_agents, result));

  // Heartbeats and the 1 Hz scrape while GetJobStatus and the page are
  // timed; then heartbeats and the scrape only; then heartbeats only.
  const absl::Duration phase = absl::Seconds(options.heartbeat_seconds);
  const int culprit = ranks / 2 + 1 < ranks ? ranks / 2 + 1 : 0;
  HeartbeatSenders heartbeats(cluster, options.aggregated, culprit);
  const absl::Time hb_start = absl::Now();
  const double cpu_start = CpuSeconds(coordinator.pid);
  heartbeats.Start(hb_start);
  MetricsScraper scraper(coordinator.http_port, hb_start);
  scraper.Start();
  std::vector<double> status_ms, page_ms;
  RETURN_IF_ERROR(
      TimeStatusAndPage(cluster, coordinator.http_port, hb_start + phase, status_ms, page_ms));
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - hb_start);
  const double cpu = CpuSeconds(coordinator.pid) - cpu_start;
  result.scrape_cpu_percent = CpuPercentOver(coordinator.pid, phase);
  RETURN_IF_ERROR(scraper.Stop());
  result.heartbeat_cpu_percent = CpuPercentOver(coordinator.pid, phase);
  ASSIGN_OR_RETURN(result.never_joined_seconds,
                   TimeNeverJoined(*cluster.jobs, cluster.job_id, culprit, heartbeats.hang_since_us,
                                   absl::Seconds(kStallAfterSeconds + 20)));
  result.scrape_p50_ms = Percentile(scraper.scrape_ms, 0.50);
  result.scrape_p99_ms = Percentile(scraper.scrape_ms, 0.99);
  result.scrapes = static_cast<int>(scraper.scrape_ms.size());
  result.scrape_bytes = scraper.bytes;
  result.page_p50_ms = Percentile(page_ms, 0.50);
  result.page_p99_ms = Percentile(page_ms, 0.99);
  heartbeats.Stop();
  if (options.reform) {
    const double coordinator_cpu0 = CpuSeconds(coordinator.pid);
    const double bench_cpu0 = CpuSeconds(getpid());
    const int lost = options.lost_rank >= 0 && options.lost_rank < ranks ? options.lost_rank
                                                                          : culprit;
    ASSIGN_OR_RETURN(result.reform_seconds,
                     TimeReformation(cluster, LaunchedSlots(cluster), lost,
                                     options.joins_through_agents));
    result.reform_coordinator_cpu = CpuSeconds(coordinator.pid) - coordinator_cpu0;
    result.reform_bench_cpu = CpuSeconds(getpid()) - bench_cpu0;
    result.reform_joins = options.joins_through_agents ? "through the agents" : "one per rank";
    if (!options.etcd_endpoints.empty()) {
      ASSIGN_OR_RETURN(result.elastic_record_bytes,
                       ElasticRecordBytes(options.etcd_endpoints, options.etcd_prefix,
                                          cluster.job_id));
    }
  }
  if (options.time_submits) {
    ASSIGN_OR_RETURN(result.submits_per_second, TimeSubmits(*cluster.jobs, kTimedSubmits));
  }
  for (HeartbeatSenders::RankStream& s : heartbeats.streams) s.context->TryCancel();
  for (SimAgent& a : cluster.agents) a.context->TryCancel();
  result.heartbeats_per_second =
      static_cast<double>(heartbeats.sent.load()) / absl::ToDoubleSeconds(absl::Now() - hb_start);
  result.coordinator_cpu_percent = 100.0 * cpu / elapsed;
  result.status_p50_ms = Percentile(status_ms, 0.50);
  result.status_p99_ms = Percentile(status_ms, 0.99);
  result.status_calls = static_cast<int>(status_ms.size());
  return result;
}

// Runs the TorchElastic peer; returns its median seconds.
absl::StatusOr<double> TorchElastic(const std::string& script, int participants) {
  const std::string command =
      absl::StrCat("/usr/bin/python3 ", script, " --participants ", participants, " --runs 3 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("cannot run " + command);
  std::string output, last;
  char buffer[4096];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) {
    output += buffer;
    std::string line(buffer);
    if (line.find("median_seconds") != std::string::npos) last = line;
  }
  const int rc = pclose(pipe);
  const size_t at = last.find("\"median_seconds\":");
  double seconds = 0;
  if (rc != 0 || at == std::string::npos ||
      !absl::SimpleAtod(last.substr(at + 17, last.find_first_of(",}", at + 17) - at - 17),
                        &seconds)) {
    return absl::InternalError("TorchElastic peer failed:\n" + output);
  }
  return seconds;
}

struct Flags {
  std::vector<int> sizes = {256, 1024};
  Options options;
  // Bazel builds it in its own package: bazel-bin/coordinator/.
  std::string binary = CompanionBinary(ExecutableDir(), "chorus-coordinator", "coordinator");
  // Relative to the workspace under `bazel run`.
  std::string peer = "tests/bench/torchelastic_rendezvous_peer.py";
  // --state etcd: every size on SQLite and on etcd.
  bool compare_etcd = false;
};

// The flags in the file comment (and --coordinator_bin, --peer); an error
// names the flag and the value it got.
constexpr char kUsage[] =
    "usage: load_bench [--sizes 256,1024] [--heartbeat_seconds 5] [--ranks_per_agent 64]\n"
    "                  [--heartbeats rank|agent] [--reform 1] [--joins agent|rank]\n"
    "                  [--lose_rank R] [--state etcd|sqlite] [--peer PATH]\n"
    "                  [--coordinator_bin PATH]\n"
    "A simulated cluster of N ranks against a real chorus-coordinator (the opening comment of\n"
    "bench/load_bench.cc and docs/benchmarks.md, \"Coordinator load\", say what each\n"
    "column and result line means).\n";

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  Options& options = flags.options;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return absl::CancelledError(kUsage);
    if (i + 1 == argc) return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
    const std::string value = argv[i + 1];
    if (flag == "--sizes") {
      flags.sizes.clear();
      for (absl::string_view v : absl::StrSplit(value, ',')) {
        int n = 0;
        if (absl::SimpleAtoi(v, &n) && n > 0 && n <= kMaxRanks) flags.sizes.push_back(n);
      }
    } else if (flag == "--heartbeat_seconds") {
      (void)absl::SimpleAtod(value, &options.heartbeat_seconds);
    } else if (flag == "--ranks_per_agent") {
      if (!absl::SimpleAtoi(value, &options.ranks_per_agent) || options.ranks_per_agent < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--ranks_per_agent must be a positive number, got ", value));
      }
    } else if (flag == "--coordinator_bin") {
      flags.binary = value;
    } else if (flag == "--heartbeats") {
      if (value != "rank" && value != "agent") {
        return absl::InvalidArgumentError(
            absl::StrCat("--heartbeats must be rank or agent, got ", value));
      }
      options.aggregated = value == "agent";
    } else if (flag == "--joins") {
      if (value != "rank" && value != "agent") {
        return absl::InvalidArgumentError(
            absl::StrCat("--joins must be rank or agent, got ", value));
      }
      options.joins_through_agents = value == "agent";
    } else if (flag == "--reform") {
      options.reform = value == "1" || value == "true";
    } else if (flag == "--lose_rank") {
      if (!absl::SimpleAtoi(value, &options.lost_rank) || options.lost_rank < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--lose_rank must be a rank (0 or more), got ", value));
      }
    } else if (flag == "--peer") {
      flags.peer = value;
    } else if (flag == "--state") {
      if (value != "etcd" && value != "sqlite") {
        return absl::InvalidArgumentError(
            absl::StrCat("--state must be etcd (compare with SQLite) or sqlite, got ", value));
      }
      flags.compare_etcd = value == "etcd";
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag, " (see --help)"));
    }
  }
  if (const char* dir = std::getenv("BUILD_WORKSPACE_DIRECTORY");
      dir != nullptr && flags.peer[0] != '/') {
    flags.peer = std::string(dir) + "/" + flags.peer;
  }
  return flags;
}

void PrintTableHeader() {
  std::cout << absl::StrFormat(
      "%-7s %-13s %-13s %-12s %-11s %-11s %-11s %-11s %-11s %-11s %-13s %-9s %s\n", "RANKS",
      "RENDEZVOUS_S", "HEARTBEATS/S", "COORD_CPU_%", "STATUS_P50", "STATUS_P99", "PAGE_P50",
      "PAGE_P99", "SCRAPE_P50", "SCRAPE_P99", "SCRAPE_CPU_%", "HB_CPU_%", "NEVER_JOINED_S");
}

// The table's row for `r` and its notes.
void PrintTableRow(const Result& r) {
  auto ms = [](double v) { return absl::StrFormat("%.2f ms", v); };
  std::cout << absl::StrFormat(
      "%-7d %-13.3f %-13.0f %-12.1f %-11s %-11s %-11s %-11s %-11s %-11s %-13.1f %-9.1f %.2f\n",
      r.ranks, r.rendezvous_seconds, r.heartbeats_per_second, r.coordinator_cpu_percent,
      ms(r.status_p50_ms), ms(r.status_p99_ms), ms(r.page_p50_ms), ms(r.page_p99_ms),
      ms(r.scrape_p50_ms), ms(r.scrape_p99_ms), r.scrape_cpu_percent, r.heartbeat_cpu_percent,
      r.never_joined_seconds);
  std::cout << absl::StrFormat(
      "        (%d scrapes of %zu bytes; rendezvous CPU: coordinator %.2f s, this bench %.2f s)\n",
      r.scrapes, r.scrape_bytes, r.rendezvous_coordinator_cpu, r.rendezvous_bench_cpu);
  if (r.reform_seconds > 0) {
    std::cout << absl::StrFormat(
        "        one rank lost: generation 2 formed in %.3f s (joins %s; CPU: coordinator %.2f "
        "s, this bench %.2f s)\n",
        r.reform_seconds, r.reform_joins, r.reform_coordinator_cpu, r.reform_bench_cpu);
  }
  if (r.elastic_record_bytes > 0) {
    std::cout << absl::StrFormat("        the job's elastic record in etcd: %zu bytes\n",
                                 r.elastic_record_bytes);
  }
  std::cout.flush();
}

// A result line (docs/benchmarks.md) for one world size; no peer at that size.
void PrintSizeResultLine(const Result& r, const Options& options) {
  std::cout << absl::StrFormat(
      "{\"bench\": \"load_bench\", \"metric\": \"rendezvous_seconds_%d_ranks\", \"unit\": \"s\", "
      "\"ours\": %.4f, "
      "\"peer\": null, \"peer_name\": null, \"ratio\": null, \"status_p99_ms\": %.2f, "
      "\"page_p99_ms\": %.2f, \"scrape_p99_ms\": %.2f, \"scrape_cpu_percent\": %.1f, "
      "\"heartbeat_cpu_percent\": %.1f, \"never_joined_seconds\": %.2f, "
      "\"stall_after_seconds\": %d, \"reform_seconds\": %.3f, \"ranks_per_agent\": %d, "
      "\"heartbeats\": \"%s\", \"joins\": \"%s\", \"reform_coordinator_cpu_seconds\": %.3f}\n",
      r.ranks, r.rendezvous_seconds, r.status_p99_ms, r.page_p99_ms, r.scrape_p99_ms,
      r.scrape_cpu_percent, r.heartbeat_cpu_percent, r.never_joined_seconds, kStallAfterSeconds,
      r.reform_seconds, options.ranks_per_agent, options.aggregated ? "agent" : "rank",
      options.joins_through_agents ? "agent" : "rank", r.reform_coordinator_cpu);
}

// Chorus's rendezvous of 64 ranks, three runs (1 s of heartbeats each):
// their seconds, sorted.
absl::StatusOr<std::vector<double>> RendezvousAt64(const std::string& binary,
                                                   const Options& options) {
  std::vector<double> ours;
  for (int i = 0; i < 3; ++i) {
    Options small = options;
    small.heartbeat_seconds = 1;
    ASSIGN_OR_RETURN(const Result r, RunOnce(binary, 64, small));
    ours.push_back(r.rendezvous_seconds);
  }
  std::sort(ours.begin(), ours.end());
  return ours;
}

// A result line comparing etcd with SQLite at one size.
void PrintStateResultLine(const char* metric, const char* unit, int ranks, double etcd,
                          double sqlite) {
  std::cout << absl::StrFormat(
      "{\"bench\": \"load_bench\", \"metric\": \"%s_%d_ranks_etcd\", \"unit\": \"%s\", "
      "\"ours\": %.5f, \"peer\": %.5f, \"peer_name\": \"chorus on SQLite\", \"ratio\": %.4f}\n",
      metric, ranks, unit, etcd, sqlite, etcd / sqlite);
}

// --state etcd: every size on SQLite, then on a one-member etcd.
int CompareStates(const Flags& flags) {
  absl::StatusOr<std::unique_ptr<EtcdTestCluster>> etcd = EtcdTestCluster::Start(1);
  if (!etcd.ok()) {
    std::cerr << "load_bench: " << etcd.status().message() << "\n";
    return 1;
  }
  PrintTableHeader();
  for (int n : flags.sizes) {
    Options options = flags.options;
    options.time_submits = true;
    absl::StatusOr<Result> sqlite = RunOnce(flags.binary, n, options);
    options.etcd_endpoints = (*etcd)->endpoints();
    options.etcd_prefix = absl::StrCat("/bench/", n);
    options.state_flags = {"--state",
                           absl::StrCat("etcd://", options.etcd_endpoints, options.etcd_prefix),
                           "--checkpoint_dir", "$DIR/checkpoints"};
    absl::StatusOr<Result> on_etcd =
        sqlite.ok() ? RunOnce(flags.binary, n, options) : sqlite.status();
    if (!on_etcd.ok()) {
      std::cerr << "load_bench: " << n << " ranks: " << on_etcd.status() << "\n";
      return 1;
    }
    for (const auto& [name, r] : {std::pair{"SQLite", &*sqlite}, std::pair{"etcd", &*on_etcd}}) {
      std::cout << absl::StrFormat("        on %s: %.1f submissions/s\n", name,
                                   r->submits_per_second);
      PrintTableRow(*r);
    }
    PrintStateResultLine("seconds_per_submit", "s", n, 1 / on_etcd->submits_per_second,
                         1 / sqlite->submits_per_second);
    PrintStateResultLine("rendezvous_seconds", "s", n, on_etcd->rendezvous_seconds,
                         sqlite->rendezvous_seconds);
    if (on_etcd->elastic_record_bytes > 0) {
      // What etcd holds of the job after the re-formation; no peer keeps
      // such a record (Note [A bounded history]).
      std::cout << absl::StrFormat(
          "{\"bench\": \"load_bench\", \"metric\": \"elastic_record_bytes_%d_ranks\", "
          "\"unit\": \"bytes\", \"ours\": %zu, \"peer\": null, \"peer_name\": null, "
          "\"ratio\": null}\n",
          n, on_etcd->elastic_record_bytes);
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (absl::IsCancelled(flags.status())) {
    std::cout << flags.status().message();
    return 0;
  }
  if (!flags.ok()) {
    std::cerr << "load_bench: " << flags.status().message() << "\n";
    return 2;
  }
  if (flags->compare_etcd) return CompareStates(*flags);
  PrintTableHeader();
  for (int n : flags->sizes) {
    absl::StatusOr<Result> r = RunOnce(flags->binary, n, flags->options);
    if (!r.ok()) {
      std::cerr << "load_bench: " << n << " ranks: " << r.status() << "\n";
      return 1;
    }
    PrintTableRow(*r);
    PrintSizeResultLine(*r, flags->options);
  }
  // Chorus and TorchElastic at 64, median of 3 each.
  absl::StatusOr<std::vector<double>> ours = RendezvousAt64(flags->binary, flags->options);
  if (!ours.ok()) {
    std::cerr << "load_bench: 64 ranks: " << ours.status() << "\n";
    return 1;
  }
  absl::StatusOr<double> theirs = TorchElastic(flags->peer, 64);
  if (!theirs.ok()) {
    std::cerr << "load_bench: " << theirs.status() << "\n";
    return 1;
  }
  const std::vector<double>& o = *ours;
  std::cout << absl::StrFormat(
      "64 ranks: Chorus rendezvous median %.4f s (%.4f %.4f %.4f), TorchElastic %.4f s\n", o[1],
      o[0], o[1], o[2], *theirs);
  std::cout << absl::StrFormat(
      "{\"bench\": \"load_bench\", \"metric\": \"rendezvous_seconds_64_ranks\", \"unit\": \"s\", "
      "\"ours\": %.4f, "
      "\"peer\": %.4f, \"peer_name\": \"torchelastic "
      "DynamicRendezvousHandler+C10dRendezvousBackend+TCPStore\", "
      "\"ratio\": %.4f}\n",
      o[1], *theirs, o[1] / *theirs);
  return 0;
}

}  // namespace
}  // namespace chorus

int main(int argc, char** argv) { return chorus::Main(argc, argv); }
