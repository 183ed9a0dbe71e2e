// Agents and ranks end to end over gRPC: a simulated node agent connects, a
// job is placed on it, its ranks join, exit, and the job ends.
#include "coordinator/service/agent_service.h"

#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/job_spec.h"
#include "common/join_answers.h"
#include "coordinator/service/coordinator_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class AgentServiceTest : public CoordinatorFixture {};

TEST_F(AgentServiceTest, JobIsPlacedJoinedAndSucceeds) {
  grpc::ClientContext agent_context;
  auto stream = agents_->Connect(&agent_context);
  v1::AgentMessage hello;
  hello.mutable_hello()->set_host("sim-node");
  hello.mutable_hello()->set_slots(2);
  ASSERT_TRUE(stream->Write(hello));
  v1::CoordinatorMessage message;
  ASSERT_TRUE(stream->Read(&message));
  ASSERT_TRUE(message.has_welcome());
  const std::string agent_id = message.welcome().agent_id();

  const std::string job = Submit(2);
  ASSERT_TRUE(stream->Read(&message));
  ASSERT_TRUE(message.has_launch());
  EXPECT_EQ(message.launch().job_id(), job);
  EXPECT_EQ(message.launch().ranks_size(), 2);
  EXPECT_EQ(message.launch().coordinator(), server_->address());
  EXPECT_EQ(StateOf(job), v1::Job::RUNNING);

  std::vector<grpc::Status> statuses;
  std::vector<v1::JoinResponse> joined = JoinAll(job, agent_id, 2, &statuses);
  for (int slot = 0; slot < 2; ++slot) {
    ASSERT_TRUE(statuses[slot].ok()) << statuses[slot].error_message();
    EXPECT_EQ(joined[slot].rank(), slot);
    EXPECT_EQ(joined[slot].world_size(), 2);
    EXPECT_EQ(joined[slot].store_namespace(), job + "/gen-1");
  }

  v1::GetJobStatusRequest status_request;
  status_request.set_job_id(job);
  v1::JobStatus status;
  grpc::ClientContext status_context;
  ASSERT_TRUE(jobs_->GetJobStatus(&status_context, status_request, &status).ok());
  ASSERT_EQ(status.ranks_size(), 2);
  EXPECT_EQ(status.ranks(1).host(), "sim-node");
  EXPECT_EQ(status.ranks(1).pid(), 1001);
  EXPECT_EQ(status.ranks(1).state(), v1::RankStatus::TRAINING);

  for (int slot = 0; slot < 2; ++slot) {
    v1::AgentMessage exited;
    exited.mutable_rank_exited()->set_job_id(job);
    exited.mutable_rank_exited()->set_slot(slot);
    exited.mutable_rank_exited()->set_exit_code(0);
    ASSERT_TRUE(stream->Write(exited));
  }
  EXPECT_TRUE(WaitForState(job, v1::Job::SUCCEEDED));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// Note [Aggregated heartbeats] over the agent's stream: the ranks' progress
// in one message, and a directive for them back on the same stream.
TEST_F(AgentServiceTest, AnAgentSendsItsRanksHeartbeatsInOneMessageAndGetsTheirDirectives) {
  grpc::ClientContext agent_context;
  auto stream = agents_->Connect(&agent_context);
  const std::string agent_id = ConnectAgent(*stream, 2);
  const std::string job = Submit(2);
  v1::CoordinatorMessage message;
  ASSERT_TRUE(stream->Read(&message));
  ASSERT_TRUE(message.has_launch());
  std::vector<grpc::Status> statuses;
  JoinAll(job, agent_id, 2, &statuses);
  v1::AgentMessage heartbeats;
  for (int rank = 0; rank < 2; ++rank) {
    v1::RankHeartbeat& hb = *heartbeats.mutable_heartbeats()->add_heartbeats();
    hb.set_job_id(job);
    hb.set_generation(1);
    hb.set_rank(rank);
    hb.set_step(30 + rank);
    hb.set_phase(v1::BACKWARD);
  }
  ASSERT_TRUE(stream->Write(heartbeats));
  v1::JobStatus status;
  for (int i = 0; i < 100 && (status.ranks_size() < 2 || status.ranks(1).step() != 31); ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    v1::GetJobStatusRequest request;
    request.set_job_id(job);
    grpc::ClientContext context;
    status.Clear();
    ASSERT_TRUE(jobs_->GetJobStatus(&context, request, &status).ok());
  }
  ASSERT_EQ(status.ranks_size(), 2);
  EXPECT_EQ(status.ranks(0).step(), 30);
  EXPECT_EQ(status.ranks(1).step(), 31);
  EXPECT_EQ(status.ranks(1).phase(), v1::BACKWARD);
  EXPECT_EQ(status.rank_summary().ranks(), 2);
  EXPECT_TRUE(status.job().placements().empty()) << "a running job's rows say where ranks run";

  v1::CancelJobRequest cancel;
  cancel.set_job_id(job);
  v1::CancelJobResponse cancelled;
  grpc::ClientContext cancel_context;
  ASSERT_TRUE(jobs_->CancelJob(&cancel_context, cancel, &cancelled).ok());
  ASSERT_TRUE(stream->Read(&message));
  ASSERT_TRUE(message.has_stop()) << message.DebugString();
  ASSERT_TRUE(stream->Write(heartbeats));  // the ranks have not stopped yet
  ASSERT_TRUE(stream->Read(&message));
  ASSERT_TRUE(message.has_directives()) << message.DebugString();
  ASSERT_EQ(message.directives().entries_size(), 2);
  EXPECT_EQ(message.directives().entries(1).rank(), 1);
  EXPECT_EQ(message.directives().entries(1).directive().kind(), v1::Directive::ABORT);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// Note [Joins through the agent] over the agent's stream: its ranks' joins
// in one message, every answer back in one.
TEST_F(AgentServiceTest, AnAgentSendsItsRanksJoinsInOneMessageAndGetsTheAnswersInOne) {
  grpc::ClientContext agent_context;
  auto stream = agents_->Connect(&agent_context);
  const std::string agent_id = ConnectAgent(*stream, 2);
  const std::string job = Submit(2);
  v1::CoordinatorMessage message;
  ASSERT_TRUE(stream->Read(&message));
  ASSERT_TRUE(message.has_launch());
  v1::AgentMessage joins;
  for (int slot = 0; slot < 2; ++slot) {
    v1::JoinRequest& join = *joins.mutable_joins()->add_joins();
    join.set_job_id(job);
    join.set_generation(1);
    join.set_slot(slot);
    join.set_pid(2000 + slot);
  }
  ASSERT_TRUE(stream->Write(joins));
  ASSERT_TRUE(stream->Read(&message));
  ASSERT_TRUE(message.has_joined()) << message.DebugString();
  const v1::RankJoinAnswers& answers = message.joined();
  ASSERT_EQ(answers.entries_size(), 2);
  EXPECT_EQ(answers.shared_size(), 1);
  for (const v1::RankJoinAnswers::Entry& entry : answers.entries()) {
    absl::StatusOr<v1::JoinResponse> joined = JoinAnswerFor(answers, entry);
    ASSERT_TRUE(joined.ok()) << joined.status();
    EXPECT_EQ(joined->rank(), entry.slot());
    EXPECT_EQ(joined->world_size(), 2);
    EXPECT_EQ(joined->store_namespace(), job + "/gen-1");
  }
  v1::GetJobStatusRequest request;
  request.set_job_id(job);
  v1::JobStatus status;
  grpc::ClientContext status_context;
  ASSERT_TRUE(jobs_->GetJobStatus(&status_context, request, &status).ok());
  ASSERT_EQ(status.ranks_size(), 2);
  EXPECT_EQ(status.ranks(1).pid(), 2001);
  EXPECT_EQ(status.ranks(1).state(), v1::RankStatus::TRAINING);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// Note [Agent reconnect grace] in running_job.h: a job that is not elastic
// waits --agent_reconnect_grace_seconds for its agent to come back, then
// fails naming it; with 0 it fails as soon as the stream ends.
class LostAgentTest : public AgentServiceTest,
                      public ::testing::WithParamInterface<absl::Duration> {
 protected:
  void Configure(ServerOptions& options) override { options.agent_reconnect_grace = GetParam(); }
};

TEST_P(LostAgentTest, LosingTheAgentFailsItsJob) {
  auto context = std::make_unique<grpc::ClientContext>();
  auto stream = agents_->Connect(context.get());
  v1::AgentMessage hello;
  hello.mutable_hello()->set_host("doomed-node");
  hello.mutable_hello()->set_slots(1);
  ASSERT_TRUE(stream->Write(hello));
  v1::CoordinatorMessage message;
  ASSERT_TRUE(stream->Read(&message));
  const std::string job = Submit(1);
  ASSERT_TRUE(stream->Read(&message));
  ASSERT_TRUE(message.has_launch());
  context->TryCancel();  // the node disappears
  stream->Finish();
  const absl::Time lost = absl::Now();
  ASSERT_TRUE(WaitForState(job, v1::Job::FAILED));
  EXPECT_GE(absl::Now() - lost, GetParam()) << "failed before the grace was over";
  v1::Job failed;
  StateOf(job, &failed);
  EXPECT_THAT(failed.reason(), HasSubstr("lost contact with the agent on doomed-node"));
  if (GetParam() > absl::ZeroDuration()) {
    EXPECT_THAT(failed.reason(), HasSubstr("; 1 of 1 rank(s) did not come back within 1s"));
  }
}

INSTANTIATE_TEST_SUITE_P(Grace, LostAgentTest,
                         ::testing::Values(absl::ZeroDuration(), absl::Seconds(1)));

// Note [A stopping coordinator keeps its agents]: a coordinator stopped with
// SIGTERM ends its agents' streams itself; that is no loss of the agents, and
// the coordinator started again on the same state finds the job running.
TEST_F(AgentServiceTest, AStoppingCoordinatorLeavesTheJobsOfItsAgentsRunning) {
  grpc::ClientContext context;
  auto stream = agents_->Connect(&context);
  ConnectAgent(*stream, 1);
  const std::string job = Submit(1);
  v1::CoordinatorMessage message;
  ASSERT_TRUE(stream->Read(&message));
  ASSERT_TRUE(message.has_launch());
  ASSERT_EQ(StateOf(job), v1::Job::RUNNING);

  server_->Shutdown(absl::ZeroDuration());
  server_->Wait();
  EXPECT_FALSE(stream->Read(&message));  // the coordinator ended the stream
  stream->Finish();
  server_.reset();

  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = server_dir_;
  auto restarted = CoordinatorServer::Start(options);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  server_ = std::move(*restarted);
  channel_ = MakeCoordinatorChannel(server_->address());
  jobs_ = v1::JobService::NewStub(channel_);
  v1::Job taken_back;
  EXPECT_EQ(StateOf(job, &taken_back), v1::Job::RUNNING) << taken_back.reason();
  EXPECT_THAT(taken_back.reason(), Not(HasSubstr("lost contact")));
}

TEST_F(AgentServiceTest, FirstMessageMustBeAHello) {
  grpc::ClientContext context;
  auto stream = agents_->Connect(&context);
  v1::AgentMessage ping;
  ping.set_ping_time_us(1);
  ASSERT_TRUE(stream->Write(ping));
  v1::CoordinatorMessage message;
  EXPECT_FALSE(stream->Read(&message));
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("must be a hello"));
}

TEST_F(AgentServiceTest, JoinOfAnUnknownJobAndAStaleGeneration) {
  v1::JoinRequest request;
  request.set_job_id("job-000404");
  request.set_generation(1);
  v1::JoinResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(ranks_->Join(&context, request, &response).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(AgentServiceTest, WatchStreamsStatesMetricsAndEndsWithTheJobAndLogsAreKeptPerRank) {
  grpc::ClientContext agent_context;
  auto stream = agents_->Connect(&agent_context);
  const std::string agent_id = ConnectAgent(*stream, 2);
  const std::string job = Submit(2);
  v1::CoordinatorMessage launch;
  ASSERT_TRUE(stream->Read(&launch));
  ASSERT_TRUE(launch.has_launch());

  // A watcher from the start, reading until the server ends the stream.
  std::vector<v1::JobEvent> events;
  grpc::Status watch_status;
  std::thread watcher([&] {
    v1::WatchJobRequest request;
    request.set_job_id(job);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = jobs_->WatchJob(&context, request);
    v1::JobEvent event;
    while (reader->Read(&event)) events.push_back(event);
    watch_status = reader->Finish();
  });

  // Ranks are numbered at placement, so output from before the join already
  // carries the slot's rank.
  v1::AgentMessage early;
  early.mutable_logs()->set_job_id(job);
  early.mutable_logs()->set_slot(1);
  early.mutable_logs()->add_lines("slot 1 starting");
  ASSERT_TRUE(stream->Write(early));
  std::vector<grpc::Status> statuses;
  JoinAll(job, agent_id, 2, &statuses);
  for (const grpc::Status& s : statuses) ASSERT_TRUE(s.ok()) << s.error_message();
  for (int slot = 0; slot < 2; ++slot) {
    v1::AgentMessage logs;
    logs.mutable_logs()->set_job_id(job);
    logs.mutable_logs()->set_slot(slot);
    logs.mutable_logs()->add_lines(absl::StrCat("rank ", slot, " line 1"));
    logs.mutable_logs()->add_lines(absl::StrCat("rank ", slot, " line 2"));
    ASSERT_TRUE(stream->Write(logs));
  }

  v1::ReportRequest report;
  report.set_job_id(job);
  report.set_generation(1);
  report.set_rank(0);
  report.mutable_metrics()->set_step(10);
  report.mutable_metrics()->set_loss(0.25);
  v1::ReportResponse report_response;
  grpc::ClientContext report_context;
  ASSERT_TRUE(ranks_->Report(&report_context, report, &report_response).ok());

  for (int slot = 0; slot < 2; ++slot) {
    v1::AgentMessage exited;
    exited.mutable_rank_exited()->set_job_id(job);
    exited.mutable_rank_exited()->set_slot(slot);
    ASSERT_TRUE(stream->Write(exited));
  }
  ASSERT_TRUE(WaitForState(job, v1::Job::SUCCEEDED));
  watcher.join();

  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
  std::vector<std::string> kinds;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].seq(), static_cast<int64_t>(i + 1))
        << "events arrive in order, none missing";
    EXPECT_EQ(events[i].job_id(), job);
    kinds.push_back(events[i].has_metrics() ? "metrics" : v1::Job::State_Name(events[i].state()));
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"PENDING", "RUNNING", "metrics", "SUCCEEDED"}));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2].metrics().step(), 10);
  EXPECT_EQ(events[3].reason(), "every rank exited with code 0");

  // Watching an ended job from the middle replays the rest and ends at once.
  {
    v1::WatchJobRequest request;
    request.set_job_id(job);
    request.set_after_seq(2);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = jobs_->WatchJob(&context, request);
    v1::JobEvent event;
    std::vector<int64_t> seqs;
    while (reader->Read(&event)) seqs.push_back(event.seq());
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(seqs, (std::vector<int64_t>{3, 4}));
  }
  {
    v1::WatchJobRequest request;
    request.set_job_id("job-999999");
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = jobs_->WatchJob(&context, request);
    v1::JobEvent event;
    EXPECT_FALSE(reader->Read(&event));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }

  v1::GetLogsRequest logs_request;
  logs_request.set_job_id(job);
  v1::GetLogsResponse logs;
  grpc::ClientContext logs_context;
  ASSERT_TRUE(jobs_->GetLogs(&logs_context, logs_request, &logs).ok());
  ASSERT_EQ(logs.lines_size(), 5);
  EXPECT_EQ(logs.lines(0).text(), "slot 1 starting");
  EXPECT_EQ(logs.lines(0).rank(), 1);
  EXPECT_EQ(logs.lines(0).slot(), 1);
  EXPECT_EQ(logs.lines(3).text(), "rank 1 line 1");
  EXPECT_EQ(logs.lines(3).rank(), 1);
  EXPECT_EQ(logs.lines(3).agent_id(), agent_id);
  EXPECT_TRUE(logs.complete()) << "the job ended and no rank is running";
  logs_request.set_rank(0);
  grpc::ClientContext rank_context;
  ASSERT_TRUE(jobs_->GetLogs(&rank_context, logs_request, &logs).ok());
  ASSERT_EQ(logs.lines_size(), 2);
  EXPECT_EQ(logs.lines(1).text(), "rank 0 line 2");
  logs_request.set_job_id("job-999999");
  grpc::ClientContext unknown_context;
  EXPECT_EQ(jobs_->GetLogs(&unknown_context, logs_request, &logs).error_code(),
            grpc::StatusCode::NOT_FOUND);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// A coordinator with tokens: Note [Job credentials] end to end.
