// Agents and ranks end to end over gRPC: a simulated node agent connects, a
// job is placed on it, its ranks join, exit, and the job ends.
#include "coordinator/agent_service.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "coordinator/coordinator_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

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

TEST_F(AgentServiceTest, LosingTheAgentFailsItsJob) {
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
  ASSERT_TRUE(WaitForState(job, v1::Job::FAILED));
  v1::Job failed;
  StateOf(job, &failed);
  EXPECT_THAT(failed.reason(), HasSubstr("lost contact with the agent on doomed-node"));
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

}  // namespace
}  // namespace chorus
