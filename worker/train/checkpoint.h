// Checkpoints on the worker side: what a checkpoint holds, taking it (the
// only part that blocks training: copying tensors into CPU memory), writing
// it out in the background, and restoring from it.
//
// A checkpoint is two files, each a dict of named tensors in the format of
// torch::pickle_save (worker/tensor_file/tensor_file.h; Python's torch.load
// reads them):
//   model.pt        parameters and buffers by name — the exported state dict
//   train_state.pt  "optim.<i>.<field>" optimizer state of model parameter i,
//                   "meta.step", "meta.epoch", "meta.epoch_offset" (samples of
//                   that epoch already trained, across all ranks),
//                   "meta.world_size", for sharded data
//                   "meta.shard_fingerprints" (int64, one per shard); with
//                   checkpoint.per_rank also
//                   "exchange.<parameter>" and "meta.exchange_pair" (the
//                   decentralized exchange received and not yet mixed in;
//                   Note [Exchange in checkpoints] in
//                   decentralized_data_parallel.h)
// With checkpoint.per_rank every rank writes its own pair: rank 0's under
// the names above, rank r's as model.rank<r>.pt and train_state.rank<r>.pt.
// Random state is not saved: the trainer reseeds from (seed, rank, step)
// every step, so a resumed run draws what an uninterrupted one would.
//
// The file names are checkpoint/layout.h's; where the files go is a
// CheckpointStorage (checkpoint/storage.h). Files are serialized while they
// are written (CheckpointFileSource): the storage pulls the bytes piece by
// piece straight out of the snapshot's tensors, so no serialized copy of the checkpoint is ever
// held in memory (fresh memory is expensive: page faults, not copying, dominated when a 200 MB
// checkpoint was first pickled into a buffer and then written).
//
// Thread-safety: CheckpointWriter's methods are called by the training
// thread; its storage runs on the writer's own thread.
#ifndef CHORUS_WORKER_TRAIN_CHECKPOINT_H_
#define CHORUS_WORKER_TRAIN_CHECKPOINT_H_

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "checkpoint/layout.h"
#include "checkpoint/storage.h"
#include "chorus/v1/coordinator.pb.h"
#include "common/clock.h"
#include "worker/train/device_fence.h"
#include "worker/train/model.h"

namespace torch::optim {
class Optimizer;
}

