#include "coordinator/scheduling/rendezvous.h"

#include <string>
#include <utility>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

struct JoinResult {
  bool called = false;
  absl::StatusOr<v1::JoinResponse> result = absl::UnknownError("not called");
  Rendezvous::Done Done() {
    return [this](absl::StatusOr<v1::JoinResponse> r) {
      called = true;
      result = std::move(r);
    };
  }
};

v1::JoinResponse Respond(int rank) {
  v1::JoinResponse response;
  response.set_rank(rank);
  response.set_world_size(3);
  return response;
}

void Deliver(Rendezvous::Answers& answers) {
  for (auto& [done, result] : answers) done(std::move(result));
  answers.clear();
}

class RendezvousTest : public ::testing::Test {
 protected:
  FakeClock clock_{absl::FromUnixSeconds(1000)};
  Rendezvous rendezvous_{"job-000001", /*generation=*/1, /*world_size=*/3};
  Rendezvous::Answers answers_;
};

TEST_F(RendezvousTest, AnswersEveryRankWhenTheLastJoins) {
  JoinResult joins[3];
  const absl::Time deadline = clock_.Now() + absl::Seconds(60);
  EXPECT_FALSE(rendezvous_.Join(2, deadline, joins[2].Done(), Respond, answers_));
  EXPECT_FALSE(rendezvous_.Join(0, deadline, joins[0].Done(), Respond, answers_));
  EXPECT_TRUE(answers_.empty()) << "joins wait for the whole generation";
  EXPECT_TRUE(rendezvous_.joined(0));
  EXPECT_FALSE(rendezvous_.joined(1));
  EXPECT_TRUE(rendezvous_.Join(1, deadline, joins[1].Done(), Respond, answers_));
  Deliver(answers_);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(joins[r].called);
    ASSERT_TRUE(joins[r].result.ok()) << joins[r].result.status();
    EXPECT_EQ(joins[r].result->rank(), r);
  }
}

TEST_F(RendezvousTest, StaleGenerationIsRefusedWithTheCurrentOne) {
  EXPECT_TRUE(rendezvous_.CheckGeneration(1).ok());
  const absl::Status stale = rendezvous_.CheckGeneration(7);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stale.message(),
            "generation 7 of job job-000001 is stale; the current generation is 1");
}

TEST_F(RendezvousTest, DeadlineFailsTheWaitingJoinAtExpireNamingMissingRanks) {
  JoinResult first;
  rendezvous_.Join(0, clock_.Now() + absl::Seconds(5), first.Done(), Respond, answers_);
  rendezvous_.Expire(clock_.Now(), answers_);
  EXPECT_TRUE(answers_.empty());
  clock_.Advance(absl::Seconds(5));
  rendezvous_.Expire(clock_.Now(), answers_);
  Deliver(answers_);
  ASSERT_TRUE(first.called);
  EXPECT_EQ(first.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(first.result.status().message(),
              HasSubstr("generation 1 of job job-000001 did not complete in time; ranks that have "
                        "not joined: 1,2"));
  EXPECT_FALSE(rendezvous_.joined(0)) << "an expired rank must join again";
}

TEST_F(RendezvousTest, RetrySupersedesTheEarlierJoin) {
  JoinResult earlier, retry;
  const absl::Time deadline = clock_.Now() + absl::Seconds(60);
  rendezvous_.Join(0, deadline, earlier.Done(), Respond, answers_);
  rendezvous_.Join(0, deadline, retry.Done(), Respond, answers_);
  Deliver(answers_);
  ASSERT_TRUE(earlier.called);
  EXPECT_EQ(earlier.result.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(earlier.result.status().message(), "superseded by a newer Join of the same rank");
  EXPECT_FALSE(retry.called);
}

TEST_F(RendezvousTest, AbortFailsEveryWaitingJoin) {
  JoinResult a, b;
  rendezvous_.Join(0, clock_.Now() + absl::Seconds(60), a.Done(), Respond, answers_);
  rendezvous_.Join(2, clock_.Now() + absl::Seconds(60), b.Done(), Respond, answers_);
  rendezvous_.Abort(absl::AbortedError("job job-000001 ended: cancelled"), answers_);
  Deliver(answers_);
  ASSERT_TRUE(a.called && b.called);
  EXPECT_EQ(a.result.status().message(), "job job-000001 ended: cancelled");
  EXPECT_EQ(b.result.status().code(), absl::StatusCode::kAborted);
}

// Completion is a count (Note [Rendezvous is O(ranks)] in
// rendezvous.h): a retry counts once, an expired join not at all.
TEST_F(RendezvousTest, CompletionCountsEachRankOnceAndNotAfterItsJoinExpired) {
  JoinResult joins[3], retry;
  const absl::Time later = clock_.Now() + absl::Seconds(60);
  EXPECT_FALSE(rendezvous_.Join(0, later, joins[0].Done(), Respond, answers_));
  EXPECT_FALSE(rendezvous_.Join(0, later, retry.Done(), Respond, answers_));
  EXPECT_FALSE(
      rendezvous_.Join(1, clock_.Now() + absl::Seconds(1), joins[1].Done(), Respond, answers_));
  clock_.Advance(absl::Seconds(1));
  rendezvous_.Expire(clock_.Now(), answers_);
  EXPECT_FALSE(rendezvous_.complete());
  EXPECT_FALSE(rendezvous_.Join(2, later, joins[2].Done(), Respond, answers_))
      << "rank 1's join expired: two of three ranks wait";
  EXPECT_FALSE(rendezvous_.complete());
  JoinResult again;
  EXPECT_TRUE(rendezvous_.Join(1, later, again.Done(), Respond, answers_));
  EXPECT_TRUE(rendezvous_.complete());
  Deliver(answers_);
  ASSERT_TRUE(retry.called && again.called && joins[2].called);
  EXPECT_EQ(retry.result->rank(), 0);
  EXPECT_EQ(again.result->rank(), 1);
}

TEST_F(RendezvousTest, RanksTakenBackAfterARestartCountAsJoined) {
  Rendezvous recovered("job-000002", /*generation=*/3, /*world_size=*/2);
  recovered.MarkJoined(0);
  recovered.MarkJoined(0);
  EXPECT_FALSE(recovered.complete());
  JoinResult late;
  EXPECT_TRUE(recovered.Join(1, clock_.Now() + absl::Seconds(1), late.Done(), Respond, answers_));
  Deliver(answers_);
  ASSERT_TRUE(late.called);
  EXPECT_EQ(late.result->rank(), 1);
  EXPECT_EQ(recovered.generation(), 3);
  EXPECT_EQ(recovered.world_size(), 2);
}

}  // namespace
}  // namespace chorus
