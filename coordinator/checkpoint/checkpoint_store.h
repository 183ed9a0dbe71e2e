// CheckpointStore: checkpoint files under --state_dir/checkpoints, made
// visible only by an atomic commit.
//
// Layout: <root>/<job>/<step, 12 digits>/<files> and MANIFEST (the manifest,
// binary proto). An upload writes into <root>/<job>/.staging-<step>-<n>/,
// checking every chunk's CRC-32C and each file's size and CRC-32C, and
// records each file's SHA-256 (what resumes check the stored file against); Commit
// fsyncs the files and the directory, renames it into place, fsyncs the
// parent, and only then records the manifest in SQLite (the source of
// truth; the commit point) and writes MANIFEST. Recover() (at start-up) deletes staging
// directories and step directories that no manifest names, so after a crash
// at any point readers see only complete checkpoints. Retention (keep_last)
// deletes old checkpoints only after a newer one is committed.
//
// checkpoint.storage SHARED_DIR: a rank writes its files itself into
// <shared_dir>/<job>/.staging-*/ (fsynced); AdoptStaged checks every file's
// size and CRC-32C there and the commit renames that directory to
// <shared_dir>/<job>/<step> — same protocol, other root. The manifest
// records the directory, and those files carry CRC-32C instead of SHA-256.
//
// Thread-safety: all methods may be called concurrently; one Upload object
// belongs to one upload stream.
//
// Example:
//   CheckpointStore store(state_dir + "/checkpoints", *state);
//   RETURN_IF_ERROR(store.Recover());
//   ASSIGN_OR_RETURN(auto upload, store.BeginUpload("job-000001", 500));
//   for (const auto& chunk : chunks) RETURN_IF_ERROR(upload->AddChunk(chunk));
//   ASSIGN_OR_RETURN(v1::CheckpointManifest m, upload->Commit(info, /*keep_last=*/3));
#ifndef CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_STORE_H_
#define CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_STORE_H_

#include <cstdio>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/state/state_store.h"

namespace chorus {

class CheckpointStore {
 public:
  // Points in the commit protocol where a test may stop the process.
  enum class Stage { kMidChunk, kBeforeFsync, kBeforeRename, kBeforeManifest, kAfterManifest };
  static const char* StageName(Stage stage);
  // Called at each Stage (tests crash the process there); null = nothing.
  using Failpoint = std::function<void(Stage)>;

  CheckpointStore(std::string root, StateStore& state, Failpoint failpoint = nullptr);
  ~CheckpointStore();  // finishes the removals queued by retention

  // Deletes what a crash left half done. Call before serving. `shared` lists
  // (shared_dir, job id) of jobs with storage SHARED_DIR: there, step
  // directories no manifest names are deleted, and staging directories
  // nobody has written to for `stale_after` (their writer is gone).
  struct SharedJob {
    std::string root;
    std::string job_id;
  };
  absl::Status Recover(const std::vector<SharedJob>& shared = {},
                       absl::Duration stale_after = absl::Minutes(10));

  class Upload {
   public:
    ~Upload();  // an upload that was not committed leaves nothing behind
    // Chunks of one file arrive in order (offset continuous); a file ends
    // with a chunk that has `last` and the file's size and CRC-32C.
    // INVALID_ARGUMENT / DATA_LOSS name the file and what was wrong.
    absl::Status AddChunk(const v1::CheckpointChunk& chunk);
    // Makes the checkpoint visible; `manifest` carries world_size, strategy,
    // spec_hash, generation (job_id, step and files are filled in here).
    // keep_last > 0 then drops all but the newest keep_last: their manifests
    // at once, their directories in the background (WaitForRemovals; a
    // crash before that leaves directories Recover deletes).
    absl::StatusOr<v1::CheckpointManifest> Commit(v1::CheckpointManifest manifest, int keep_last);
    // Moves the finished files of `other` (another upload of the same job
    // and step: one rank's part of a per-rank checkpoint) into this one.
    // INVALID_ARGUMENT for a file both hold or a file not finished.
    absl::Status Absorb(Upload& other);