namespace chorus {

struct TrainingPosition {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t epoch_offset = 0;  // samples of `epoch` trained so far, all ranks together
  int64_t world_size = 1;
  // Sharded data: the shards' fingerprints (ShardIndex::Fingerprints), so
  // that a resume over other shards fails (Note [Shard fingerprints] in
  // shard_index.cc); empty for data in memory.
  std::vector<int64_t> shard_fingerprints;
};

// What a decentralized rank received in the last exchange and has not mixed
// in yet, by parameter name (saved only with checkpoint.per_rank).
struct ExchangeState {
  bool pair = false;
  std::vector<NamedTensor> received;
};

// Tensors copied out of the live model and optimizer.
struct Snapshot {
  TrainingPosition position;
  int rank = 0;  // whose files these become (ModelFileName)
  std::vector<std::pair<std::string, at::Tensor>> model;
  std::vector<std::pair<std::string, at::Tensor>> train_state;
  // Set when the copies into host memory were only queued on a GPU: read
  // the tensors after ready->Wait() (CheckpointWriter does). Declared last,
  // so that it is destroyed first: its destructor waits for the copies
  // before the memory they write can be freed.
  std::shared_ptr<DeviceFence> ready;
};

// Copies parameters, buffers and the optimizers' state (SGD, Adam, AdamW,
// AccumAdam(W)),
// filed under the parameter's index in model.Parameters() (one optimizer
// for DDP, one per bucket for decentralized training). Without `reuse` the
// copies stay on the tensors' device (the state an elastic rank holds
// across generations). With `reuse` (an earlier snapshot nobody reads any
// more; may be empty) they go to host memory, the checkpoint's: tensors of
// the same name, shape and dtype are copied into its memory instead of
// fresh memory: no allocation and no page faults, so the copy runs at
// memory speed. From a GPU the copies go to pinned memory and are only
// queued (Note [Asynchronous device snapshots]): `ready` is set.
// `exchange` (may be null) is saved too.
Snapshot TakeSnapshot(Model& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                      const TrainingPosition& position, const Snapshot* reuse = nullptr,
                      const ExchangeState* exchange = nullptr);
// The tensors TakeSnapshot would copy now, by name, as shapes and types
// only (meta tensors, no memory); cheap, for AllocateLike on another
// thread.
Snapshot SnapshotLayout(Model& model, const std::vector<torch::optim::Optimizer*>& optimizers);
// Memory for a snapshot of `layout`'s tensors, each written once so that
// its pages are faulted in: as TakeSnapshot's `reuse`, the first snapshot
// is then a copy at memory speed too (allocating ~200 MB of fresh memory
// took ~0.35 s of the first checkpoint's stall on the development VM).
// `pinned`: page-locked memory, for a model on a GPU (needs a CUDA
// LibTorch).
Snapshot AllocateLike(const Snapshot& layout, bool pinned = false);

// Note [Asynchronous device snapshots]
// A checkpoint of a model on a GPU must not stall training for a
// synchronous .cpu() per tensor. TakeSnapshot queues each copy on the
// training stream into pinned host memory (the reused snapshot's, so no
// allocation in steady state) and records a DeviceFence after them; the
// training thread goes on at once. The optimizer's next update is queued
// behind the copies on the same stream, so the copies read the step's
// state: the stall is the copies' time on the GPU (tens of GB/s), not a
// host round trip per tensor. The writer's thread waits for the fence
// before it serializes; a snapshot dropped early waits in its destructor.
// The copies of an elastic rank's held state stay on the GPU (clones),
// and serializing any GPU tensor (ShareNewestState) copies it to the host
// first, so a checkpoint file always holds CPU tensors.
// Restore copies into the live tensors wherever they are and puts the
// optimizer's state on its parameter's device.
// The two files of a snapshot, serialized as they are written; they refer
// to `snapshot`, which must outlive them.
std::vector<CheckpointFileSource> StreamFiles(const Snapshot& snapshot);
// Loads `files` (kModelFile and kTrainStateFile) into the model and
// optimizer; returns the position, and the saved exchange into `exchange`
// if not null. Errors name the file and the tensor that does not fit.
absl::StatusOr<TrainingPosition> Restore(const std::vector<CheckpointFileData>& files, Model& model,
                                         const std::vector<torch::optim::Optimizer*>& optimizers,
                                         ExchangeState* exchange = nullptr);

// How CheckpointWriter stores through a coordinator that cannot be reached
// for a while (restarting, say).
//
// Note [Unreachable coordinator]
// checkpoint/store_retry.h retries the store with backoff. A periodic or requested
// checkpoint that still cannot be stored after periodic_give_up_after is
// skipped — training goes on, skipped_unreachable() counts it — because
// losing one checkpoint costs at most every_steps steps of recomputation
// after a crash, while failing the job costs all of them. The final
// checkpoint is the run's result: it waits up to final_give_up_after (as the
// rank's final report waits for the coordinator), and then fails the run.
// Other errors (a refused grant, damaged data) fail the run as before.
struct CheckpointWriterOptions {
  absl::Duration periodic_give_up_after = absl::Minutes(1);
  absl::Duration final_give_up_after = absl::Minutes(1);
  // Time and sleeping between retries; null = the real clock.
  Clock* clock = nullptr;
};

// Serializes and stores snapshots on its own thread, one at a time.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(CheckpointStorage& storage, CheckpointWriterOptions options = {});
  ~CheckpointWriter();  // waits for the checkpoint in flight

  // Hands `snapshot` over unless one is still being written: then it is
  // dropped, counted in skipped(), and false returned. `final`: the run's
  // last checkpoint (Note [Unreachable coordinator]).
  bool Offer(Snapshot snapshot, bool final = false);
  // Waits until nothing is in flight; the first error of any store so far
  // (a periodic checkpoint skipped because the coordinator could not be
  // reached is no error).
  absl::Status Drain();
  // Whether a checkpoint is being written now (then the next would be
  // skipped: NoteSkipped() counts it without taking a snapshot).
  bool busy() const;
  void NoteSkipped();
  int64_t skipped() const;
  int64_t stored() const;
  // Periodic checkpoints given up because the coordinator could not be
  // reached, and store attempts repeated for any checkpoint so far.
  int64_t skipped_unreachable() const;
  int64_t store_retries() const;
  // The last stored checkpoint: seconds spent serializing it (the CPU time
  // of turning tensors into file bytes), seconds spent storing it (everything
  // else from handing it to the storage until it returned: writing or
  // uploading the bytes, fsync, commit), and its size in bytes. The two run
  // interleaved (files are serialized while they are written); their sum is
  // the checkpoint's background time.
  double last_serialize_seconds() const;
  double last_store_seconds() const;
  int64_t last_bytes() const;

 private:
  void Loop();

  CheckpointStorage& storage_;
  const CheckpointWriterOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Snapshot> pending_;
  bool pending_final_ = false;
  bool busy_ = false;
  bool stop_ = false;
  int64_t skipped_ = 0;
  int64_t stored_ = 0;
  int64_t skipped_unreachable_ = 0;
  int64_t store_retries_ = 0;
  double last_serialize_seconds_ = 0;
  double last_store_seconds_ = 0;
  int64_t last_bytes_ = 0;
  absl::Status error_;
  std::thread thread_;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_CHECKPOINT_H_
