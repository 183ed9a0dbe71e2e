#include "worker/runtime/join_generation.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/env_names.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/runtime/progress_channel.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

// Answers the first `not_formed` Joins with UNAVAILABLE, then rank 3.
class FormingRankService final : public v1::RankService::Service {
 public:
  explicit FormingRankService(int not_formed) : not_formed_(not_formed) {}
  grpc::Status Join(grpc::ServerContext*, const v1::JoinRequest* request,
                    v1::JoinResponse* response) override {
    absl::MutexLock lock(&mu_);
    if (++calls_ <= not_formed_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "generation 2 is still forming");
    }
    response->set_generation(request->generation());
    response->set_rank(3);
    return grpc::Status::OK;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  const int not_formed_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

class JoinGenerationTest : public ::testing::Test {
 protected:
  void Start(int not_formed) {
    service_ = std::make_unique<FormingRankService>(not_formed);
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::RankService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                         grpc::InsecureChannelCredentials()));
    request_.set_job_id("job-000007");
    request_.set_generation(2);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  std::unique_ptr<FormingRankService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::RankService::Stub> stub_;
  v1::JoinRequest request_;
};

TEST_F(JoinGenerationTest, AGenerationStillFormingIsAskedForAgainUntilItForms) {
  Start(/*not_formed=*/3);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::JoinResponse> joined =
      JoinGeneration(*stub_, request_, absl::Now() + absl::Seconds(30), /*until_formed=*/true);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->rank(), 3);
  EXPECT_EQ(joined->generation(), 2);
  EXPECT_EQ(service_->calls(), 4);
  // Three waits of at least 25, 50 and 100 ms (a Backoff from 50 ms to
  // 200 ms, each wait in the upper half of its ceiling): no busy loop.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(175)) << "the joins were not paced";
}

// Note [A join is asked for again]: a job's first join (not known to be
// elastic) is asked for again on UNAVAILABLE too.
TEST_F(JoinGenerationTest, WithoutUntilFormedUnavailableIsAskedForAgain) {
  Start(/*not_formed=*/2);
  absl::StatusOr<v1::JoinResponse> joined =
      JoinGeneration(*stub_, request_, absl::Now() + absl::Seconds(30), /*until_formed=*/false);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->rank(), 3);
  EXPECT_EQ(service_->calls(), 3);
}

// What ends a job's joins for good is the answer at once, whatever
// `until_formed` says.
TEST_F(JoinGenerationTest, AJobThatIsNotRunningIsTheAnswerAtOnce) {
  class EndedRankService final : public v1::RankService::Service {
   public:
    grpc::Status Join(grpc::ServerContext*, const v1::JoinRequest*,
                      v1::JoinResponse*) override {
      calls.fetch_add(1);
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "job job-000007 is FAILED, not running");
    }
    std::atomic<int> calls{0};
  } ended;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&ended);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = v1::RankService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  for (bool until_formed : {false, true}) {
    absl::StatusOr<v1::JoinResponse> joined =
        JoinGeneration(*stub, request_, absl::Now() + absl::Seconds(30), until_formed);
    EXPECT_EQ(joined.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(joined.status().message(),
              "joining generation 0 of : job job-000007 is FAILED, not running");
  }
  EXPECT_EQ(ended.calls.load(), 2);
  server->Shutdown();
}

TEST_F(JoinGenerationTest, AGenerationThatNeverFormsFailsAtTheDeadline) {
  Start(/*not_formed=*/1000000);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::JoinResponse> joined =
      JoinGeneration(*stub_, request_, absl::Now() + absl::Milliseconds(500), true);
  const absl::Duration took = absl::Now() - start;
  // Also when the deadline cuts its last attempt short (a busy machine:
  // DEADLINE_EXCEEDED from that call), it reports the answer before it.
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kUnavailable) << joined.status();
  EXPECT_THAT(std::string(joined.status().message()), HasSubstr("still forming"));
  // It stops when its next attempt (50-200 ms on) would come after the
  // deadline, so it answers between 200 ms before the deadline and the
  // deadline itself (396 ms was seen on a busy machine).
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(5));
}

// A node agent on the other end of a rank's channel, scripted by the test:
// it waits for the rank's join and answers it with `answer` (its job and
// generation filled in from the join), or closes its end.
class FakeAgent {
 public:
  FakeAgent() {
    absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
    EXPECT_TRUE(pair.ok()) << pair.status();
    rank_end_ = std::make_shared<ProgressSender>(pair->program_fd);
    agent_end_ = std::make_unique<ProgressReceiver>(pair->supervisor_fd);
  }
  ~FakeAgent() {
    if (thread_.joinable()) thread_.join();
  }
  std::shared_ptr<ProgressSender> rank_end() const { return rank_end_; }

