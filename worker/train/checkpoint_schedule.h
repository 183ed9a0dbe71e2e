// When the training loop checkpoints: every checkpoint.every_steps steps
// (periodic), once per new `chorus checkpoint` request (requested), and at
// the end; and whether a rank that stores takes a snapshot now or skips it
// because the previous checkpoint is still being written.
//
// The rules, as numbers (every_steps 30, a run of 100 steps):
//   - after steps 30, 60 and 90 a periodic checkpoint is due; after step 100
//     none is: the final checkpoint (unless checkpoint.at_end is false)
//     stands for it. The same holds for a request agreed at step 100.
//   - a request agreed after step 45 makes a checkpoint due there, forced:
//     it waits for an upload still running instead of being skipped.
//   - a periodic checkpoint due while the previous one is still being
//     written is skipped (counted as checkpoints_skipped_busy).
// Requests are counts (TrainingProgress::checkpoint_request); each count
// beyond the last one handled triggers once, however many requests it
// covers.
//
// Thread-safety: not thread-safe; the training thread owns a schedule.
//
// Example:
//   CheckpointSchedule schedule(spec.checkpoint());
//   const bool requested = schedule.NewRequest(agreed_count);
//   CheckpointSchedule::Due due = schedule.AfterStep(step, total_steps, requested);
//   if (due.checkpoint) ... CheckpointSchedule::TakeNow(false, due.force, writer.busy())
#ifndef CHORUS_WORKER_TRAIN_CHECKPOINT_SCHEDULE_H_
#define CHORUS_WORKER_TRAIN_CHECKPOINT_SCHEDULE_H_

#include <cstdint>
#include <optional>

#include "chorus/v1/job.pb.h"

namespace chorus {

class CheckpointSchedule {
 public:
  // every_steps 0: no periodic checkpoints.
  CheckpointSchedule(int64_t every_steps, bool at_end)
      : every_steps_(every_steps), at_end_(at_end) {}
  // checkpoint.every_steps; checkpoint.at_end, true when unset.
  explicit CheckpointSchedule(const v1::CheckpointSpec& spec);

  // Whether `agreed` (the request count the ranks agreed on at this step;
  // nullopt when they did not check) holds a request not handled yet; if
  // so it is handled now.
  bool NewRequest(std::optional<int64_t> agreed);

  struct Due {
    bool checkpoint = false;
    // Requested: waits for the upload in flight instead of skipping.
    bool force = false;
  };
  // After `step` steps (counting the one just taken) of `total_steps`, with
  // `requested` from NewRequest.
  Due AfterStep(int64_t step, int64_t total_steps, bool requested) const;

  // Whether the run ends with a checkpoint.
  bool at_end() const { return at_end_; }
  // Whether checkpoints are taken every few steps.
  bool periodic() const { return every_steps_ > 0; }

  // Whether a rank that stores takes its snapshot now: the final and forced
  // checkpoints always (they wait for the writer), any other only when the
  // writer is idle.
  static bool TakeNow(bool final, bool force, bool writer_busy) {
    return final || force || !writer_busy;
  }

 private:
  const int64_t every_steps_;
  const bool at_end_;
  // The same start on every rank: a request that came during setup is
  // honoured at the first check.
  int64_t handled_requests_ = 0;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_CHECKPOINT_SCHEDULE_H_
