#include "common/device.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

TEST(DeviceTest, CpuIsAlwaysAvailable) { EXPECT_TRUE(CheckDevice(v1::ResourceSpec::CPU, 64).ok()); }

TEST(DeviceTest, CudaNeedsACudaBuildAndEnoughGpus) {
  absl::Status status = CheckDevice(v1::ResourceSpec::CUDA, 1);
  if (!BuiltWithCuda()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(), HasSubstr("--config=cuda"));
    return;
  }
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok() || *count == 0) {
    // A CUDA build on a machine without a GPU must say so, not crash.
    EXPECT_FALSE(status.ok());
    return;
  }
  EXPECT_TRUE(status.ok()) << status;
  absl::Status too_many = CheckDevice(v1::ResourceSpec::CUDA, *count + 1);
  EXPECT_EQ(too_many.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(too_many.message(), HasSubstr("GPUs"));
}

}  // namespace
}  // namespace chorus