class JobCredentialTest : public CoordinatorFixture {
 protected:
  static constexpr char kAdmin[] = "admin-token-0123456789";
  static constexpr char kWorker[] = "worker-token-0123456789";

  void Configure(ServerOptions& options) override {
    const std::string tokens = options.state_dir + ".tokens";
    std::ofstream(tokens) << "admin " << kAdmin << "\nworker " << kWorker << "\n";
    ASSERT_EQ(::chmod(tokens.c_str(), 0600), 0);
    options.token_file = tokens;
  }

  // A context that presents `token`.
  static std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    context->AddMetadata("authorization", "Bearer " + token);
    return context;
  }

  // Submits a one-rank job as the admin; returns its id.
  std::string SubmitOneRank() {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = *ParseJobSpec(
        "model { mlp {} } data { synthetic {} } resources { min_ranks: 1 max_ranks: 1 }",
        SpecFormat::kTextProto, "test");
    v1::SubmitJobResponse response;
    grpc::Status s = jobs_->SubmitJob(As(kAdmin).get(), request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.job_id();
  }

  grpc::Status Join(const std::string& token, const std::string& job, const std::string& agent,
                    const v1::LaunchRanks& launch) {
    v1::JoinRequest request;
    request.set_job_id(job);
    request.set_generation(launch.generation());
    request.set_agent_id(agent);
    request.set_slot(launch.ranks(0).slot());
    request.set_pid(4242);
    v1::JoinResponse response;
    return ranks_->Join(As(token).get(), request, &response);
  }
};