  // On its own thread: the first join that comes (bounded), answered.
  void AnswerFirstJoin(v1::AgentJoinAnswer answer) {
    thread_ = std::thread([this, answer = std::move(answer)]() mutable {
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      std::vector<v1::JoinRequest> joins;
      while (joins.empty() && absl::Now() < deadline) {
        agent_end_->Receive(absl::Now() + absl::Milliseconds(20)).IgnoreError();
        joins = agent_end_->TakeJoins();
      }
      if (joins.empty()) return;
      joins_seen_ = joins;
      answer.set_job_id(joins[0].job_id());
      answer.set_asked_generation(joins[0].generation());
      EXPECT_TRUE(agent_end_->SendJoinAnswer(answer).ok());
    });
  }
  void Close() { agent_end_.reset(); }
  // After the answering thread is done.
  std::vector<v1::JoinRequest> joins_seen() {
    if (thread_.joinable()) thread_.join();
    return joins_seen_;
  }

 private:
  std::shared_ptr<ProgressSender> rank_end_;
  std::unique_ptr<ProgressReceiver> agent_end_;
  std::thread thread_;
  std::vector<v1::JoinRequest> joins_seen_;
};

TEST_F(JoinGenerationTest, AJoinGoesThroughTheAgentAndItsAnswerIsTheCoordinators) {
  Start(/*not_formed=*/0);
  FakeAgent agent;
  v1::AgentJoinAnswer answer;
  answer.mutable_response()->set_rank(5);
  answer.mutable_response()->set_generation(2);
  agent.AnswerFirstJoin(answer);
  GenerationJoiner joiner(*stub_, agent.rank_end());
  absl::StatusOr<v1::JoinResponse> joined =
      joiner.Join(request_, absl::Now() + absl::Seconds(10), /*until_formed=*/true);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->rank(), 5);
  EXPECT_EQ(service_->calls(), 0) << "no RankService.Join of its own";
  EXPECT_EQ(joiner.answered_by_agent(), 1);
  std::vector<v1::JoinRequest> seen = agent.joins_seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].job_id(), "job-000007");
  EXPECT_EQ(seen[0].generation(), 2);
}

TEST_F(JoinGenerationTest, TheAgentsErrorIsRetriedLikeTheCoordinatorsAndNamesTheGeneration) {
  Start(/*not_formed=*/0);
  FakeAgent agent;
  v1::AgentJoinAnswer answer;
  answer.set_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
  answer.set_message("job job-000007 has ended");
  agent.AnswerFirstJoin(answer);
  GenerationJoiner joiner(*stub_, agent.rank_end());
  absl::StatusOr<v1::JoinResponse> joined =
      joiner.Join(request_, absl::Now() + absl::Seconds(10), /*until_formed=*/true);
  EXPECT_TRUE(absl::IsFailedPrecondition(joined.status())) << joined.status();
  EXPECT_EQ(joined.status().message(),
            "joining generation 2 of job-000007: job job-000007 has ended");
  EXPECT_EQ(service_->calls(), 0);
}

// chorus-rank's first join (Note [The first join through the agent] in
// worker/rank_main.cc): generation 1 of a job not known to be elastic,
// through the agent; a refusal that ends the job's joins is the answer, not
// asked again nor sent directly.
TEST_F(JoinGenerationTest, AFirstJoinGoesThroughTheAgentAndARefusalIsTheAnswer) {
  Start(/*not_formed=*/0);
  request_.set_generation(1);
  request_.set_starts_program_first(true);
  FakeAgent agent;
  v1::AgentJoinAnswer answer;
  answer.set_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
  answer.set_message("job job-000007 is CANCELLED, not running");
  agent.AnswerFirstJoin(answer);
  GenerationJoiner joiner(*stub_, agent.rank_end());
  absl::StatusOr<v1::JoinResponse> joined =
      joiner.Join(request_, absl::Now() + absl::Seconds(10), /*until_formed=*/false);
  EXPECT_TRUE(absl::IsFailedPrecondition(joined.status())) << joined.status();
  EXPECT_EQ(joined.status().message(),
            "joining generation 1 of job-000007: job job-000007 is CANCELLED, not running");
  EXPECT_EQ(service_->calls(), 0) << "no RankService.Join of its own";
  EXPECT_EQ(joiner.answered_by_agent(), 1);
  std::vector<v1::JoinRequest> seen = agent.joins_seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].generation(), 1);
  EXPECT_TRUE(seen[0].starts_program_first()) << "the request goes to the agent as it is";
}

TEST_F(JoinGenerationTest, WithoutAnAgentChannelTheJoinGoesDirectly) {
  Start(/*not_formed=*/0);
  unsetenv(kEnvAgentJoins);
  FakeAgent agent;
  // An older agent (no CHORUS_AGENT_JOINS): its channel is not for joins.
  EXPECT_EQ(AgentJoinChannel(agent.rank_end()), nullptr);
  setenv(kEnvAgentJoins, "1", 1);
  EXPECT_EQ(AgentJoinChannel(agent.rank_end()), agent.rank_end());
  unsetenv(kEnvAgentJoins);
  GenerationJoiner joiner(*stub_, nullptr);
  absl::StatusOr<v1::JoinResponse> joined =
      joiner.Join(request_, absl::Now() + absl::Seconds(10), /*until_formed=*/true);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->rank(), 3);
  EXPECT_EQ(service_->calls(), 1);
  EXPECT_EQ(joiner.answered_by_agent(), 0);
}

