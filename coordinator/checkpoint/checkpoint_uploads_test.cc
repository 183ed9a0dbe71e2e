#include "coordinator/checkpoint/checkpoint_uploads.h"

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "coordinator/checkpoint/checkpoint_grant.h"
#include "coordinator/state/state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

// One whole file as a single chunk.
v1::CheckpointChunk WholeFile(const std::string& name, const std::string& data) {
  v1::CheckpointChunk c;
  c.set_file_name(name);
  c.set_data(data);
  c.set_chunk_crc32c(Crc32c(data));
  c.set_last(true);
  c.set_file_size(data.size());
  c.set_file_crc32c(Crc32c(data));
  return c;
}

v1::Job JobOf(const std::string& id, bool per_rank, int keep_last) {
  v1::Job job;
  job.set_job_id(id);
  if (per_rank) job.mutable_spec()->mutable_strategy()->mutable_decentralized();
  job.mutable_spec()->mutable_checkpoint()->set_per_rank(per_rank);
  job.mutable_spec()->mutable_checkpoint()->set_keep_last(keep_last);
  return job;
}

class CheckpointUploadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/uploads_" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir);
    state_ = *StateStore::Open(dir);
    store_ = std::make_unique<CheckpointStore>(dir + "/checkpoints", *state_);
    uploads_ = std::make_unique<CheckpointUploads>(
        *store_,
        [this](const std::string& job_id, int64_t generation,
               int rank) -> absl::StatusOr<UploadGrant> {
          auto it = grants_.find(job_id);
          if (it == grants_.end())
            return absl::FailedPreconditionError(absl::StrCat(job_id, " is not running"));
          return CheckUploader(it->second, generation, rank);
        },
        &clock_);
  }

  // Uploads `files` as `rank` of generation 1 and completes the upload.
  absl::StatusOr<v1::UploadCheckpointResponse> Upload(
      const std::string& job, int64_t step, int rank,
      const std::map<std::string, std::string>& files) {
    absl::StatusOr<CheckpointUploads::Started> started = uploads_->Begin(job, 1, rank, step);
    if (!started.ok()) return started.status();
    for (const auto& [name, data] : files) {
      if (absl::Status s = started->upload->AddChunk(WholeFile(name, data)); !s.ok()) return s;
    }
    return uploads_->Complete(*std::move(started));
  }

  std::vector<int64_t> Steps(const std::string& job) {
    std::vector<int64_t> steps;
    const auto all = store_->List(job);
    for (const auto& m : *all) steps.push_back(m.step());
    return steps;
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  std::unique_ptr<StateStore> state_;
  std::unique_ptr<CheckpointStore> store_;
  std::map<std::string, UploadGrant> grants_;
  std::unique_ptr<CheckpointUploads> uploads_;
};

TEST_F(CheckpointUploadsTest, BeginChecksTheGrant) {
  EXPECT_EQ(uploads_->Begin("job-000001", 1, 0, 10).status().message(),
            "job-000001 is not running");
  grants_["job-000001"] = UploadGrantFor(JobOf("job-000001", false, 3), 2, 1);
  absl::StatusOr<CheckpointUploads::Started> rank1 = uploads_->Begin("job-000001", 1, 1, 10);
  EXPECT_EQ(rank1.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(rank1.status().message(), HasSubstr("only rank 0 uploads"));
  absl::StatusOr<CheckpointUploads::Started> rank0 = uploads_->Begin("job-000001", 1, 0, 10);
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  EXPECT_EQ(rank0->step, 10);
  EXPECT_EQ(rank0->grant.keep_last, 3);
}

TEST_F(CheckpointUploadsTest, CompleteCommitsWithTheGrantsManifestAndKeepLast) {
  grants_["job-000001"] = UploadGrantFor(JobOf("job-000001", false, /*keep_last=*/1), 2, 1);
  absl::StatusOr<v1::UploadCheckpointResponse> first =
      Upload("job-000001", 10, 0, {{"model.pt", "w10"}});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->manifest().job_id(), "job-000001");
  EXPECT_EQ(first->manifest().step(), 10);
  EXPECT_EQ(first->manifest().world_size(), 2);
  EXPECT_EQ(first->manifest().strategy(), "ddp");
  ASSERT_EQ(first->manifest().files_size(), 1);
  ASSERT_TRUE(Upload("job-000001", 20, 0, {{"model.pt", "w20"}}).ok());
  EXPECT_EQ(Steps("job-000001"), std::vector<int64_t>{20}) << "keep_last 1 keeps the newest only";
  EXPECT_EQ(Upload("job-000001", 20, 0, {{"model.pt", "again"}}).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(CheckpointUploadsTest, PerRankPartsCommitTogetherWhenTheLastArrives) {
  grants_["job-000002"] = UploadGrantFor(JobOf("job-000002", true, 0), 3, 1);
  absl::StatusOr<v1::UploadCheckpointResponse> part =
      Upload("job-000002", 5, 2, {{"model.rank2.pt", "r2"}});
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->ranks_missing(), 2);
  EXPECT_FALSE(part->has_manifest());
  EXPECT_EQ(Upload("job-000002", 5, 2, {{"model.rank2.pt", "r2"}}).status().message(),
            "checkpoint job-000002 step 5: rank 2 already uploaded its part");
  part = Upload("job-000002", 5, 0, {{"model.rank0.pt", "r0"}});
  EXPECT_EQ(part->ranks_missing(), 1);
  EXPECT_TRUE(Steps("job-000002").empty());
  part = Upload("job-000002", 5, 1, {{"model.rank1.pt", "r1"}});
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->ranks_missing(), 0);
  EXPECT_EQ(part->manifest().files_size(), 3);
  EXPECT_EQ(Steps("job-000002"), std::vector<int64_t>{5});
}

