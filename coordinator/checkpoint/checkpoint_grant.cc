#include "coordinator/checkpoint/checkpoint_grant.h"

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "coordinator/state/job_manager.h"

namespace chorus {

UploadGrant UploadGrantFor(const v1::Job& job, int world_size, int64_t generation) {
  const v1::JobSpec& spec = job.spec();
  UploadGrant grant;
  grant.manifest.set_job_id(job.job_id());
  grant.manifest.set_world_size(world_size);
  grant.manifest.set_strategy(spec.strategy().has_decentralized() ? "decentralized" : "ddp");
  grant.manifest.set_spec_hash(JobManager::SpecHash(spec));
  grant.manifest.set_generation(generation);
  grant.manifest.set_per_rank(spec.checkpoint().per_rank() && spec.strategy().has_decentralized());
  grant.keep_last = JobManager::KeepLast(spec);
  if (spec.checkpoint().storage() == v1::CheckpointSpec::SHARED_DIR) {
    grant.shared_dir = SharedCheckpointRoot(spec.checkpoint());
  }
  return grant;
}

absl::StatusOr<UploadGrant> CheckUploader(const UploadGrant& grant, int64_t generation, int rank) {
  const v1::CheckpointManifest& manifest = grant.manifest;
  const std::string& job_id = manifest.job_id();
  if (generation != manifest.generation()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint upload from generation ", generation, " of ", job_id,
                     ", whose current generation is ", manifest.generation()));
  }
  if (manifest.per_rank() ? (rank < 0 || rank >= manifest.world_size()) : rank != 0) {
    return absl::FailedPreconditionError(
        manifest.per_rank() ? absl::StrCat("checkpoint upload from rank ", rank, " of ", job_id,
                                           ", which has ranks 0..", manifest.world_size() - 1)
                            : absl::StrCat("checkpoint upload from rank ", rank,
                                           "; only rank 0 uploads (replicas are identical)"));
  }
  return grant;
}

}  // namespace chorus