// The agent's stream to the coordinator broke while the rank waited: the
// agent says so, and the rank joins directly at once, long before its
// deadline.
TEST_F(JoinGenerationTest, ARankTheAgentCannotCarryJoinsDirectlyAtOnce) {
  Start(/*not_formed=*/0);
  FakeAgent agent;
  v1::AgentJoinAnswer answer;
  answer.set_join_directly(true);
  answer.set_message("the agent's stream to the coordinator ended before the answer came");
  agent.AnswerFirstJoin(answer);
  GenerationJoiner joiner(*stub_, agent.rank_end());
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::JoinResponse> joined =
      joiner.Join(request_, absl::Now() + absl::Seconds(60), /*until_formed=*/true);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->rank(), 3);
  EXPECT_EQ(service_->calls(), 1);
  EXPECT_EQ(joiner.answered_by_agent(), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(JoinGenerationTest, ARankWhoseAgentsEndClosedJoinsDirectly) {
  Start(/*not_formed=*/0);
  FakeAgent agent;
  agent.Close();
  GenerationJoiner joiner(*stub_, agent.rank_end());
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::JoinResponse> joined =
        joiner.Join(request_, absl::Now() + absl::Seconds(10), /*until_formed=*/true);
    ASSERT_TRUE(joined.ok()) << joined.status();
    EXPECT_EQ(joined->rank(), 3);
  }
  EXPECT_EQ(service_->calls(), 2);
  EXPECT_EQ(joiner.answered_by_agent(), 0);
}

TEST(JoinFileTest, AJoinResponseGoesThroughAFileIntact) {
  v1::JoinResponse joined;
  joined.set_rank(3);
  joined.set_world_size(4);
  joined.set_generation(2);
  joined.set_store_namespace("job-000001/gen-2");
  joined.mutable_spec()->set_name("a job");
  const std::string dir = ::testing::TempDir();
  absl::StatusOr<std::string> path = WriteJoinFile(dir, joined);
  ASSERT_TRUE(path.ok()) << path.status();
  struct stat info;
  ASSERT_EQ(::stat(path->c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600) << "the spec may hold secrets (program.env)";
  absl::StatusOr<v1::JoinResponse> back = ReadJoinFile(*path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), joined.SerializeAsString());
  ::unlink(path->c_str());
  absl::StatusOr<v1::JoinResponse> gone = ReadJoinFile(*path);
  EXPECT_TRUE(absl::IsFailedPrecondition(gone.status()));
  EXPECT_THAT(gone.status().message(), ::testing::HasSubstr(*path));
  EXPECT_TRUE(absl::IsFailedPrecondition(WriteJoinFile("/nonexistent-dir", joined).status()));
}

TEST(JoinFileTest, AFileThatIsNotAJoinResponseIsNamed) {
  const std::string path = ::testing::TempDir() + "/not-a-join";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("\xff\xff\xff garbage", f);
  std::fclose(f);
  absl::StatusOr<v1::JoinResponse> read = ReadJoinFile(path);
  EXPECT_TRUE(absl::IsDataLoss(read.status())) << read.status();
  EXPECT_THAT(read.status().message(), ::testing::HasSubstr(path));
}

TEST(RankLaunchTest, TheAgentsEnvironmentIsTheJoinRequest) {
  setenv("CHORUS_COORDINATOR", "10.0.0.1:29650", 1);
  setenv("CHORUS_JOB_ID", "job-000042", 1);
  setenv("CHORUS_GENERATION", "3", 1);
  setenv("CHORUS_SLOT", "5", 1);
  setenv("CHORUS_AGENT_ID", "agent-7", 1);
  absl::StatusOr<RankLaunch> launch = RankLaunchFromEnvironment();
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->coordinator, "10.0.0.1:29650");
  EXPECT_EQ(launch->join.job_id(), "job-000042");
  EXPECT_EQ(launch->join.generation(), 3);
  EXPECT_EQ(launch->join.slot(), 5);
  EXPECT_EQ(launch->join.agent_id(), "agent-7");
  EXPECT_EQ(launch->join.pid(), ::getpid());
  EXPECT_FALSE(launch->join.host().empty());
  setenv("CHORUS_GENERATION", "three", 1);
  absl::StatusOr<RankLaunch> bad = RankLaunchFromEnvironment();
  EXPECT_TRUE(absl::IsFailedPrecondition(bad.status()));
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("started by chorus-worker"));
  for (const char* name : {"CHORUS_COORDINATOR", "CHORUS_JOB_ID", "CHORUS_GENERATION",
                           "CHORUS_SLOT", "CHORUS_AGENT_ID"}) {
    unsetenv(name);
  }
}

}  // namespace
}  // namespace chorus
