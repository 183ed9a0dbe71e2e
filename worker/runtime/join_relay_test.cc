// The supervisor's relay of its program's joins, over two real channels: the
// program's progress channel and the supervisor's channel to its agent.
#include "worker/runtime/join_relay.h"

#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/runtime/progress_channel.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kPatience = absl::Seconds(10);

// Both channels, each end where it lives.
class JoinRelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<ProgressChannelPair> program = CreateProgressChannel();
    ASSERT_TRUE(program.ok()) << program.status();
    program_ = std::make_unique<ProgressSender>(program->program_fd);
    supervisor_ = std::make_unique<ProgressReceiver>(program->supervisor_fd);
    absl::StatusOr<ProgressChannelPair> agent = CreateProgressChannel();
    ASSERT_TRUE(agent.ok()) << agent.status();
    to_agent_ = std::make_shared<ProgressSender>(agent->program_fd);
    agent_ = std::make_unique<ProgressReceiver>(agent->supervisor_fd);
  }

  // What the supervisor does with what the program sent: the joins go to
  // the relay.
  void SuperviseOnce(JoinRelay& relay) {
    const absl::Time deadline = absl::Now() + kPatience;
    std::vector<v1::JoinRequest> joins;
    while (joins.empty() && absl::Now() < deadline) {
      supervisor_->Receive(absl::Now() + absl::Milliseconds(20)).IgnoreError();
      joins = supervisor_->TakeJoins();
    }
    ASSERT_EQ(joins.size(), 1u);
    relay.Relay(joins[0]);
  }

  // The joins the agent got (bounded wait for the first).
  std::vector<v1::JoinRequest> AgentJoins() {
    const absl::Time deadline = absl::Now() + kPatience;
    std::vector<v1::JoinRequest> joins;
    while (joins.empty() && absl::Now() < deadline) {
      agent_->Receive(absl::Now() + absl::Milliseconds(20)).IgnoreError();
      joins = agent_->TakeJoins();
    }
    return joins;
  }

  static v1::JoinRequest Join(int64_t generation) {
    v1::JoinRequest join;
    join.set_job_id("job-000004");
    join.set_generation(generation);
    join.set_slot(1);
    return join;
  }

  std::unique_ptr<ProgressSender> program_;
  std::unique_ptr<ProgressReceiver> supervisor_;
  std::shared_ptr<ProgressSender> to_agent_;
  std::unique_ptr<ProgressReceiver> agent_;
};

TEST_F(JoinRelayTest, TheProgramsJoinGoesToTheAgentAndTheAnswerComesBack) {
  JoinRelay relay(*supervisor_, to_agent_);
  ASSERT_TRUE(program_->SendJoin(Join(3)).ok());
  SuperviseOnce(relay);
  std::vector<v1::JoinRequest> joins = AgentJoins();
  ASSERT_EQ(joins.size(), 1u);
  EXPECT_EQ(joins[0].generation(), 3);
  EXPECT_EQ(joins[0].job_id(), "job-000004");
  // An answer to an older join first (the program gave up on it): not this
  // join's.
  v1::AgentJoinAnswer stale;
  stale.set_job_id("job-000004");
  stale.set_asked_generation(2);
  ASSERT_TRUE(agent_->SendJoinAnswer(stale).ok());
  v1::AgentJoinAnswer answer;
  answer.set_job_id("job-000004");
  answer.set_asked_generation(3);
  answer.mutable_response()->set_rank(2);
  answer.mutable_response()->set_world_size(4);
  ASSERT_TRUE(agent_->SendJoinAnswer(answer).ok());
  absl::StatusOr<v1::AgentJoinAnswer> got = program_->ReceiveJoinAnswer(absl::Now() + kPatience);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->asked_generation(), 3);
  EXPECT_EQ(got->response().rank(), 2);
  EXPECT_EQ(got->response().world_size(), 4);
  absl::StatusOr<v1::AgentJoinAnswer> more =
      program_->ReceiveJoinAnswer(absl::Now() + absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(more.status())) << more.status();
}

// The agent's end closes while the program waits: the program is told to
// join directly, at once.
TEST_F(JoinRelayTest, AProgramWhoseAgentIsGoneIsToldToJoinDirectly) {
  JoinRelay relay(*supervisor_, to_agent_);
  ASSERT_TRUE(program_->SendJoin(Join(5)).ok());
  SuperviseOnce(relay);
  ASSERT_EQ(AgentJoins().size(), 1u);
  agent_.reset();
  absl::StatusOr<v1::AgentJoinAnswer> got = program_->ReceiveJoinAnswer(absl::Now() + kPatience);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->join_directly());
  EXPECT_EQ(got->asked_generation(), 5);
  EXPECT_THAT(got->message(), HasSubstr("the node agent's channel"));
}

}  // namespace
}  // namespace chorus