TEST_F(CheckpointUploadsTest, ALaterStepDropsTheEarlierPartsOfThatJobOnly) {
  grants_["job-000002"] = UploadGrantFor(JobOf("job-000002", true, 0), 2, 1);
  grants_["job-000003"] = UploadGrantFor(JobOf("job-000003", true, 0), 2, 1);
  ASSERT_EQ(Upload("job-000002", 10, 0, {{"model.rank0.pt", "a"}})->ranks_missing(), 1);
  ASSERT_EQ(Upload("job-000003", 10, 0, {{"model.rank0.pt", "b"}})->ranks_missing(), 1);
  // job-000002 moves on to step 20: its step-10 part can no longer complete.
  ASSERT_EQ(Upload("job-000002", 20, 1, {{"model.rank1.pt", "c"}})->ranks_missing(), 1);
  EXPECT_EQ(Upload("job-000002", 10, 1, {{"model.rank1.pt", "d"}})->ranks_missing(), 1)
      << "rank 0's step-10 part was dropped";
  // Another job's parts are untouched.
  absl::StatusOr<v1::UploadCheckpointResponse> other =
      Upload("job-000003", 10, 1, {{"model.rank1.pt", "e"}});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->ranks_missing(), 0);
  EXPECT_EQ(Steps("job-000003"), std::vector<int64_t>{10});
}

TEST_F(CheckpointUploadsTest, OpenNeedsADataPortAndATokenWorksOnceWithinItsTtl) {
  grants_["job-000001"] = UploadGrantFor(JobOf("job-000001", false, 3), 1, 1);
  v1::OpenUploadRequest request;
  request.set_job_id("job-000001");
  request.set_generation(1);
  request.set_rank(0);
  request.set_step(7);
  EXPECT_EQ(uploads_->Open(request).status().code(), absl::StatusCode::kUnimplemented);
  uploads_->set_data_port(4242);
  absl::StatusOr<v1::OpenUploadResponse> opened = uploads_->Open(request);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->port(), 4242);
  EXPECT_EQ(opened->token().size(), 32u);
  absl::StatusOr<CheckpointUploads::Started> taken = uploads_->TakeOpened(opened->token());
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->step, 7);
  EXPECT_EQ(uploads_->TakeOpened(opened->token()).status().code(),
            absl::StatusCode::kPermissionDenied);

  request.set_step(8);
  opened = uploads_->Open(request);
  ASSERT_TRUE(opened.ok()) << opened.status();
  clock_.Advance(CheckpointUploads::kOpenedUploadTtl);
  absl::StatusOr<CheckpointUploads::Started> expired = uploads_->TakeOpened(opened->token());
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(expired.status().message(), HasSubstr("unknown or expired upload token"));
}

TEST_F(CheckpointUploadsTest, CommitStagedIsForSharedDirectoriesOnly) {
  grants_["job-000001"] = UploadGrantFor(JobOf("job-000001", false, 3), 1, 1);
  v1::CommitCheckpointRequest request;
  request.set_job_id("job-000001");
  request.set_generation(1);
  request.set_step(3);
  absl::StatusOr<v1::UploadCheckpointResponse> done = uploads_->CommitStaged(request);
  EXPECT_EQ(done.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(done.status().message(),
              HasSubstr("job job-000001 stores its checkpoints on the coordinator"));
}

}  // namespace
}  // namespace chorus
