#include "worker/runtime/program_supervisor.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

// The coordinator's side: records heartbeats and reports.
class FakeRankService : public v1::RankService::Service {
 public:
  grpc::Status Heartbeat(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::Directive, v1::RankHeartbeat>* stream) override {
    v1::RankHeartbeat hb;
    while (stream->Read(&hb)) {
      v1::Directive send;
      {
        absl::MutexLock lock(&mu_);
        heartbeats_.push_back(hb);
        if (directive_.kind() == v1::Directive::KIND_UNSPECIFIED) continue;
        send = directive_;
        directive_.Clear();
      }
      stream->Write(send);
    }
    return grpc::Status::OK;
  }
  // Answered once to the next heartbeat.
  void SendDirective(const v1::Directive& directive) {
    absl::MutexLock lock(&mu_);
    directive_ = directive;
  }
  grpc::Status Report(grpc::ServerContext*, const v1::ReportRequest* request,
                      v1::ReportResponse*) override {
    absl::MutexLock lock(&mu_);
    reports_.push_back(*request);
    return grpc::Status::OK;
  }
  std::vector<v1::RankHeartbeat> heartbeats() {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  std::vector<v1::ReportRequest> reports() {
    absl::MutexLock lock(&mu_);
    return reports_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::RankHeartbeat> heartbeats_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ReportRequest> reports_ ABSL_GUARDED_BY(mu_);
  v1::Directive directive_ ABSL_GUARDED_BY(mu_);
};

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// "NAME=value" lines as a map.
std::map<std::string, std::string> ParseEnv(const std::string& text) {
  std::map<std::string, std::string> env;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    env[kv.first] = kv.second;
  }
  return env;
}

ProgramRank Rank(int rank, int world_size, std::vector<std::string> argv) {
  ProgramRank r;
  r.joined.set_rank(rank);
  r.joined.set_world_size(world_size);
  r.joined.set_generation(1);
  r.joined.set_local_rank(rank);
  r.joined.set_local_world_size(world_size);
  r.joined.set_store_namespace("job-000007/gen-1");
  for (const std::string& a : argv) r.joined.mutable_spec()->mutable_program()->add_argv(a);
  r.job_id = "job-000007";
  r.coordinator = "127.0.0.1:1";
  r.rank_host = "127.0.0.1";
  return r;
}

TEST(ProgramEnvironmentTest, SetsTorchrunAndChorusVariablesOverTheBaseAndTheSpec) {
  ProgramRank rank = Rank(1, 4, {"/bin/true"});
  rank.joined.set_local_rank(0);
  rank.joined.set_local_world_size(2);
  rank.joined.set_group_world_size(1);
  (*rank.joined.mutable_spec()->mutable_program()->mutable_env())["SEED"] = "7";
  (*rank.joined.mutable_spec()->mutable_program()->mutable_env())["PATH"] = "/opt/bin";
  const std::vector<std::string> env =
      ProgramEnvironment({"PATH=/usr/bin", "RANK=99", "CHORUS_TOKEN=secret", "NOT_AN_ENTRY"}, rank,
                         HostPort{"10.0.0.5", 29500}, "/tmp/join", 5);
  std::map<std::string, std::string> got;
  for (const std::string& e : env) {
    ASSERT_EQ(got.count(e.substr(0, e.find('='))), 0u) << "each name once: " << e;
    got[e.substr(0, e.find('='))] = e.substr(e.find('=') + 1);
  }
  EXPECT_EQ(got["PATH"], "/opt/bin") << "the spec's env replaces the base";
  EXPECT_EQ(got["SEED"], "7");
  EXPECT_EQ(got["CHORUS_TOKEN"], "secret") << "credentials pass through";
  EXPECT_EQ(got["RANK"], "1");
  EXPECT_EQ(got["WORLD_SIZE"], "4");
  EXPECT_EQ(got["LOCAL_RANK"], "0");
  EXPECT_EQ(got["LOCAL_WORLD_SIZE"], "2");
  EXPECT_EQ(got["MASTER_ADDR"], "10.0.0.5");
  EXPECT_EQ(got["MASTER_PORT"], "29500");
  EXPECT_EQ(got["CHORUS_COORDINATOR"], "127.0.0.1:1");
  EXPECT_EQ(got["CHORUS_JOB_ID"], "job-000007");
  EXPECT_EQ(got["CHORUS_GENERATION"], "1");
  EXPECT_EQ(got["CHORUS_RANK"], "1");
  EXPECT_EQ(got["CHORUS_WORLD_SIZE"], "4");
  EXPECT_EQ(got["CHORUS_STORE_NAMESPACE"], "job-000007/gen-1");
  EXPECT_EQ(got["CHORUS_RANK_HOST"], "127.0.0.1");
  EXPECT_EQ(got["CHORUS_JOIN_FILE"], "/tmp/join");
  EXPECT_EQ(got["CHORUS_PROGRESS_FD"], "5");
  // torchrun's other variables, for a job without an elastic block.
  EXPECT_EQ(got["GROUP_RANK"], "0");
  EXPECT_EQ(got["GROUP_WORLD_SIZE"], "1");
  EXPECT_EQ(got["ROLE_NAME"], "default");
  EXPECT_EQ(got["ROLE_RANK"], "1");
  EXPECT_EQ(got["ROLE_WORLD_SIZE"], "4");
  EXPECT_EQ(got["TORCHELASTIC_RESTART_COUNT"], "0");
  EXPECT_EQ(got["TORCHELASTIC_MAX_RESTARTS"], "0");
  EXPECT_EQ(got["TORCHELASTIC_RUN_ID"], "job-000007");
  EXPECT_EQ(got["TORCHELASTIC_USE_AGENT_STORE"], "False");
  EXPECT_EQ(got["NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(got.count("CHORUS_RANK_PID"), 0u) << "no supervisor pid given";
  EXPECT_EQ(got.count("NOT_AN_ENTRY"), 0u);
  EXPECT_EQ(env[0], "PATH=/opt/bin") << "base order kept";

  const std::vector<std::string> without =
      ProgramEnvironment({}, rank, HostPort{"h", 1}, "/tmp/join", -1);
  for (const std::string& e : without) EXPECT_NE(e.rfind("CHORUS_PROGRESS_FD=", 0), 0u);

  rank.supervisor_pid = 4242;
  const std::vector<std::string> with_pid =
      ProgramEnvironment({"CHORUS_AGENT_ID=agent-3", "CHORUS_SLOT=1",
                          "CHORUS_AGENT_HEARTBEATS_FD=9", "CHORUS_AGENT_JOINS=1"},
                         rank, HostPort{"h", 1}, "/tmp/join", -1);
  EXPECT_THAT(with_pid, ::testing::IsSupersetOf(
                            {"CHORUS_RANK_PID=4242", "CHORUS_AGENT_ID=agent-3", "CHORUS_SLOT=1"}))
      << "an elastic program joins later generations by its agent, slot and supervisor";
  for (const std::string& e : with_pid) {
    EXPECT_NE(e.rfind("CHORUS_AGENT_HEARTBEATS_FD=", 0), 0u)
        << "the supervisor's channel to its agent reached the program";
    // Whether the program's own channel takes joins is the supervisor's to
    // say (it relays them: join_relay.h), not inherited from the agent.
    EXPECT_NE(e.rfind("CHORUS_AGENT_JOINS=", 0), 0u) << e;
  }
}

// Note [torchrun's variables]: an elastic job's third generation, after two
// failures, on the second of two agents.
TEST(ProgramEnvironmentTest, AnElasticRankGetsTorchrunsRestartCountAndGroup) {
  ProgramRank rank = Rank(3, 4, {"/usr/bin/python3"});
  rank.joined.set_generation(3);
  rank.joined.set_restarts(2);
  rank.joined.set_group_rank(1);
  rank.joined.set_group_world_size(2);
  rank.joined.mutable_spec()->mutable_elastic()->set_max_restarts(5);
  std::map<std::string, std::string> got;
  for (const std::string& e :
       ProgramEnvironment({"NCCL_ASYNC_ERROR_HANDLING=0"}, rank, HostPort{"h", 1}, "/j", -1)) {
    got[e.substr(0, e.find('='))] = e.substr(e.find('=') + 1);
  }
  EXPECT_EQ(got["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(got["TORCHELASTIC_MAX_RESTARTS"], "5");
  EXPECT_EQ(got["GROUP_RANK"], "1");
  EXPECT_EQ(got["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(got["ROLE_RANK"], "3");
  EXPECT_EQ(got["CHORUS_GENERATION"], "3");
  EXPECT_EQ(got["NCCL_ASYNC_ERROR_HANDLING"], "0") << "the agent's own choice is kept";
}

TEST(MasterAddressTest, RankZeroPublishesAFreePortTheOthersRead) {
  MemoryStore store;
  absl::StatusOr<HostPort> other;
  std::thread waiter(
      [&] { other = AgreeMasterAddress(store, 1, "127.0.0.1", absl::Now() + absl::Seconds(10)); });
  absl::StatusOr<HostPort> zero =
      AgreeMasterAddress(store, 0, "127.0.0.1", absl::Now() + absl::Seconds(10));
  waiter.join();
  ASSERT_TRUE(zero.ok()) << zero.status();
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(zero->host, "127.0.0.1");
  EXPECT_GT(zero->port, 0);
  EXPECT_EQ(other->host, zero->host);
  EXPECT_EQ(other->port, zero->port);
}

TEST(MasterAddressTest, OtherRanksWaitWithADeadline) {
  MemoryStore store;
  absl::StatusOr<HostPort> other =
      AgreeMasterAddress(store, 2, "127.0.0.1", absl::Now() + absl::Milliseconds(100));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(other.status().message(), HasSubstr("rank 0 has not published them"));
}

TEST(MasterAddressTest, AHostThatCannotBeBoundIsNamed) {
  absl::StatusOr<int> port = PickFreePort("203.0.113.77");  // TEST-NET-3: not ours
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(port.status().message(), HasSubstr("CHORUS_RANK_HOST 203.0.113.77"));
}

TEST(ProgramOutcomeTest, ExitCodesAndSignalsAreNamed) {
  int status = 0;
  const pid_t exits = fork();
  if (exits == 0) _exit(3);
  ASSERT_EQ(waitpid(exits, &status, 0), exits);
  const ProgramOutcome three = ProgramOutcome::FromWaitStatus(exits, status);
  EXPECT_FALSE(three.ok());
  EXPECT_EQ(three.ExitCode(), 3);
  EXPECT_EQ(three.ToStatus("/bin/train").message(),
            "the program /bin/train (pid " + std::to_string(exits) + ") exited with code 3");

  const pid_t killed = fork();
  if (killed == 0) {
    pause();
    _exit(0);
  }
  kill(killed, SIGKILL);
  ASSERT_EQ(waitpid(killed, &status, 0), killed);
  const ProgramOutcome nine = ProgramOutcome::FromWaitStatus(killed, status);
  EXPECT_TRUE(nine.signaled);
  EXPECT_EQ(nine.ExitCode(), 137);
  EXPECT_THAT(nine.ToStatus("/bin/train").message(), HasSubstr("was killed by signal 9 (Killed)"));

  const v1::ReportRequest report = FinalReport(Rank(2, 4, {"/bin/train"}), three, "/bin/train");
  EXPECT_TRUE(report.final());
  EXPECT_FALSE(report.success());
  EXPECT_EQ(report.rank(), 2);
  EXPECT_EQ(report.generation(), 1);
  EXPECT_EQ(report.job_id(), "job-000007");
  EXPECT_THAT(report.error(), HasSubstr("exited with code 3"));
  EXPECT_EQ(report.metrics().ByteSizeLong(), 0u) << "no record: the program's own metrics stay";
  v1::RankHeartbeat newest;
  newest.set_step(12);
  newest.set_epoch(1);
  newest.set_loss(0.5);
  newest.set_samples_per_second(80);
  newest.set_phase(v1::FINISHED);
  const v1::ReportRequest with_progress =
      FinalReport(Rank(0, 4, {"/bin/train"}), ProgramOutcome{}, "/bin/train", newest);
  EXPECT_EQ(with_progress.metrics().step(), 12);
  EXPECT_EQ(with_progress.metrics().epoch(), 1);
  EXPECT_DOUBLE_EQ(with_progress.metrics().loss(), 0.5);
  EXPECT_DOUBLE_EQ(with_progress.metrics().samples_per_second(), 80);

  const v1::ReportRequest good =
      FinalReport(Rank(0, 1, {"/bin/true"}), ProgramOutcome{}, "/bin/true");
  EXPECT_TRUE(good.success());
  EXPECT_EQ(good.error(), "");
}

TEST(ProcStateTest, SeesAStoppedChildAndItsHandlers) {
  const pid_t child = fork();
  if (child == 0) {
    execl("/bin/bash", "bash", "-c", "trap 'exit 0' USR1; while :; do sleep 0.05; done", nullptr);
    _exit(127);
  }
  // bash installs its trap right after it starts.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!CatchesSignal(child, SIGUSR1) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(CatchesSignal(child, SIGUSR1));
  EXPECT_FALSE(CatchesSignal(child, SIGUSR2));
  EXPECT_FALSE(IsProcessStopped(child));
  kill(child, SIGSTOP);
  bool stopped = false;
  for (int i = 0; i < 500 && !stopped; ++i) {
    stopped = IsProcessStopped(child);
    if (!stopped) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(stopped);
  kill(child, SIGCONT);
  bool running = false;
  for (int i = 0; i < 500 && !running; ++i) {
    running = !IsProcessStopped(child);
    if (!running) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(running);
  kill(child, SIGKILL);
  int status;
  waitpid(child, &status, 0);
  EXPECT_FALSE(IsProcessStopped(child)) << "a reaped process is not stopped";
}

// A supervisor of one rank against a fake coordinator, running bash scripts.
class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::RankService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                         grpc::InsecureChannelCredentials()));
    dir_ = TestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { server_->Shutdown(); }

  ProgramSupervisor::Options Options(const std::string& script) {
    ProgramSupervisor::Options options;
    options.rank = Rank(0, 1, {"/bin/bash", "-c", script});
    options.rank.joined.mutable_spec()->mutable_program()->set_working_dir(dir_);
    options.store = &store_;
    options.ranks = stub_.get();
    options.join_file_dir = dir_;
    options.heartbeat_interval = absl::Milliseconds(50);
    options.report_deadline = absl::Seconds(10);
    return options;
  }

  FakeRankService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::RankService::Stub> stub_;
  MemoryStore store_;
  std::string dir_;
};

TEST_F(SupervisorTest, RunsTheProgramWithItsEnvironmentAndReportsItsExitCode) {
  ProgramSupervisor::Options options = Options(
      "env > env.txt; cp \"$CHORUS_JOIN_FILE\" join.pb; pwd > pwd.txt; "
      "echo 'some output'; exit 3");
  options.rank.joined.set_world_size(1);
  (*options.rank.joined.mutable_spec()->mutable_program()->mutable_env())["SEED"] = "11";
  ProgramSupervisor supervisor(options);
  absl::StatusOr<ProgramOutcome> outcome = supervisor.Run();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_FALSE(outcome->signaled);
  EXPECT_EQ(outcome->exit_code, 3);
  EXPECT_EQ(outcome->ExitCode(), 3);

  const std::map<std::string, std::string> env = ParseEnv(ReadFile(dir_ + "/env.txt"));
  EXPECT_EQ(env.at("RANK"), "0");
  EXPECT_EQ(env.at("WORLD_SIZE"), "1");
  EXPECT_EQ(env.at("SEED"), "11");
  EXPECT_EQ(env.at("MASTER_ADDR"), "127.0.0.1");
  EXPECT_GT(std::stoi(env.at("MASTER_PORT")), 0);
  EXPECT_EQ(env.at("CHORUS_JOB_ID"), "job-000007");
  EXPECT_TRUE(env.count("CHORUS_PROGRESS_FD"));
  EXPECT_EQ(ReadFile(dir_ + "/pwd.txt"), dir_ + "\n") << "started in program.working_dir";
  absl::StatusOr<std::string> published = store_.Get(kMasterAddressKey, absl::Now());
  ASSERT_TRUE(published.ok());
  EXPECT_EQ(*published, "127.0.0.1:" + env.at("MASTER_PORT"));

  v1::JoinResponse joined;
  ASSERT_TRUE(joined.ParseFromString(ReadFile(dir_ + "/join.pb")));
  EXPECT_EQ(joined.store_namespace(), "job-000007/gen-1");
  EXPECT_EQ(joined.spec().program().argv(0), "/bin/bash");
  EXPECT_NE(::access(env.at("CHORUS_JOIN_FILE").c_str(), F_OK), 0) << "removed at exit";

  const std::vector<v1::ReportRequest> reports = service_.reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].final());
  EXPECT_FALSE(reports[0].success());
  EXPECT_THAT(reports[0].error(), HasSubstr("the program /bin/bash (pid "));
  EXPECT_THAT(reports[0].error(), HasSubstr(") exited with code 3"));
}

TEST_F(SupervisorTest, HeartbeatsCarryTheProgramsProgressAndStopWhileItIsStopped) {
  // One progress record (step 7 in phase FORWARD), then the program stops
  // itself; the test continues it once it has seen the silence.
  ProgramSupervisor::Options options = Options(
      "printf 'P\\040\\007\\060\\003' >&$CHORUS_PROGRESS_FD; sleep 0.3; kill -STOP $$; exit 0");
  ProgramSupervisor supervisor(options);
  absl::StatusOr<ProgramOutcome> outcome;
  std::thread run([&] { outcome = supervisor.Run(); });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  bool stopped = false;
  while (!stopped && absl::Now() < deadline) {
    const pid_t pid = supervisor.child_pid();
    stopped = pid > 0 && IsProcessStopped(pid);
    if (!stopped) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(stopped);
  absl::SleepFor(absl::Milliseconds(150));  // a heartbeat composed before the stop lands
  const size_t while_stopped = service_.heartbeats().size();
  absl::SleepFor(absl::Milliseconds(500));  // 10 intervals
  EXPECT_EQ(service_.heartbeats().size(), while_stopped) << "no heartbeat while stopped";
  kill(supervisor.child_pid(), SIGCONT);
  run.join();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->ok());

  const std::vector<v1::RankHeartbeat> heartbeats = service_.heartbeats();
  ASSERT_FALSE(heartbeats.empty());
  EXPECT_EQ(heartbeats.back().job_id(), "job-000007");
  EXPECT_EQ(heartbeats.back().generation(), 1);
  EXPECT_GT(heartbeats.back().time_us(), 0);
  EXPECT_EQ(heartbeats.back().step(), 7) << "the program's record";
  EXPECT_EQ(heartbeats.back().phase(), v1::FORWARD);
  const std::vector<v1::ReportRequest> reports = service_.reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].success());
}

TEST_F(SupervisorTest, PassesATerminateRequestOnAndReportsTheSignal) {
  std::atomic<int64_t> terminate{0};
  ProgramSupervisor::Options options = Options("touch started; while :; do sleep 0.05; done");
  options.terminate_requests = &terminate;
  ProgramSupervisor supervisor(options);
  absl::StatusOr<ProgramOutcome> outcome;
  std::thread run([&] { outcome = supervisor.Run(); });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (::access((dir_ + "/started").c_str(), F_OK) != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  terminate.fetch_add(1);  // what the SIGTERM handler does
  run.join();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->signaled);
  EXPECT_EQ(outcome->signal, SIGTERM);
  EXPECT_EQ(outcome->ExitCode(), 128 + SIGTERM);
  const std::vector<v1::ReportRequest> reports = service_.reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_THAT(reports[0].error(), HasSubstr("was killed by signal 15"));
}

TEST_F(SupervisorTest, AProgramThatCannotStartFailsWithAReport) {
  ProgramSupervisor::Options options = Options("");
  options.rank.joined.mutable_spec()->mutable_program()->set_argv(0, dir_ + "/missing");
  ProgramSupervisor supervisor(options);
  absl::StatusOr<ProgramOutcome> outcome = supervisor.Run();
  ASSERT_FALSE(outcome.ok());
  EXPECT_THAT(outcome.status().message(),
              HasSubstr("program.argv[0]: cannot execute " + dir_ + "/missing"));
  const std::vector<v1::ReportRequest> reports = service_.reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_FALSE(reports[0].success());
  EXPECT_THAT(reports[0].error(), HasSubstr("cannot execute"));
}

}  // namespace
}  // namespace chorus

