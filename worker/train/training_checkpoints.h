// The checkpoints of one training run: when they are due
// (CheckpointSchedule), what each rank contributes (the strategy's
// CheckpointParts), taking the snapshot (the only part that stalls
// training) and handing it to the background writer.
//
// Without storage every method does nothing, and no collective is issued.
//
// Thread-safety: the training thread calls every method; the writer runs
// the storage on its own thread. The methods that may issue collectives
// (AfterStep, AtEnd) must be called at the same points on every rank.
//
// Example:
//   TrainingCheckpoints checkpoints(options.checkpoints, spec.checkpoint(), *model, *strategy,
//   comm, progress);
//   ... after every step:
//   RETURN_IF_ERROR(checkpoints.AfterStep(position, total_steps));
//   ... after the last:
//   RETURN_IF_ERROR(checkpoints.AtEnd(position));
#ifndef CHORUS_WORKER_TRAIN_TRAINING_CHECKPOINTS_H_
#define CHORUS_WORKER_TRAIN_TRAINING_CHECKPOINTS_H_

#include <cstdint>
#include <future>
#include <memory>

#include "absl/status/status.h"
#include "chorus/communicator.h"
#include "chorus/v1/coordinator.pb.h"
#include "worker/runtime/training_progress.h"
#include "worker/train/checkpoint.h"
#include "worker/train/checkpoint_schedule.h"
#include "worker/train/model.h"
#include "worker/train/training_strategy.h"

namespace chorus {

class TrainingCheckpoints {
 public:
  // `storage` null: no checkpoints. Everything passed must outlive the
  // instance.
  TrainingCheckpoints(CheckpointStorage* storage, const v1::CheckpointSpec& spec, Model& model,
                      TrainingStrategy& strategy, Communicator& comm, TrainingProgress& progress);
  // Waits for the checkpoint being written (its error is lost: call AtEnd
  // to see it).
  ~TrainingCheckpoints();
  TrainingCheckpoints(const TrainingCheckpoints&) = delete;
  TrainingCheckpoints& operator=(const TrainingCheckpoints&) = delete;

  // After every step (`position` counts it): sets memory aside for the
  // first snapshot once the optimizer state exists, agrees on checkpoint
  // requests, and takes the checkpoint that is due, if any.
  absl::Status AfterStep(const TrainingPosition& position, int64_t total_steps);
  // After the last step: the final checkpoint (unless checkpoint.at_end is
  // false), then waits until every checkpoint is stored. The first error of
  // any store (periodic checkpoints skipped while the coordinator could not
  // be reached are none; the final one waits for it).
  absl::Status AtEnd(const TrainingPosition& position);

  // checkpoints_stored, checkpoints_skipped_busy,
  // checkpoints_skipped_unreachable (Note [Unreachable coordinator] in
  // checkpoint.h), checkpoint_store_retries and the last checkpoint's
  // stall, serialize and store seconds and bytes (nothing on ranks that do
  // not store).
  void AddMetrics(v1::Metrics& metrics) const;

 private:
  // CHECKPOINT_AND_HOLD: after the requested checkpoint of `step`, trains
  // no further; the coordinator stops the process.
  [[noreturn]] void HoldUntilStopped(int64_t step);
  // `final`: the run's last checkpoint; `force`: one asked for. Both wait
  // for an upload still running instead of skipping.
  absl::Status Take(const TrainingPosition& position, bool final, bool force);
  // checkpoint.per_rank: every rank stores its own model.
  absl::Status TakeOwnPart(const TrainingPosition& position, bool final, bool force);
  // Hands `snapshot` to the writer, keeping its memory for the next one.
  absl::Status Offer(Snapshot snapshot, absl::Time start, bool final);
  void TakeFirstSpare();

  CheckpointStorage* const storage_;
  CheckpointSchedule schedule_;
  Model& model_;
  TrainingStrategy& strategy_;
  Communicator& comm_;
  TrainingProgress& progress_;
  const CheckpointParts parts_;
  std::unique_ptr<CheckpointWriter> writer_;  // on ranks that store
  double stall_seconds_ = 0;
  // The previous snapshot's memory is reused once the writer is done with it.
  Snapshot spare_;
  // Memory for the first snapshot, allocated on another thread after the
  // first step (with periodic checkpoints): the first one then stalls only
  // for the copy, as the later ones do.
  std::future<Snapshot> first_spare_;
  bool first_spare_started_ = false;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_TRAINING_CHECKPOINTS_H_
