#include "chorus/checkpoints.h"

#include <torch/types.h>
#include <torch/utils.h>

#include "checkpoint/coordinator_storage.h"
#include "checkpoint/fake_checkpoint_service.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

bool SameBits(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;
}

class CheckpointsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator_.set_data_port(FakeCheckpointService::DataPort::kNone);
    ASSERT_TRUE(coordinator_.Start().ok());
  }
  FakeCheckpointService coordinator_;
};

TEST_F(CheckpointsTest, NamedTensorsRoundTripBitForBit) {
  torch::manual_seed(7);
  at::Tensor weight = torch::randn({3, 5});
  at::Tensor counter = torch::tensor({int64_t{123456789012}}, torch::kLong);
  at::Tensor half = torch::randn({4}).to(torch::kHalf);
  CoordinatorCheckpointStorage storage(coordinator_.channel(), "job-000001", 1, 0);
  TensorCheckpoints checkpoints(storage, /*rank=*/0, /*world_size=*/2);
  ASSERT_TRUE(
      checkpoints.Save(40, {{"actor.weight", weight}, {"steps", counter}, {"h", half}}).ok());

  std::optional<v1::CheckpointManifest> manifest = coordinator_.Manifest(40);
  ASSERT_TRUE(manifest.has_value());
  manifest->set_job_id("job-000001");
  EXPECT_EQ(coordinator_.Files(40).count("model.pt"), 1u);
  EXPECT_EQ(coordinator_.Files(40).count("train_state.pt"), 1u);

  at::Tensor weight2 = torch::zeros({3, 5});
  at::Tensor counter2 = torch::zeros({1}, torch::kLong);
  at::Tensor half2 = torch::zeros({4}, torch::kHalf);
  TensorCheckpoints other(storage, /*rank=*/1, /*world_size=*/2);
  absl::StatusOr<int64_t> step =
      other.Restore(*manifest, {{"actor.weight", weight2}, {"steps", counter2}, {"h", half2}});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 40);
  EXPECT_TRUE(SameBits(weight, weight2));
  EXPECT_TRUE(SameBits(counter, counter2));
  EXPECT_TRUE(SameBits(half, half2));

  // Load gives every tensor by name, without tensors to copy into.
  absl::StatusOr<TensorCheckpoints::Loaded> loaded = other.Load(*manifest);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 40);
  ASSERT_EQ(loaded->tensors.size(), 3u);
  EXPECT_EQ(loaded->tensors[0].name, "actor.weight");
  EXPECT_TRUE(SameBits(loaded->tensors[0].tensor, weight));
  EXPECT_EQ(loaded->tensors[1].name, "h");
  EXPECT_TRUE(SameBits(loaded->tensors[2].tensor, counter));
  EXPECT_TRUE(absl::IsNotFound(other.Load(v1::CheckpointManifest()).status()));
}

TEST_F(CheckpointsTest, OnlyRankZeroStores) {
  CoordinatorCheckpointStorage storage(coordinator_.channel(), "job-000001", 1, 1);
  TensorCheckpoints checkpoints(storage, /*rank=*/1, /*world_size=*/2);
  ASSERT_TRUE(checkpoints.Save(10, {{"w", torch::ones({2})}}).ok());
  EXPECT_FALSE(coordinator_.Manifest(10).has_value());
  EXPECT_EQ(coordinator_.stream_uploads(), 0);
}

TEST_F(CheckpointsTest, BadSetsAreRefusedByName) {
  CoordinatorCheckpointStorage storage(coordinator_.channel(), "job-000001", 1, 0);
  TensorCheckpoints checkpoints(storage, 0, 1);
  absl::Status s = checkpoints.Save(1, {{"w", torch::ones({2})}, {"w", torch::ones({2})}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "checkpoint tensor 'w' is listed twice");
  s = checkpoints.Save(1, {{"", torch::ones({2})}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = checkpoints.Save(1, {{"u", at::Tensor()}});
  EXPECT_EQ(s.message(), "checkpoint tensor 'u' is undefined");
}

TEST_F(CheckpointsTest, RestoreNamesMissingAndMismatchedTensors) {
  CoordinatorCheckpointStorage storage(coordinator_.channel(), "job-000001", 1, 0);
  TensorCheckpoints checkpoints(storage, 0, 1);
  at::Tensor w = torch::arange(6, torch::kFloat).reshape({2, 3});
  ASSERT_TRUE(checkpoints.Save(5, {{"w", w}}).ok());
  v1::CheckpointManifest manifest = *coordinator_.Manifest(5);
  manifest.set_job_id("job-000001");

  at::Tensor target = torch::zeros({2, 3});
  absl::StatusOr<int64_t> step = checkpoints.Restore(manifest, {{"w", target}, {"b", target}});
  EXPECT_EQ(step.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(step.status().message(), "checkpoint job-000001:5 has no tensor 'b'");
  EXPECT_EQ(target.sum().item<float>(), 0) << "nothing is changed when a tensor is missing";

  at::Tensor wrong = torch::zeros({3, 2});
  step = checkpoints.Restore(manifest, {{"w", wrong}});
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step.status().message(),
            "checkpoint job-000001:5: tensor 'w' is [2,3] Float there but [3,2] Float here");

  step = checkpoints.Restore(v1::CheckpointManifest(), {{"w", target}});
  EXPECT_EQ(step.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace chorus
