// CheckpointUploads: storing checkpoints on the coordinator, free of any
// transport. The gRPC CheckpointService (Upload stream, OpenUpload, Commit)
// and the raw-TCP CheckpointDataServer both go through it.
//
// An upload is granted first (who may upload: rank 0 of the job's current
// generation, or every rank with checkpoint.per_rank), then staged in the
// CheckpointStore (each file checked and fsynced as it arrives), then
// completed: committed as a checkpoint or, per rank, kept as that rank's
// part until the last part arrives and commits them all as one checkpoint.
// Parts of a step are dropped (deleted) when a part of a later step or
// another generation of the job arrives: that checkpoint can no longer
// complete. With checkpoint.storage SHARED_DIR the rank writes the files
// into the shared directory itself and CommitStaged adopts them.
//
// Uploads whose bytes come over the data port are opened first (Open): they
// wait, staged, for the connection that presents their one-time token
// (TakeOpened) for kOpenedUploadTtl at most.
//
// Thread-safety: all methods may be called concurrently. The store and the
// clock must outlive this object.
//
// Example:
//   CheckpointUploads uploads(store, [&](auto job, auto gen, auto rank) {
//     return scheduler.reads().GrantUpload(job, gen, rank); });
//   ASSIGN_OR_RETURN(CheckpointUploads::Started up, uploads.Begin(job, generation, rank, step));
//   for (const v1::CheckpointChunk& chunk : chunks) RETURN_IF_ERROR(up.upload->AddChunk(chunk));
//   ASSIGN_OR_RETURN(v1::UploadCheckpointResponse done, uploads.Complete(std::move(up)));
#ifndef CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_UPLOADS_H_
#define CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_UPLOADS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "common/clock.h"
#include "coordinator/checkpoint/checkpoint_grant.h"
#include "coordinator/checkpoint/checkpoint_store.h"

namespace chorus {

class CheckpointUploads {
 public:
  // Who may upload a checkpoint of `job_id` from `rank` of `generation` now
  // (ClusterReads::GrantUpload).
  using Granter = std::function<absl::StatusOr<UploadGrant>(const std::string& job_id,
                                                            int64_t generation, int rank)>;

  // How long an opened upload waits for its data connection.
  static constexpr absl::Duration kOpenedUploadTtl = absl::Minutes(1);
  // At most this many opened uploads wait at once.
  static constexpr size_t kMaxOpenedUploads = 64;

  // `clock` null = real time.
  CheckpointUploads(CheckpointStore& store, Granter grant, Clock* clock = nullptr);
  CheckpointUploads(const CheckpointUploads&) = delete;
  CheckpointUploads& operator=(const CheckpointUploads&) = delete;

  // A granted upload, staging its files.
  struct Started {
    UploadGrant grant;
    int64_t step = 0;
    int rank = 0;
    std::unique_ptr<CheckpointStore::Upload> upload;
  };
  // Checks the grant and starts staging `step`: the grant's error, or the
  // store's (ALREADY_EXISTS for a committed step).
  absl::StatusOr<Started> Begin(const std::string& job_id, int64_t generation, int rank,
                                int64_t step);
  // All files of `started` are in: commits them, or for per-rank
  // checkpoints keeps them as the rank's part and answers how many ranks are
  // still missing (the last part commits all of them).
  absl::StatusOr<v1::UploadCheckpointResponse> Complete(Started started);
  // checkpoint.storage SHARED_DIR: adopts the files the rank wrote into the
  // job's shared directory and completes them. FAILED_PRECONDITION for a job
  // that stores its checkpoints on the coordinator.
  absl::StatusOr<v1::UploadCheckpointResponse> CommitStaged(
      const v1::CommitCheckpointRequest& request);

  // The data port Open hands out; 0 (the default) = none.
  void set_data_port(int port);
  // Begins an upload whose bytes come over the data port; answers the port
  // and a one-time token. UNIMPLEMENTED without a data port,
  // RESOURCE_EXHAUSTED when kMaxOpenedUploads already wait.
  absl::StatusOr<v1::OpenUploadResponse> Open(const v1::OpenUploadRequest& request);
  // The upload `token` opened, taken (a token works once).
  // PERMISSION_DENIED for an unknown or expired token.
  absl::StatusOr<Started> TakeOpened(absl::string_view token);

 private:
  struct Opened {
    Started started;
    absl::Time expires;
  };
  struct Parts {
    int64_t generation = 0;
    // By rank; null where the part has not arrived.
    std::vector<std::unique_ptr<CheckpointStore::Upload>> by_rank;
  };

  absl::StatusOr<v1::UploadCheckpointResponse> AddPart(Started part);
  // Drops opened uploads past their expiry (their staging is deleted).
  void ExpireOpenedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(opened_mu_);

  CheckpointStore& store_;
  const Granter grant_;
  RealClock real_clock_;
  Clock* const clock_;

  absl::Mutex opened_mu_;
  int data_port_ ABSL_GUARDED_BY(opened_mu_) = 0;
  std::map<std::string, Opened> opened_ ABSL_GUARDED_BY(opened_mu_);  // by token

  absl::Mutex parts_mu_;
  std::map<std::pair<std::string, int64_t>, Parts> parts_
      ABSL_GUARDED_BY(parts_mu_);  // by (job, step)
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_UPLOADS_H_
