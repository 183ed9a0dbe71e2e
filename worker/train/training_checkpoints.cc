#include "worker/train/training_checkpoints.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <exception>
#include <iostream>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace chorus {

namespace {

// Note [Unreachable coordinator] in checkpoint.h.
CheckpointWriterOptions WriterOptions(const v1::CheckpointSpec& spec) {
  CheckpointWriterOptions options;
  if (spec.unreachable_retry_seconds() > 0) {
    options.periodic_give_up_after = absl::Seconds(spec.unreachable_retry_seconds());
  }
  options.final_give_up_after = std::max(absl::Minutes(1), options.periodic_give_up_after);
  return options;
}

}  // namespace

TrainingCheckpoints::TrainingCheckpoints(CheckpointStorage* storage, const v1::CheckpointSpec& spec,
                                         Model& model, TrainingStrategy& strategy,
                                         Communicator& comm, TrainingProgress& progress)
    : storage_(storage),
      schedule_(spec),
      model_(model),
      strategy_(strategy),
      comm_(comm),
      progress_(progress),
      parts_(strategy.checkpoint_parts()) {
  if (storage_ != nullptr && (comm_.rank() == 0 || parts_.per_rank)) {
    writer_ = std::make_unique<CheckpointWriter>(*storage_, WriterOptions(spec));
  }
}

TrainingCheckpoints::~TrainingCheckpoints() = default;

absl::Status TrainingCheckpoints::AfterStep(const TrainingPosition& position, int64_t total_steps) {
  if (writer_ != nullptr && schedule_.periodic() && !first_spare_started_) {
    // The optimizer's state exists now. The layout is read here, on the
    // training thread; the allocation runs beside the next steps.
    first_spare_started_ = true;
    // A model on a GPU is copied into pinned memory (Note [Asynchronous
    // device snapshots] in checkpoint.h).
    first_spare_ = std::async(std::launch::async, [layout = SnapshotLayout(model_,
                                                                           strategy_.optimizers()),
                                                   pinned = comm_.device().is_cuda()] {
      try {
        return AllocateLike(layout, pinned);
      } catch (const std::exception& e) {  // out of memory: the first snapshot allocates its own
        std::cerr << "could not set memory aside for the first checkpoint: " << e.what() << "\n";
        return Snapshot{};
      }
    });
  }
  if (storage_ == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(
      const std::optional<int64_t> agreed,
      strategy_.AgreedCheckpointRequests(position.step, progress_.checkpoint_request.load()));
  const bool requested = schedule_.NewRequest(agreed);
  const CheckpointSchedule::Due due = schedule_.AfterStep(position.step, total_steps, requested);
  if (!due.checkpoint) return absl::OkStatus();
  RETURN_IF_ERROR(Take(position, /*final=*/false, due.force));
  if (requested && progress_.hold_after_checkpoint.load()) HoldUntilStopped(position.step);
  return absl::OkStatus();
}

void TrainingCheckpoints::HoldUntilStopped(int64_t step) {
  // Note [Re-queue] in coordinator/scheduling/requeue_wait.h: the checkpoint
  // uploads in the background; the coordinator stops the rank once it has
  // committed. Training on would only train steps the resumed run trains
  // again. A rank that does not take the checkpoint (DDP's others) waits
  // in the next step's gradient all-reduce and applies nothing either.
  std::cerr << "preempted: checkpoint of step " << step
            << " taken; holding until the coordinator stops this rank\n";
  progress_.Enter(v1::CHECKPOINT);
  for (;;) absl::SleepFor(absl::Seconds(1));
}

absl::Status TrainingCheckpoints::AtEnd(const TrainingPosition& position) {
  if (schedule_.at_end()) RETURN_IF_ERROR(Take(position, /*final=*/true, /*force=*/false));
  if (writer_ != nullptr) return writer_->Drain();
  return absl::OkStatus();
}

absl::Status TrainingCheckpoints::Take(const TrainingPosition& position, bool final, bool force) {
  if (storage_ == nullptr) return absl::OkStatus();
  if (parts_.per_rank) return TakeOwnPart(position, final, force);
  // Only rank 0 stores; with every_rank_joins the others join the global
  // average it is taken of.
  const bool take =
      writer_ != nullptr && CheckpointSchedule::TakeNow(final, force, writer_->busy());
  if (writer_ != nullptr && !take)
    writer_->NoteSkipped();  // the previous one is still being written
  if (!take && !parts_.every_rank_joins) return absl::OkStatus();
  progress_.Enter(v1::CHECKPOINT);
  if (take && (final || force)) RETURN_IF_ERROR(writer_->Drain());
  const absl::Time start = absl::Now();
  if (take) TakeFirstSpare();
  Snapshot snapshot;
  RETURN_IF_ERROR(strategy_.WithGlobalAverage([&] {
    if (take) snapshot = TakeSnapshot(model_, strategy_.optimizers(), position, &spare_);
    return absl::OkStatus();
  }));
  if (!take) return absl::OkStatus();
  return Offer(std::move(snapshot), start, final);
}

absl::Status TrainingCheckpoints::TakeOwnPart(const TrainingPosition& position, bool final,
                                              bool force) {
  progress_.Enter(v1::CHECKPOINT);
  if (final || force) RETURN_IF_ERROR(writer_->Drain());
  // Every rank takes it or none does (a part missing would leave the
  // checkpoint incomplete): skipped if any rank is still uploading.
  at::Tensor busy = at::full({1}, writer_->busy() ? 1 : 0,
                             at::TensorOptions().dtype(at::kInt).device(comm_.device()));
  RETURN_IF_ERROR(comm_.AllReduce(busy, ReduceOp::kMax, "checkpoint/busy")
                      ->Wait(absl::Now() + absl::Minutes(5)));
  if (busy.item<int>() != 0) {
    writer_->NoteSkipped();
    return absl::OkStatus();
  }
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(const ExchangeState exchange, strategy_.TakeExchangeForCheckpoint());
  TakeFirstSpare();
  Snapshot snapshot = TakeSnapshot(model_, strategy_.optimizers(), position, &spare_, &exchange);
  snapshot.rank = comm_.rank();
  return Offer(std::move(snapshot), start, final);
}

absl::Status TrainingCheckpoints::Offer(Snapshot snapshot, absl::Time start, bool final) {
  stall_seconds_ = absl::ToDoubleSeconds(absl::Now() - start);
  spare_ = snapshot;  // the same tensors: written again only after the writer is idle
  writer_->Offer(std::move(snapshot), final);
  if (final) return writer_->Drain();
  return absl::OkStatus();
}

void TrainingCheckpoints::TakeFirstSpare() {
  if (first_spare_.valid()) spare_ = first_spare_.get();
}

void TrainingCheckpoints::AddMetrics(v1::Metrics& metrics) const {
  if (writer_ == nullptr) return;
  auto& values = *metrics.mutable_values();
  values["checkpoints_stored"] = writer_->stored();
  values["checkpoints_skipped_busy"] = writer_->skipped();
  values["checkpoints_skipped_unreachable"] = writer_->skipped_unreachable();
  values["checkpoint_store_retries"] = writer_->store_retries();
  values["checkpoint_stall_seconds"] = stall_seconds_;
  values["checkpoint_serialize_seconds"] = writer_->last_serialize_seconds();
  values["checkpoint_store_seconds"] = writer_->last_store_seconds();
  values["checkpoint_bytes"] = writer_->last_bytes();
}

}  // namespace chorus