TEST_F(JobCredentialTest, EachLaunchCarriesItsJobsCredentialWhichReachesThatJobOnly) {
  agent_context_.AddMetadata("authorization", std::string("Bearer ") + kWorker);
  agent_stream_ = agents_->Connect(&agent_context_);
  const std::string agent = ConnectAgent(*agent_stream_, 2);
  const std::string job1 = SubmitOneRank();
  v1::CoordinatorMessage launch1;
  ASSERT_TRUE(agent_stream_->Read(&launch1));
  const std::string job2 = SubmitOneRank();
  v1::CoordinatorMessage launch2;
  ASSERT_TRUE(agent_stream_->Read(&launch2));
  ASSERT_EQ(launch1.launch().job_id(), job1);
  const std::string credential = launch1.launch().credential();
  EXPECT_THAT(credential, HasSubstr(job1));
  EXPECT_NE(credential, launch2.launch().credential());
  EXPECT_THAT(credential, ::testing::Not(HasSubstr(kWorker)));

  // RankService: its own job only; the refusal names both jobs.
  grpc::Status other = Join(credential, job2, agent, launch2.launch());
  EXPECT_EQ(other.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(other.error_message(),
            absl::StrCat("the credential of job ", job1, " may not join for job ", job2,
                         ": a job's ranks may reach only their own job"));
  grpc::Status own = Join(credential, job1, agent, launch1.launch());
  EXPECT_TRUE(own.ok()) << own.error_message();
  v1::ReportRequest report;
  report.set_job_id(job2);
  v1::ReportResponse reported;
  EXPECT_EQ(ranks_->Report(As(credential).get(), report, &reported).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  {
    auto context = As(credential);
    auto heartbeats = ranks_->Heartbeat(context.get());
    v1::RankHeartbeat beat;
    beat.set_job_id(job2);
    heartbeats->Write(beat);
    heartbeats->WritesDone();
    v1::Directive directive;
    EXPECT_FALSE(heartbeats->Read(&directive));
    grpc::Status s = heartbeats->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), HasSubstr("may not send heartbeats for job " + job2));
  }

  // StoreService: its own job's namespaces only.
  auto store = v1::StoreService::NewStub(channel_);
  v1::StoreSetRequest set;
  set.set_key("k");
  set.set_value("v");
  v1::StoreSetResponse set_response;
  set.set_ns(job2 + "/gen-1");
  grpc::Status foreign_store = store->Set(As(credential).get(), set, &set_response);
  EXPECT_EQ(foreign_store.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(foreign_store.error_message(),
              HasSubstr("may not use the key-value store for job " + job2));
  set.set_ns(job1 + "/gen-1");
  grpc::Status own_store = store->Set(As(credential).get(), set, &set_response);
  EXPECT_TRUE(own_store.ok()) << own_store.error_message();

  // Nothing of AgentService or JobService.
  {
    auto context = As(credential);
    auto fake_agent = agents_->Connect(context.get());
    v1::AgentMessage hello;
    hello.mutable_hello()->set_slots(8);
    fake_agent->Write(hello);
    fake_agent->WritesDone();
    v1::CoordinatorMessage message;
    EXPECT_FALSE(fake_agent->Read(&message));
    grpc::Status s = fake_agent->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), HasSubstr("needs an agent or admin token"));
    EXPECT_THAT(s.error_message(), HasSubstr("credential of job " + job1));
  }
  v1::ListJobsResponse listed;
  grpc::Status list = jobs_->ListJobs(As(credential).get(), v1::ListJobsRequest(), &listed);
  EXPECT_EQ(list.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(list.error_message(), HasSubstr("needs a user or admin token"));
}

