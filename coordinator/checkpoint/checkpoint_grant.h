// Checkpoint grants: who may store a checkpoint of a running job, and what
// the coordinator fills into its manifest.
//
// A job's grant is made when its generation starts (UploadGrantFor): world
// size, strategy, spec hash and generation for the manifest, the job's
// keep_last and, with checkpoint.storage SHARED_DIR, its shared directory.
// CheckUploader then admits rank 0 of the current generation (DDP replicas
// are identical), or with checkpoint.per_rank (decentralized) every rank of
// it, each bringing its own part.
//
// Thread-safety: plain values and pure functions.
//
// Example:
//   UploadGrant grant = UploadGrantFor(job, /*world_size=*/4, /*generation=*/1);
//   ASSIGN_OR_RETURN(UploadGrant mine, CheckUploader(grant, generation, rank));
#ifndef CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_GRANT_H_
#define CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_GRANT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "chorus/v1/coordinator.pb.h"

namespace chorus {

struct UploadGrant {
  // job_id, world size, strategy, spec hash, generation, per_rank (the
  // store fills in step and files).
  v1::CheckpointManifest manifest;
  int keep_last = 0;
  // checkpoint.storage SHARED_DIR: the job's shared directory; else empty.
  std::string shared_dir;
};

// The grant of `job` running `world_size` ranks in `generation`.
UploadGrant UploadGrantFor(const v1::Job& job, int world_size, int64_t generation);

// `grant` if rank `rank` of `generation` may upload under it now;
// FAILED_PRECONDITION naming the current generation, or the ranks that may.
absl::StatusOr<UploadGrant> CheckUploader(const UploadGrant& grant, int64_t generation, int rank);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_GRANT_H_