namespace chorus {
namespace {

TEST_F(SupervisorTest, FollowsTheGenerationAnElasticProgramJoinedAndPassesDirectivesOn) {
  // The program waits for one directive (dd reads one message), keeps its
  // bytes, then says it is rank 2 of generation 3 at step 7 and exits 0.
  ProgramSupervisor::Options options = Options(
      "dd bs=65536 count=1 <&$CHORUS_PROGRESS_FD > directive.bin 2>/dev/null; "
      "printf 'P\\020\\003\\030\\002\\040\\007' >&$CHORUS_PROGRESS_FD; sleep 0.3; exit 0");
  v1::Directive reform;
  reform.set_kind(v1::Directive::REFORM_AT_STEP_BOUNDARY);
  reform.set_generation(3);
  reform.set_reason("agent a-1 was drained");
  service_.SendDirective(reform);
  ProgramSupervisor supervisor(options);
  absl::StatusOr<ProgramOutcome> outcome = supervisor.Run();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->ok());

  const std::string bytes = ReadFile(dir_ + "/directive.bin");
  ASSERT_FALSE(bytes.empty()) << "the directive reached the program";
  EXPECT_EQ(bytes[0], 'D');
  v1::Directive got;
  ASSERT_TRUE(got.ParseFromString(bytes.substr(1)));
  EXPECT_EQ(got.kind(), v1::Directive::REFORM_AT_STEP_BOUNDARY);
  EXPECT_EQ(got.generation(), 3);

