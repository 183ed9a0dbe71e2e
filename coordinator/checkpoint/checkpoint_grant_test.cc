#include "coordinator/checkpoint/checkpoint_grant.h"

#include "common/sha256.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

v1::Job JobWith(bool decentralized, bool per_rank) {
  v1::Job job;
  job.set_job_id("job-000004");
  if (decentralized) {
    job.mutable_spec()->mutable_strategy()->mutable_decentralized();
  } else {
    job.mutable_spec()->mutable_strategy()->mutable_ddp();
  }
  job.mutable_spec()->mutable_checkpoint()->set_per_rank(per_rank);
  return job;
}

TEST(CheckpointGrantTest, GrantCarriesTheManifestFieldsAndTheDefaults) {
  const v1::Job job = JobWith(/*decentralized=*/false, /*per_rank=*/false);
  const UploadGrant grant = UploadGrantFor(job, /*world_size=*/4, /*generation=*/2);
  EXPECT_EQ(grant.manifest.job_id(), "job-000004");
  EXPECT_EQ(grant.manifest.world_size(), 4);
  EXPECT_EQ(grant.manifest.strategy(), "ddp");
  EXPECT_EQ(grant.manifest.spec_hash(), Sha256Hex(job.spec().SerializeAsString()));
  EXPECT_EQ(grant.manifest.generation(), 2);
  EXPECT_FALSE(grant.manifest.per_rank());
  EXPECT_EQ(grant.keep_last, 3) << "checkpoint.keep_last defaults to 3";
  EXPECT_EQ(grant.shared_dir, "");
}

TEST(CheckpointGrantTest, KeepLastZeroSharedDirAndPerRank) {
  v1::Job job = JobWith(/*decentralized=*/true, /*per_rank=*/true);
  job.mutable_spec()->mutable_checkpoint()->set_keep_last(0);
  job.mutable_spec()->mutable_checkpoint()->set_storage(v1::CheckpointSpec::SHARED_DIR);
  job.mutable_spec()->mutable_checkpoint()->set_shared_dir("/mnt/ckpt");
  const UploadGrant grant = UploadGrantFor(job, 3, 1);
  EXPECT_EQ(grant.manifest.strategy(), "decentralized");
  EXPECT_TRUE(grant.manifest.per_rank());
  EXPECT_EQ(grant.keep_last, 0) << "0 keeps every checkpoint";
  EXPECT_EQ(grant.shared_dir, "/mnt/ckpt");
  // per_rank only means something for the decentralized strategy.
  EXPECT_FALSE(UploadGrantFor(JobWith(false, true), 3, 1).manifest.per_rank());
}

TEST(CheckpointGrantTest, OnlyRankZeroOfTheCurrentGenerationUploads) {
  const UploadGrant grant = UploadGrantFor(JobWith(false, false), 4, 2);
  EXPECT_TRUE(CheckUploader(grant, 2, 0).ok());
  absl::StatusOr<UploadGrant> stale = CheckUploader(grant, 1, 0);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stale.status().message(),
            "checkpoint upload from generation 1 of job-000004, whose current generation is 2");
  absl::StatusOr<UploadGrant> other = CheckUploader(grant, 2, 1);
  EXPECT_EQ(other.status().message(),
            "checkpoint upload from rank 1; only rank 0 uploads (replicas are identical)");
}

TEST(CheckpointGrantTest, PerRankAdmitsEveryRankOfTheJob) {
  const UploadGrant grant = UploadGrantFor(JobWith(true, true), 3, 1);
  for (int rank = 0; rank < 3; ++rank) EXPECT_TRUE(CheckUploader(grant, 1, rank).ok()) << rank;
  EXPECT_EQ(CheckUploader(grant, 1, 3).status().message(),
            "checkpoint upload from rank 3 of job-000004, which has ranks 0..2");
  EXPECT_EQ(CheckUploader(grant, 1, -1).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace chorus