   private:
    friend class CheckpointStore;
    Upload(CheckpointStore& store, std::string root, bool shared, std::string job_id, int64_t step,
           std::string staging)
        : store_(store),
          root_(std::move(root)),
          shared_(shared),
          job_id_(std::move(job_id)),
          step_(step),
          staging_(std::move(staging)) {}
    absl::Status FinishFile(const v1::CheckpointChunk& last);
    // Waits for the fsyncs of the finished files; the first error.
    absl::Status WaitForFsyncs();

    CheckpointStore& store_;
    // Where the step directory goes: the store's root, or a shared directory.
    const std::string root_;
    const bool shared_;
    const std::string job_id_;
    const int64_t step_;
    const std::string staging_;
    bool committed_ = false;
    std::vector<v1::CheckpointFile> files_;
    // The file being written.
    std::FILE* file_ = nullptr;
    std::string file_name_;
    int64_t written_ = 0;
    uint32_t crc_ =
        0;  // of the file so far, checked against the sender's; recorded in the manifest
    // fsync of each finished file, running beside the next file's chunks;
    // Commit (or Absorb, for the other part) waits for them.
    std::vector<std::future<absl::Status>> fsyncs_;
    // Where the time went, for the commit's log line.
    absl::Duration checking_;  // checksums of received chunks / reading staged files back
    absl::Duration writing_;   // write() of received data
    absl::Duration syncing_;   // waiting for the files' fsyncs
  };

  // INVALID_ARGUMENT for a bad job id or negative step; ALREADY_EXISTS if that
  // step is committed.
  absl::StatusOr<std::unique_ptr<Upload>> BeginUpload(const std::string& job_id, int64_t step);

  // SHARED_DIR: an upload of the files a rank wrote into
  // <shared_root>/<job_id>/<staging_dir>. `staging_dir` must be one path
  // component starting with ".staging-"; `files` (name, size, crc32c) must
  // be exactly what it holds. DATA_LOSS names a file that differs;
  // INVALID_ARGUMENT a bad name; ALREADY_EXISTS a committed step. Once
  // adopted, the directory belongs to the upload (deleted unless committed);
  // a refused one is left to its writer.
  absl::StatusOr<std::unique_ptr<Upload>> AdoptStaged(const std::string& shared_root,
                                                      const std::string& job_id, int64_t step,
                                                      const std::string& staging_dir,
                                                      const std::vector<v1::CheckpointFile>& files);

  // Committed manifests of `job_id`, oldest first.
  absl::StatusOr<std::vector<v1::CheckpointManifest>> List(const std::string& job_id);
  // The checkpoint to resume from: `step`, or the newest when 0, whose files
  // are all present with their recorded size and SHA-256. A broken one is
  // skipped (its reason appended to `skipped`) and the previous one tried;
  // NOT_FOUND when none is usable.
  absl::StatusOr<v1::CheckpointManifest> FindLoadable(const std::string& job_id, int64_t step,
                                                      std::vector<std::string>* skipped);
  // Path of `file` of a committed checkpoint.
  std::string FilePath(const v1::CheckpointManifest& manifest, const std::string& file) const;
  // Waits until the directories retention dropped so far are deleted.
  void WaitForRemovals();

 private:
  // ALREADY_EXISTS when the state database holds a manifest of the step
  // (Note [Manifest is the commit] in checkpoint_store.cc).
  absl::Status CheckNotCommitted(const std::string& job_id, int64_t step);
  std::string StepDir(const std::string& job_id, int64_t step) const;
  // Where a committed checkpoint's files are.
  std::string DirOf(const v1::CheckpointManifest& manifest) const;
  void Hit(Stage stage) {
    if (failpoint_) failpoint_(stage);
  }

  const std::string root_;
  StateStore& state_;
  const Failpoint failpoint_;
  absl::Mutex mu_;  // serializes commits and retention
  int64_t next_staging_ ABSL_GUARDED_BY(mu_) = 0;

  // Deleting a dropped checkpoint's files (~70 ms for 200 MB on ext4) is
  // not part of committing the next one: a thread does it.
  void RemoveLater(std::string dir);
  void RemoveLoop();
  absl::Mutex removal_mu_;
  std::deque<std::string> removals_ ABSL_GUARDED_BY(removal_mu_);
  bool removing_ ABSL_GUARDED_BY(removal_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(removal_mu_) = false;
  std::thread remover_;  // started by the first RemoveLater
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_CHECKPOINT_CHECKPOINT_STORE_H_