  const std::vector<v1::RankHeartbeat> heartbeats = service_.heartbeats();
  ASSERT_FALSE(heartbeats.empty());
  EXPECT_EQ(heartbeats.front().generation(), 1) << "before the program joined another";
  EXPECT_EQ(heartbeats.back().generation(), 3);
  EXPECT_EQ(heartbeats.back().rank(), 2);
  EXPECT_EQ(heartbeats.back().step(), 7);
  const std::vector<v1::ReportRequest> reports = service_.reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].success());
  EXPECT_EQ(reports[0].generation(), 3) << "the final report is the newest membership's";
  EXPECT_EQ(reports[0].rank(), 2);
}

// Note [Staged growth] in coordinator/scheduling/staged_growth.h: a newcomer
// answered before its generation formed starts its program at once (no rank
// 0 publishes a master address for it), and its heartbeats and final report
// follow the rank its program joined as, not the planned one.
TEST_F(SupervisorTest, AStagedNewcomerStartsItsProgramAtOnceAndFollowsTheRankItJoinedAs) {
  ProgramSupervisor::Options options = Options(
      "env > env.txt; printf 'P\\020\\001\\030\\003\\040\\005' >&$CHORUS_PROGRESS_FD; "
      "sleep 0.3; exit 0");
  options.rank.joined.set_rank(1);
  options.rank.joined.set_world_size(2);
  options.rank.joined.set_staged(true);
  options.master_wait = absl::Seconds(30);
  const absl::Time start = absl::Now();
  ProgramSupervisor supervisor(options);
  absl::StatusOr<ProgramOutcome> outcome = supervisor.Run();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "it waited for a master address";
  const std::map<std::string, std::string> env = ParseEnv(ReadFile(dir_ + "/env.txt"));
  EXPECT_EQ(env.at("RANK"), "1") << "the planned rank";
  EXPECT_EQ(env.count("MASTER_ADDR"), 0u);
  EXPECT_EQ(env.count("MASTER_PORT"), 0u);
  const std::vector<v1::RankHeartbeat> heartbeats = service_.heartbeats();
  ASSERT_FALSE(heartbeats.empty());
  EXPECT_EQ(heartbeats.back().generation(), 1);
  EXPECT_EQ(heartbeats.back().rank(), 3) << "the program's own rank";
  EXPECT_EQ(heartbeats.back().step(), 5);
  const std::vector<v1::ReportRequest> reports = service_.reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].rank(), 3);
}

TEST_F(SupervisorTest, AProgramThatLeftTheJobGetsNoFinalReport) {
  // left_job (field 13, varint 1), then exit 0.
  ProgramSupervisor::Options options =
      Options("printf 'P\\040\\011\\150\\001' >&$CHORUS_PROGRESS_FD; sleep 0.3; exit 0");
  ProgramSupervisor supervisor(options);
  absl::StatusOr<ProgramOutcome> outcome = supervisor.Run();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->ok());
  EXPECT_TRUE(service_.reports().empty());
  for (const v1::RankHeartbeat& hb : service_.heartbeats()) {
    EXPECT_FALSE(hb.left_job()) << "the marker stays between program and supervisor";
  }
}

}  // namespace
}  // namespace chorus
