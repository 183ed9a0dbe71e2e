#include "common/join_answers.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

v1::JoinResponse Answer(int rank, int64_t generation) {
  v1::JoinResponse r;
  r.set_rank(rank);
  r.set_world_size(16);
  r.set_generation(generation);
  r.mutable_spec()->set_name("big");
  r.mutable_spec()->mutable_resources()->set_max_ranks(16);
  r.set_store_namespace("job-1/gen-" + std::to_string(generation));
  r.set_local_rank(rank % 8);
  r.set_local_world_size(8);
  r.mutable_resume()->set_step(40);
  r.set_restarts(2);
  r.set_group_rank(rank / 8);
  r.set_group_world_size(2);
  return r;
}

TEST(JoinAnswersTest, EachRankGetsItsWholeAnswerAndTheSharedPartGoesOnce) {
  v1::RankJoinAnswers answers;
  for (int rank : {8, 0, 9}) AddJoinAnswer("job-1", rank + 1, 2, Answer(rank, 3), answers);
  ASSERT_EQ(answers.entries_size(), 3);
  ASSERT_EQ(answers.shared_size(), 1);
  EXPECT_EQ(answers.shared(0).job_id(), "job-1");
  for (const v1::RankJoinAnswers::Entry& entry : answers.entries()) {
    EXPECT_FALSE(entry.response().has_spec());
    EXPECT_FALSE(entry.response().has_resume());
    EXPECT_EQ(entry.asked_generation(), 2);
    absl::StatusOr<v1::JoinResponse> joined = JoinAnswerFor(answers, entry);
    ASSERT_TRUE(joined.ok()) << joined.status();
    // Rank 0's own part is all defaults: the merge keeps it rank 0.
    EXPECT_EQ(joined->SerializeAsString(), Answer(entry.slot() - 1, 3).SerializeAsString());
  }
  // Another generation of the same job has its own shared part.
  AddJoinAnswer("job-1", 5, 4, Answer(4, 4), answers);
  EXPECT_EQ(answers.shared_size(), 2);
  EXPECT_EQ(JoinAnswerFor(answers, answers.entries(3))->store_namespace(), "job-1/gen-4");
  EXPECT_EQ(JoinAnswerFor(answers, answers.entries(0))->store_namespace(), "job-1/gen-3");
}

TEST(JoinAnswersTest, ErrorsAndLeavingKeepTheirMeaning) {
  v1::RankJoinAnswers answers;
  AddJoinAnswer("job-1", 0, 3, absl::UnavailableError("generation 3 has not formed yet"),
                answers);
  v1::JoinResponse leave;
  leave.set_leave(true);
  leave.set_generation(2);
  AddJoinAnswer("job-1", 1, 2, leave, answers);
  EXPECT_EQ(answers.shared_size(), 0);
  absl::StatusOr<v1::JoinResponse> unavailable = JoinAnswerFor(answers, answers.entries(0));
  EXPECT_EQ(unavailable.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(unavailable.status().message(), "generation 3 has not formed yet");
  absl::StatusOr<v1::JoinResponse> left = JoinAnswerFor(answers, answers.entries(1));
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->leave());
  EXPECT_EQ(left->generation(), 2);
}

TEST(JoinAnswersTest, AnAnswerWithoutItsSharedPartIsDataLoss) {
  v1::RankJoinAnswers answers;
  AddJoinAnswer("job-1", 3, 2, Answer(2, 2), answers);
  answers.clear_shared();
  absl::StatusOr<v1::JoinResponse> joined = JoinAnswerFor(answers, answers.entries(0));
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(joined.status().message(), HasSubstr("job job-1"));
  EXPECT_THAT(joined.status().message(), HasSubstr("generation 2"));
}

}  // namespace
}  // namespace chorus
