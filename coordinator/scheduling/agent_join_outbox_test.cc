#include "coordinator/scheduling/agent_join_outbox.h"

#include <string>
#include <vector>

#include "common/join_answers.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

// One connection of an agent: what the outbox sends it.
struct FakeStream {
  std::vector<v1::RankJoinAnswers> received;
  AgentSender Sender() {
    return [this](const v1::CoordinatorMessage& m) { received.push_back(m.joined()); };
  }
};

v1::JoinRequest JoinOf(int slot) {
  v1::JoinRequest r;
  r.set_job_id("job-000001");
  r.set_slot(slot);
  r.set_generation(2);
  return r;
}

v1::JoinResponse Joined(int rank) {
  v1::JoinResponse r;
  r.set_rank(rank);
  r.set_generation(2);
  r.set_world_size(3);
  r.mutable_spec()->set_name("job");
  return r;
}

TEST(AgentJoinOutboxTest, AnswersReadyTogetherGoOutAsOneMessagePerAgent) {
  AgentJoinOutbox outbox;
  FakeStream a, b;
  Rendezvous::Done a0 = outbox.DoneFor("agent-1", 1, a.Sender(), JoinOf(0));
  Rendezvous::Done a1 = outbox.DoneFor("agent-1", 1, a.Sender(), JoinOf(1));
  Rendezvous::Done b0 = outbox.DoneFor("agent-2", 2, b.Sender(), JoinOf(0));
  a0(Joined(0));
  b0(Joined(2));
  a1(Joined(1));
  EXPECT_TRUE(a.received.empty()) << "recorded, not sent";
  outbox.Send();
  ASSERT_EQ(a.received.size(), 1u);
  ASSERT_EQ(b.received.size(), 1u);
  ASSERT_EQ(a.received[0].entries_size(), 2);
  EXPECT_EQ(a.received[0].shared_size(), 1);
  EXPECT_EQ(JoinAnswerFor(a.received[0], a.received[0].entries(1))->rank(), 1);
  EXPECT_EQ(JoinAnswerFor(b.received[0], b.received[0].entries(0))->rank(), 2);
  outbox.Send();
  EXPECT_EQ(a.received.size(), 1u) << "nothing new: nothing sent";
}

TEST(AgentJoinOutboxTest, AnAgentThatReconnectedGetsItsNewAnswersOnItsNewStream) {
  AgentJoinOutbox outbox;
  FakeStream old_stream, new_stream;
  // The join made on the old stream is superseded by the retry on the new
  // one, in the same flush as the new one's answer: each goes to its own.
  Rendezvous::Done before = outbox.DoneFor("agent-1", 1, old_stream.Sender(), JoinOf(0));
  Rendezvous::Done after = outbox.DoneFor("agent-1", 7, new_stream.Sender(), JoinOf(0));
  before(absl::AbortedError("superseded by a newer Join of the same rank"));
  after(Joined(0));
  outbox.Send();
  ASSERT_EQ(old_stream.received.size(), 1u);
  EXPECT_EQ(old_stream.received[0].entries(0).code(), static_cast<int>(absl::StatusCode::kAborted));
  ASSERT_EQ(new_stream.received.size(), 1u);
  ASSERT_EQ(new_stream.received[0].entries_size(), 1);
  EXPECT_TRUE(JoinAnswerFor(new_stream.received[0], new_stream.received[0].entries(0)).ok());
}

}  // namespace
}  // namespace chorus
