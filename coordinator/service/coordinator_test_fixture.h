// CoordinatorFixture: a real coordinator on 127.0.0.1:0 (its own state
// directory under TEST_TMPDIR per test), gRPC stubs to it, and helpers that
// play a node agent and its ranks: connect an agent, submit a job, join its
// ranks. For tests of the coordinator's gRPC services end to end.
//
// Thread-safety: one test thread; JoinAll runs its joins on threads it joins.
//
// Example:
//   class MyServiceTest : public CoordinatorFixture {};
//   TEST_F(MyServiceTest, Works) { const std::string job = JoinedTwoRankJob(); ... }
#ifndef CHORUS_COORDINATOR_SERVICE_COORDINATOR_TEST_FIXTURE_H_
#define CHORUS_COORDINATOR_SERVICE_COORDINATOR_TEST_FIXTURE_H_

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/grpc_util.h"
#include "common/job_spec.h"
#include "coordinator/service/server.h"
#include "gtest/gtest.h"

namespace chorus {

class CoordinatorFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.state_dir = std::string(std::getenv("TEST_TMPDIR")) + "/coordinator_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    server_dir_ = options.state_dir;
    Configure(options);
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = MakeCoordinatorChannel(server_->address());
    jobs_ = v1::JobService::NewStub(channel_);
    agents_ = v1::AgentService::NewStub(channel_);
    ranks_ = v1::RankService::NewStub(channel_);
  }

  // Tests that need other limits or timeouts change `options` here.
  virtual void Configure(ServerOptions& /*options*/) {}

  std::string Submit(int ranks) {
    auto spec = ParseJobSpec(
        absl::StrCat("model { mlp {} } data { synthetic {} } resources { min_ranks: ", ranks,
                     " max_ranks: ", ranks, " }"),
        SpecFormat::kTextProto, "test");
    v1::SubmitJobRequest request;
    *request.mutable_spec() = *spec;
    v1::SubmitJobResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    EXPECT_TRUE(jobs_->SubmitJob(&context, request, &response).ok());
    return response.job_id();
  }

  v1::Job::State StateOf(const std::string& job_id, v1::Job* out = nullptr) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    EXPECT_TRUE(jobs_->GetJob(&context, request, &job).ok());
    if (out) *out = job;
    return job.state();
  }

  // Polls (bounded) until the job reaches `state`.
  bool WaitForState(const std::string& job_id, v1::Job::State state) {
    for (int i = 0; i < 200; ++i) {
      if (StateOf(job_id) == state) return true;
      absl::SleepFor(absl::Milliseconds(25));
    }
    return false;
  }

  // Joins slots 0..n-1 of `agent_id` to generation 1 of `job` concurrently
  // (as pids 1000+slot).
  std::vector<v1::JoinResponse> JoinAll(const std::string& job, const std::string& agent_id, int n,
                                        std::vector<grpc::Status>* statuses) {
    std::vector<v1::JoinResponse> joined(n);
    statuses->assign(n, grpc::Status());
    std::vector<std::thread> rank_threads;
    for (int slot = 0; slot < n; ++slot) {
      rank_threads.emplace_back([&, slot] {
        v1::JoinRequest request;
        request.set_job_id(job);
        request.set_generation(1);
        request.set_agent_id(agent_id);
        request.set_slot(slot);
        request.set_pid(1000 + slot);
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
        (*statuses)[slot] = ranks_->Join(&context, request, &joined[slot]);
      });
    }
    for (auto& t : rank_threads) t.join();
    return joined;
  }

  // A simulated agent with 2 slots and a 2-rank job placed on it whose
  // ranks joined generation 1; the agent stays connected for the test.
  std::string JoinedTwoRankJob() {
    agent_stream_ = agents_->Connect(&agent_context_);
    const std::string agent_id = ConnectAgent(*agent_stream_, 2);
    const std::string job = Submit(2);
    v1::CoordinatorMessage launch;
    EXPECT_TRUE(agent_stream_->Read(&launch));
    std::vector<grpc::Status> statuses;
    JoinAll(job, agent_id, 2, &statuses);
    return job;
  }

  void TearDown() override {
    if (agent_stream_ != nullptr) agent_stream_->WritesDone();
  }

  // Connects a simulated agent with `slots` slots; returns its id.
  std::string ConnectAgent(
      grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>& stream, int slots) {
    v1::AgentMessage hello;
    hello.mutable_hello()->set_host("sim-node");
    hello.mutable_hello()->set_slots(slots);
    EXPECT_TRUE(stream.Write(hello));
    v1::CoordinatorMessage message;
    EXPECT_TRUE(stream.Read(&message));
    EXPECT_TRUE(message.has_welcome());
    return message.welcome().agent_id();
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::string server_dir_;  // the coordinator's --state_dir
  grpc::ClientContext agent_context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>> agent_stream_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::AgentService::Stub> agents_;
  std::unique_ptr<v1::RankService::Stub> ranks_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SERVICE_COORDINATOR_TEST_FIXTURE_H_
