#include "chorus/environment.h"

#include <fstream>
#include <map>
#include <string>

#include "gtest/gtest.h"

namespace chorus {
namespace {

class EnvironmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::JoinResponse joined;
    joined.set_rank(1);
    joined.set_world_size(2);
    joined.set_generation(3);
    joined.set_local_rank(1);
    joined.set_local_world_size(2);
    joined.set_store_namespace("job-000007/g3/");
    joined.mutable_spec()->set_name("my-loop");
    joined.mutable_resume()->set_job_id("job-000004");
    joined.mutable_resume()->set_step(30);
    join_file_ = std::string(::testing::TempDir()) + "/join.pb";
    std::ofstream(join_file_, std::ios::binary) << joined.SerializeAsString();
    vars_ = {{"RANK", "1"},
             {"WORLD_SIZE", "2"},
             {"LOCAL_RANK", "1"},
             {"LOCAL_WORLD_SIZE", "2"},
             {"CHORUS_COORDINATOR", "127.0.0.1:5000"},
             {"CHORUS_JOB_ID", "job-000007"},
             {"CHORUS_GENERATION", "3"},
             {"CHORUS_STORE_NAMESPACE", "job-000007/g3/"},
             {"CHORUS_JOIN_FILE", join_file_},
             {"CHORUS_PROGRESS_FD", "9"}};
  }

  absl::StatusOr<SessionEnvironment> Read() {
    return ReadSessionEnvironment([this](const std::string& name) -> std::optional<std::string> {
      auto it = vars_.find(name);
      if (it == vars_.end()) return std::nullopt;
      return it->second;
    });
  }

  std::string join_file_;
  std::map<std::string, std::string> vars_;
};

TEST_F(EnvironmentTest, ReadsEveryVariableAndTheJoinFile) {
  absl::StatusOr<SessionEnvironment> env = Read();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->world_size, 2);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 2);
  EXPECT_EQ(env->generation, 3);
  EXPECT_EQ(env->job_id, "job-000007");
  EXPECT_EQ(env->coordinator, "127.0.0.1:5000");
  EXPECT_EQ(env->store_namespace, "job-000007/g3/");
  EXPECT_EQ(env->rank_host, "127.0.0.1");  // the default
  EXPECT_EQ(env->progress_fd, 9);
  EXPECT_EQ(env->joined.spec().name(), "my-loop");
  EXPECT_EQ(env->joined.resume().job_id(), "job-000004");
  EXPECT_EQ(env->joined.resume().step(), 30);
}

TEST_F(EnvironmentTest, SeveralCoordinatorsAreKeptAndABadEntryIsNamed) {
  vars_["CHORUS_COORDINATOR"] = "10.0.0.1:29650,10.0.0.2:29650";
  absl::StatusOr<SessionEnvironment> env = Read();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->coordinator, "10.0.0.1:29650,10.0.0.2:29650");
  vars_["CHORUS_COORDINATOR"] = "10.0.0.1:29650,10.0.0.2";
  env = Read();
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(env.status().message().find("CHORUS_COORDINATOR: entry 2"), std::string::npos)
      << env.status();
}

TEST_F(EnvironmentTest, NoProgressChannelIsAllowed) {
  vars_.erase("CHORUS_PROGRESS_FD");
  vars_["CHORUS_RANK_HOST"] = "10.1.2.3";
  absl::StatusOr<SessionEnvironment> env = Read();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->progress_fd, -1);
  EXPECT_EQ(env->rank_host, "10.1.2.3");
}

TEST_F(EnvironmentTest, TheRanksIdentityForLaterGenerationsIsOptional) {
  absl::StatusOr<SessionEnvironment> without = Read();
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_EQ(without->agent_id, "");
  EXPECT_EQ(without->slot, -1);
  EXPECT_EQ(without->rank_pid, 0);
  vars_["CHORUS_AGENT_ID"] = "agent-2";
  vars_["CHORUS_SLOT"] = "3";
  vars_["CHORUS_RANK_PID"] = "4242";
  absl::StatusOr<SessionEnvironment> with = Read();
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(with->agent_id, "agent-2");
  EXPECT_EQ(with->slot, 3);
  EXPECT_EQ(with->rank_pid, 4242);
  vars_["CHORUS_SLOT"] = "-1";
  EXPECT_EQ(Read().status().message(), "CHORUS_SLOT must be an integer >= 0, got '-1'");
}

TEST_F(EnvironmentTest, EachMissingVariableIsNamedWithHowToRun) {
  for (const char* name :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CHORUS_COORDINATOR",
        "CHORUS_JOB_ID", "CHORUS_GENERATION", "CHORUS_STORE_NAMESPACE", "CHORUS_JOIN_FILE"}) {
    SetUp();
    vars_.erase(name);
    absl::StatusOr<SessionEnvironment> env = Read();
    ASSERT_FALSE(env.ok()) << name;
    EXPECT_EQ(env.status().code(), absl::StatusCode::kFailedPrecondition) << name;
    EXPECT_EQ(env.status().message().rfind(std::string(name) + " is not set", 0), 0)
        << env.status();
    EXPECT_NE(env.status().message().find("`program` job"), std::string::npos) << env.status();
  }
}

TEST_F(EnvironmentTest, BadNumbersAreNamed) {
  vars_["WORLD_SIZE"] = "two";
  EXPECT_EQ(Read().status().message(), "WORLD_SIZE must be an integer >= 1, got 'two'");
  SetUp();
  vars_["RANK"] = "-1";
  EXPECT_EQ(Read().status().message(), "RANK must be an integer >= 0, got '-1'");
  SetUp();
  vars_["CHORUS_PROGRESS_FD"] = "x";
  EXPECT_EQ(Read().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Read().status().message(), "CHORUS_PROGRESS_FD must be an integer >= 0, got 'x'");
  SetUp();
  vars_["RANK"] = "2";
  EXPECT_EQ(Read().status().message(), "RANK must be < WORLD_SIZE (2), got 2");
}

TEST_F(EnvironmentTest, JoinFileProblemsNameTheFile) {
  vars_["CHORUS_JOIN_FILE"] = join_file_ + ".missing";
  absl::StatusOr<SessionEnvironment> env = Read();
  EXPECT_EQ(env.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(env.status().message().find(join_file_ + ".missing"), std::string::npos);

  SetUp();
  std::ofstream(join_file_, std::ios::binary) << "\xff\xff\xff not a proto";
  env = Read();
  EXPECT_EQ(env.status().code(), absl::StatusCode::kDataLoss) << env.status();
  EXPECT_NE(env.status().message().find("CHORUS_JOIN_FILE " + join_file_), std::string::npos);
}

TEST_F(EnvironmentTest, VariablesThatDisagreeWithTheJoinFile) {
  vars_["RANK"] = "0";
  absl::StatusOr<SessionEnvironment> env = Read();
  EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(env.status().message().find("RANK/WORLD_SIZE (0/2) disagree"), std::string::npos)
      << env.status();
  SetUp();
  vars_["CHORUS_GENERATION"] = "4";
  env = Read();
  EXPECT_NE(env.status().message().find("CHORUS_GENERATION (4) disagrees"), std::string::npos)
      << env.status();
}

}  // namespace
}  // namespace chorus
