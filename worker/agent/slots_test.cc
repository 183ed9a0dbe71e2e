#include "worker/agent/slots.h"

#include <sched.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

SlotFacts Cpus(int cpus) {
  SlotFacts facts;
  facts.online_cpus = cpus;
  facts.gpu_count = [] { return absl::StatusOr<int>(absl::FailedPreconditionError("no GPU")); };
  return facts;
}

SlotFacts Gpus(absl::StatusOr<int> gpus) {
  SlotFacts facts;
  facts.online_cpus = 64;
  facts.gpu_count = [gpus] { return gpus; };
  return facts;
}

TEST(SlotsTest, ANumberIsTakenAsItIs) {
  EXPECT_EQ(*ResolveSlots("3", v1::ResourceSpec::CPU, 1, Cpus(2)), 3);
  EXPECT_EQ(*ResolveSlots("1024", v1::ResourceSpec::CUDA, 1, Gpus(0)), 1024);
}

TEST(SlotsTest, ABadNumberNamesTheFlagAndTheValue) {
  for (const char* bad : {"0", "-2", "1025", "two", "", "4x", "Auto"}) {
    absl::StatusOr<int> slots = ResolveSlots(bad, v1::ResourceSpec::CPU, 1, Cpus(8));
    ASSERT_FALSE(slots.ok()) << bad;
    EXPECT_EQ(slots.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(slots.status().message(), HasSubstr("--slots"));
    EXPECT_THAT(slots.status().message(), HasSubstr(absl::StrCat("\"", bad, "\"")));
  }
}

TEST(SlotsTest, AutoOnCpuDividesTheCpusByThreadsPerSlot) {
  EXPECT_EQ(*ResolveSlots("auto", v1::ResourceSpec::CPU, 1, Cpus(16)), 16);
  EXPECT_EQ(*ResolveSlots("auto", v1::ResourceSpec::CPU, 4, Cpus(16)), 4);
  EXPECT_EQ(*ResolveSlots("auto", v1::ResourceSpec::CPU, 3, Cpus(16)), 5);  // rounds down
}

TEST(SlotsTest, AutoOnCpuOffersAtLeastOneSlot) {
  EXPECT_EQ(*ResolveSlots("auto", v1::ResourceSpec::CPU, 8, Cpus(2)), 1);
  EXPECT_EQ(*ResolveSlots("auto", v1::ResourceSpec::CPU, 1, Cpus(0)), 1);
}

TEST(SlotsTest, AutoOnCpuIsCappedAtTheMaximum) {
  EXPECT_EQ(*ResolveSlots("auto", v1::ResourceSpec::CPU, 1, Cpus(4096)), kMaxSlots);
}

TEST(SlotsTest, AutoRejectsThreadsPerSlotBelowOne) {
  absl::StatusOr<int> slots = ResolveSlots("auto", v1::ResourceSpec::CPU, 0, Cpus(8));
  EXPECT_EQ(slots.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(slots.status().message(), HasSubstr("--threads_per_slot must be >= 1, got 0"));
}

TEST(SlotsTest, AutoOnCudaCountsGpusAndIgnoresCpus) {
  EXPECT_EQ(*ResolveSlots("auto", v1::ResourceSpec::CUDA, 1, Gpus(8)), 8);
  EXPECT_EQ(*ResolveSlots("auto", v1::ResourceSpec::CUDA, 16, Gpus(2)), 2);
}

TEST(SlotsTest, AutoOnCudaWithoutCudaSaysWhy) {
  absl::StatusOr<int> slots = ResolveSlots(
      "auto", v1::ResourceSpec::CUDA, 1,
      Gpus(absl::FailedPreconditionError("this binary was built without CUDA; rebuild with "
                                         "`bazel build --config=cuda`")));
  EXPECT_EQ(slots.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(slots.status().message(), HasSubstr("--slots auto --device cuda"));
  EXPECT_THAT(slots.status().message(), HasSubstr("--config=cuda"));
}

TEST(SlotsTest, AutoOnCudaWithNoGpuFails) {
  absl::StatusOr<int> slots = ResolveSlots("auto", v1::ResourceSpec::CUDA, 1, Gpus(0));
  EXPECT_EQ(slots.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(slots.status().message(), HasSubstr("sees no GPU"));
}

TEST(SlotsTest, ThisMachineHasItsAffinityCpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(OnlineCpus(), CPU_COUNT(&set));
  EXPECT_EQ(SlotFacts::OfThisMachine().online_cpus, CPU_COUNT(&set));
  EXPECT_EQ(*ResolveSlots("auto", v1::ResourceSpec::CPU, 1, SlotFacts::OfThisMachine()),
            CPU_COUNT(&set));
}

}  // namespace
}  // namespace chorus
