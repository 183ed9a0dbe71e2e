#include "chorus/elastic.h"

#include <torch/types.h>

#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/rank_threads.h"

namespace chorus {
namespace {

// What a rank holds: a parameter (requires grad), a momentum buffer and an
// integer counter, each filled with `value`.
std::vector<NamedTensor> State(double value) {
  return {{"fc.weight", torch::full({3, 2}, value, torch::kFloat).requires_grad_()},
          {"momentum.fc.weight", torch::full({3, 2}, value * 10, torch::kFloat)},
          {"position", torch::full({2}, static_cast<int64_t>(value), torch::kLong)}};
}

TEST(ShareNewestTensorsTest, EveryMemberTakesTheNewestStepFromItsLowestHolder) {
  const std::vector<int64_t> held = {5, 7, -1, 7};  // rank 2 is a newcomer
  RunGlooRanks(4, [&](int rank, Communicator& comm) {
    std::vector<NamedTensor> state = State(rank + 1);
    absl::StatusOr<SharedTensors> shared =
        ShareNewestTensors(comm, held[rank], state, absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(shared.ok()) << shared.status();
    EXPECT_EQ(shared->step, 7);
    EXPECT_EQ(shared->source, 1) << "the lowest rank holding step 7";
    EXPECT_EQ(shared->bytes, 2 * 6 * 4 + 2 * 8);
    EXPECT_TRUE(torch::equal(state[0].tensor, torch::full({3, 2}, 2.0f))) << "rank " << rank;
    EXPECT_TRUE(torch::equal(state[1].tensor, torch::full({3, 2}, 20.0f)));
    EXPECT_TRUE(torch::equal(state[2].tensor, torch::full({2}, int64_t{2})));
    EXPECT_TRUE(state[0].tensor.requires_grad()) << "flags stay";
  });
}

TEST(ShareNewestTensorsTest, WithNothingHeldEveryMemberTakesRankZeros) {
  RunGlooRanks(3, [&](int rank, Communicator& comm) {
    std::vector<NamedTensor> state = State(rank + 1);
    absl::StatusOr<SharedTensors> shared =
        ShareNewestTensors(comm, -1, state, absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(shared.ok()) << shared.status();
    EXPECT_EQ(shared->step, -1);
    EXPECT_EQ(shared->source, 0);
    EXPECT_TRUE(torch::equal(state[0].tensor, torch::full({3, 2}, 1.0f)));
  });
}

TEST(ShareNewestTensorsTest, ListsThatDifferAreRefusedOnEveryMember) {
  RunGlooRanks(2, [&](int rank, Communicator& comm) {
    std::vector<NamedTensor> state = State(1);
    if (rank == 1) state[1].tensor = torch::zeros({2, 3});  // another shape
    absl::StatusOr<SharedTensors> shared =
        ShareNewestTensors(comm, 3, state, absl::Now() + absl::Seconds(30));
    EXPECT_EQ(shared.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(shared.status().message().find("different tensor lists"), std::string::npos)
        << shared.status();
    EXPECT_TRUE(torch::equal(state[0].tensor, torch::full({3, 2}, 1.0f))) << "nothing copied";
  });
}

TEST(AverageHeldTensorsTest, MembersStartFromTheExactMeanOfTheHoldersModels) {
  RunGlooRanks(3, [&](int rank, Communicator& comm) {
    // Ranks 0 and 1 survived with different models; rank 2 is new.
    std::vector<NamedTensor> state = State(rank == 2 ? 100 : rank + 1);
    state[0].tensor.data()[0][0] = rank == 0 ? 0.1f : 0.2f;
    absl::StatusOr<int> averaged =
        AverageHeldTensors(comm, /*held=*/rank != 2, state, absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(averaged.ok()) << averaged.status();
    EXPECT_EQ(*averaged, 2);
    at::Tensor want = torch::full({3, 2}, 1.5f);
    want[0][0] = static_cast<float>((static_cast<double>(0.1f) + static_cast<double>(0.2f)) / 2);
    EXPECT_TRUE(torch::equal(state[0].tensor, want)) << "rank " << rank << ": " << state[0].tensor;
    EXPECT_TRUE(torch::equal(state[1].tensor, torch::full({3, 2}, 15.0f)));
    EXPECT_EQ(state[2].tensor[0].item<int64_t>(), rank == 2 ? 100 : rank + 1)
        << "integer tensors are not averaged";
  });
}

TEST(AverageHeldTensorsTest, NothingHeldIsAFailedPrecondition) {
  RunGlooRanks(2, [&](int, Communicator& comm) {
    std::vector<NamedTensor> state = State(1);
    absl::StatusOr<int> averaged =
        AverageHeldTensors(comm, false, state, absl::Now() + absl::Seconds(30));
    EXPECT_EQ(averaged.status().code(), absl::StatusCode::kFailedPrecondition);
  });
}

TEST(IsMembershipLostTest, TheCodesAFailedGenerationGives) {
  EXPECT_TRUE(IsMembershipLost(absl::UnavailableError("peer closed")));
  EXPECT_TRUE(IsMembershipLost(absl::AbortedError("generation 3 formed")));
  EXPECT_TRUE(IsMembershipLost(absl::DeadlineExceededError("timed out")));
  EXPECT_FALSE(IsMembershipLost(absl::InvalidArgumentError("shape")));
  EXPECT_FALSE(IsMembershipLost(absl::OkStatus()));
}

}  // namespace
}  // namespace chorus