// Note [Rank accounts] (worker/agent/rank_accounts.h): a launch names the
// Unix account the token file maps its job's owner to, and none otherwise.
class UnixAccountTest : public JobCredentialTest {
 protected:
  static constexpr char kAlice[] = "alice-token-0123456789";
  static constexpr char kBob[] = "bob-token-0123456789";

  void Configure(ServerOptions& options) override {
    const std::string tokens = options.state_dir + ".tokens";
    std::ofstream(tokens) << "admin " << kAdmin << "\nworker " << kWorker << "\nuser " << kAlice
                          << " alice unix=chorus_alice\nuser " << kBob << " bob\n";
    ASSERT_EQ(::chmod(tokens.c_str(), 0600), 0);
    options.token_file = tokens;
  }

  // Submits a one-rank job as the user of `token`; returns its launch.
  v1::LaunchRanks SubmitAndLaunch(const std::string& token) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = *ParseJobSpec(
        "model { mlp {} } data { synthetic {} } resources { min_ranks: 1 max_ranks: 1 }",
        SpecFormat::kTextProto, "test");
    v1::SubmitJobResponse response;
    grpc::Status s = jobs_->SubmitJob(As(token).get(), request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    v1::CoordinatorMessage launch;
    EXPECT_TRUE(agent_stream_->Read(&launch));
    EXPECT_EQ(launch.launch().job_id(), response.job_id());
    return launch.launch();
  }
};

TEST_F(UnixAccountTest, ALaunchNamesTheAccountItsOwnerMapsToAndNoneForOthers) {
  agent_context_.AddMetadata("authorization", std::string("Bearer ") + kWorker);
  agent_stream_ = agents_->Connect(&agent_context_);
  ConnectAgent(*agent_stream_, 3);
  EXPECT_EQ(SubmitAndLaunch(kAlice).unix_account(), "chorus_alice");
  EXPECT_EQ(SubmitAndLaunch(kBob).unix_account(), "");
  EXPECT_EQ(SubmitAndLaunch(kAdmin).unix_account(), "");
}

}  // namespace
}  // namespace chorus
