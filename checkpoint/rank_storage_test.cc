#include "checkpoint/rank_storage.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "checkpoint/coordinator_storage.h"
#include "checkpoint/shared_dir_storage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<grpc::Channel> Channel() {
  // Never connected: making storage talks to nobody.
  return grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials());
}

TEST(RankStorageTest, TheCoordinatorUnlessTheSpecNamesASharedDirectory) {
  v1::CheckpointSpec spec;
  absl::StatusOr<std::unique_ptr<CheckpointStorage>> storage =
      MakeRankCheckpointStorage(Channel(), spec, "127.0.0.1:29650", "job-000001", 1, 0);
  ASSERT_TRUE(storage.ok()) << storage.status();
  EXPECT_NE(dynamic_cast<CoordinatorCheckpointStorage*>(storage->get()), nullptr);

  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/shared";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << "the directory must exist: it is mounted, not made";
  spec.set_storage(v1::CheckpointSpec::SHARED_DIR);
  spec.set_shared_dir(dir);
  storage = MakeRankCheckpointStorage(Channel(), spec, "127.0.0.1:29650", "job-000001", 2, 1);
  ASSERT_TRUE(storage.ok()) << storage.status();
  EXPECT_NE(dynamic_cast<SharedDirCheckpointStorage*>(storage->get()), nullptr);
  struct stat st;
  EXPECT_EQ(stat((dir + "/job-000001").c_str(), &st), 0) << "the job's directory is made";
}

TEST(RankStorageTest, AnUnusableSharedDirectoryIsNamed) {
  v1::CheckpointSpec spec;
  spec.set_storage(v1::CheckpointSpec::SHARED_DIR);
  spec.set_shared_dir("/proc/chorus-no-such-dir");
  absl::StatusOr<std::unique_ptr<CheckpointStorage>> storage =
      MakeRankCheckpointStorage(Channel(), spec, "127.0.0.1:29650", "job-000001", 1, 0);
  EXPECT_EQ(storage.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(storage.status().message()), HasSubstr("checkpoint.shared_dir"));
}

}  // namespace
}  // namespace chorus
