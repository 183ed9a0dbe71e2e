// Storing a checkpoint through a coordinator that may be away for a while:
// the coordinator restarting (its process killed and started again on the
// same address and state directory) cuts the uploads it was taking and
// refuses connections until it is back. StoreRetrying calls
// CheckpointStorage::Store again, with backoff, while it fails for that kind
// of reason, for at most `give_up_after` from the first failure; any other
// failure is final at once.
//
// What counts as "the coordinator could not be reached" (worth another try):
// UNAVAILABLE (connection refused or cut, "Socket closed", the data port
// closed mid-upload, an upload token the restarted coordinator no longer
// knows: CoordinatorCheckpointStorage reports all of these so),
// DEADLINE_EXCEEDED (no answer in time) and CANCELLED (the call was cut at
// the coordinator's end). Everything else — a refused grant
// (FAILED_PRECONDITION), a checksum mismatch (DATA_LOSS, INVALID_ARGUMENT),
// a serialization error (INTERNAL) — would fail again the same way.
//
// An attempt may have been committed by the coordinator just before it went
// away, unanswered: when a retry is told the step is ALREADY_EXISTS, it was
// stored, and StoreRetrying says so (OK). The coordinator answers
// ALREADY_EXISTS only for a step whose manifest is durable in its database;
// the directory of a commit whose manifest write failed does not count, and
// the retry commits the step again (Note [Manifest is the commit] in
// coordinator/checkpoint/checkpoint_store.cc).
//
// A retry writes the files again from their sources (CheckpointFileSource
// may be called more than once). Nothing of a cut attempt stays behind: the
// coordinator deletes a staging directory at restart, or when its upload
// breaks.
//
// Thread-safety: StoreRetrying is reentrant; the storage's own contract
// applies to the calls it makes.
//
// Example:
//   StoreRetryOptions retry;
//   retry.give_up_after = absl::Minutes(1);
//   StoreRetryResult r = StoreRetrying(storage, /*step=*/100, files, retry);
//   if (r.gave_up_unreachable) ... skip it, training goes on
//   else if (!r.status.ok()) ... a real failure
#ifndef CHORUS_CHECKPOINT_STORE_RETRY_H_
#define CHORUS_CHECKPOINT_STORE_RETRY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "checkpoint/storage.h"
#include "common/clock.h"

namespace chorus {

// Whether a failed Store may succeed later with the same files: the
// coordinator could not be reached or restarted (see above).
bool IsCoordinatorUnreachable(const absl::Status& status);

struct StoreRetryOptions {
  // How long after the first failed attempt the last retry may start.
  // Zero: no retry.
  absl::Duration give_up_after = absl::Minutes(1);
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(2);
  // The random share of each sleep (Note [Backoff] in common/backoff.cc);
  // 0 = exactly initial_backoff, twice that, ... up to max_backoff.
  double jitter = 0.5;
  // Time and sleeping; null = the real clock.
  Clock* clock = nullptr;
};

struct StoreRetryResult {
  // OK once stored; else the last attempt's error, saying for how long the
  // coordinator could not be reached when that was why.
  absl::Status status;
  // Store calls made (1 = no retry).
  int attempts = 0;
  // The coordinator stayed unreachable for all of give_up_after: the
  // checkpoint was not stored, and nothing else went wrong.
  bool gave_up_unreachable = false;
};

// Stores `files` as checkpoint `step` in `storage`, retrying as above.
StoreRetryResult StoreRetrying(CheckpointStorage& storage, int64_t step,
                               const std::vector<CheckpointFileSource>& files,
                               const StoreRetryOptions& options);

}  // namespace chorus

#endif  // CHORUS_CHECKPOINT_STORE_RETRY_H_
