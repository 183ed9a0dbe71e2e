#include "coordinator/scheduling/scheduling_policy.h"

#include <string>

#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(SchedulingPolicyTest, UserLinesOverrideTheDefaultWhereverItIs) {
  absl::StatusOr<SchedulingPolicy> policy = ParseSchedulingPolicy(
      "# limits\n"
      "user alice cpu_slots=8 max_priority=high\n"
      "\n"
      "fair_share_half_life 30m   # shorter\n"
      "default cpu_slots=16 cuda_slots=2 queued_jobs=100 max_priority=NORMAL\n",
      "policy.txt");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->fair_share_half_life, absl::Minutes(30));
  const UserLimits& alice = policy->For("alice");
  EXPECT_EQ(alice.max_slots.at(v1::ResourceSpec::CPU), 8);
  EXPECT_EQ(alice.max_slots.at(v1::ResourceSpec::CUDA), 2);
  EXPECT_EQ(alice.max_queued_jobs, 100);
  EXPECT_EQ(alice.max_priority, v1::JobSpec::HIGH);
  const UserLimits& bob = policy->For("bob");
  EXPECT_EQ(bob.max_slots.at(v1::ResourceSpec::CPU), 16);
  EXPECT_EQ(bob.max_priority, v1::JobSpec::NORMAL);
  EXPECT_EQ(&policy->For(""), &policy->defaults);
}

TEST(SchedulingPolicyTest, AnEmptyPolicyLimitsNothing) {
  absl::StatusOr<SchedulingPolicy> policy = ParseSchedulingPolicy("", "p");
  ASSERT_TRUE(policy.ok());
  EXPECT_TRUE(policy->defaults.max_slots.empty());
  EXPECT_FALSE(policy->defaults.max_queued_jobs.has_value());
  EXPECT_EQ(policy->defaults.max_priority, v1::JobSpec::HIGH);
  EXPECT_EQ(policy->fair_share_half_life, absl::Hours(1));
}

TEST(SchedulingPolicyTest, ErrorsNameTheFileAndLine) {
  struct Case {
    std::string text;
    std::string error;
  };
  for (const Case& c : {
           Case{"default cpu_slots=8\nuser bob gpu_slots=1\n",
                "scheduling policy p.txt:2: unknown setting \"gpu_slots\" (cpu_slots, "
                "cuda_slots, queued_jobs, max_priority)"},
           Case{"default cpu_slots=-1",
                "scheduling policy p.txt:1: cpu_slots must be a whole "
                "number >= 0, got \"-1\""},
           Case{"\n\ndefault max_priority=urgent",
                "scheduling policy p.txt:3: max_priority must be LOW, NORMAL or HIGH, got "
                "\"urgent\""},
           Case{"fair_share_half_life soon",
                "scheduling policy p.txt:1: fair_share_half_life takes one duration > 0, such as "
                "1h or 30m"},
           Case{"user alice\nuser alice cpu_slots=1",
                "scheduling policy p.txt:2: user alice appears twice"},
           Case{"default\ndefault", "scheduling policy p.txt:2: a second default line"},
           Case{"quota alice 8",
                "scheduling policy p.txt:1: unknown statement \"quota\" "
                "(fair_share_half_life, default, user)"},
           Case{"user alice cpu_slots",
                "scheduling policy p.txt:1: \"cpu_slots\" is not "
                "NAME=VALUE (cpu_slots, cuda_slots, queued_jobs, "
                "max_priority)"},
       }) {
    absl::StatusOr<SchedulingPolicy> policy = ParseSchedulingPolicy(c.text, "p.txt");
    ASSERT_FALSE(policy.ok()) << c.text;
    EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(policy.status().message(), c.error);
  }
}

TEST(SchedulingPolicyTest, LoadNamesAMissingFile) {
  absl::StatusOr<SchedulingPolicy> policy = LoadSchedulingPolicy("/nonexistent/policy.txt");
  EXPECT_EQ(policy.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(policy.status().message(),
            "--scheduling_policy /nonexistent/policy.txt: cannot open the file (does it exist?)");
}

TEST(SchedulingPolicyTest, SubmissionChecksThePriorityCeilingAndTheQueuedJobs) {
  absl::StatusOr<SchedulingPolicy> policy = ParseSchedulingPolicy(
      "default queued_jobs=2 max_priority=NORMAL\nuser root max_priority=HIGH", "p");
  ASSERT_TRUE(policy.ok());
  v1::JobSpec spec;
  EXPECT_TRUE(CheckSubmission(*policy, "alice", spec, 1).ok());  // unspecified = NORMAL
  spec.set_priority(v1::JobSpec::HIGH);
  absl::Status high = CheckSubmission(*policy, "alice", spec, 0);
  EXPECT_EQ(high.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(high.message(),
            "job spec: priority HIGH is above what the scheduling policy allows alice (NORMAL); "
            "ask for at most that, or ask the administrator");
  EXPECT_TRUE(CheckSubmission(*policy, "root", spec, 0).ok());
  spec.set_priority(v1::JobSpec::LOW);
  absl::Status full = CheckSubmission(*policy, "", spec, 2);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(),
            "anonymous already has 2 queued jobs, the most the scheduling policy allows "
            "(queued_jobs=2); wait for some to start, or cancel some");
}

}  // namespace
}  // namespace chorus
