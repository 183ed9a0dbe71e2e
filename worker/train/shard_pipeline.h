// ShardPipeline: a ShardReader's read-ahead (shard_reader.h). For each
// Start() it reads the batches of a stream of sample numbers on
// kReadThreads threads, each a group of batches at a time, into a queue
// that Next() empties in the stream's order (Note [Parallel reads] in
// shard_pipeline.cc); the batches queued or being read count against
// read_ahead_bytes. Batch buffers come from a BatchPool, which reuses them
// once neither the queue nor the trainer holds them (Note [Batch buffers]
// in shard_pipeline.cc). Each Start() also starts the ColdReadAdvisor's
// thread, and a reading thread claims samples only once the advisor has
// read them ahead (Note [Cold reads] in cold_read_advisor.cc).
//
// The pipeline knows no shard format: its ReadGroupFn (ShardReader's) reads
// a group's samples into their batches.
//
// Thread-safety: Start, Next, wait_seconds and max_ready_bytes are called
// from one thread (the trainer's); the pipeline's own threads are joined by
// Start and the destructor. BatchPool is thread-safe.
//
// Example:
//   ShardPipeline pipeline(read_ahead_bytes, format->batch_shape(), advisor, read_group);
//   pipeline.Start({count, [cursor]() mutable { return cursor.Next(); }}, 64);
//   ASSIGN_OR_RETURN(ShardBatch batch, pipeline.Next());
#ifndef CHORUS_WORKER_TRAIN_SHARD_PIPELINE_H_
#define CHORUS_WORKER_TRAIN_SHARD_PIPELINE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/train/cold_read_advisor.h"
#include "worker/train/shard_batch.h"

namespace chorus {

// The sample numbers a Start() reads, in the order they are trained:
// `count` of them, drawn one by one by `next`. The advisor draws from a copy
// of `next` to look ahead: a copy continues from where the original is.
struct SampleStream {
  int64_t count = 0;
  std::function<int64_t()> next;
};

// Batch buffers that the reading threads share and reuse (Note [Batch
// buffers] in shard_pipeline.cc). Thread-safe.
class BatchPool {
 public:
  explicit BatchPool(BatchShape shape) : shape_(std::move(shape)) {}
  BatchPool(const BatchPool&) = delete;
  BatchPool& operator=(const BatchPool&) = delete;

  // A batch of `n` samples whose tensors nobody else holds: of the pooled
  // ones that are free, the one handed out last (the likeliest to be in
  // the CPU's cache); else a new one, which the pool keeps while it holds
  // fewer batches than its limit.
  ShardBatch NewBatch(int64_t n);
  // NewBatch for each batch of samples indices[0, n), `batch_size` each
  // but the last, into `out` (cleared first), their sample numbers set.
  void NewBatches(const int64_t* indices, int64_t n, int64_t batch_size,
                  std::vector<ShardBatch>& out);
  // `batch` is handed to the trainer now.
  void Handed(const ShardBatch& batch);
  // For a Start() of batches of `batch_size`: drops the pooled batches of
  // other sizes (an epoch's last, shorter batch) and keeps new ones while
  // the pool holds fewer than `limit`.
  void Restart(int64_t batch_size, int64_t limit);

 private:
  struct Pooled {
    ShardBatch batch;
    int64_t handed = 0;  // when Handed() was last called for it (a count of calls)
  };
  const BatchShape shape_;
  absl::Mutex mu_;
  std::vector<Pooled> pool_ ABSL_GUARDED_BY(mu_);
  int64_t handed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t limit_ ABSL_GUARDED_BY(mu_) = 0;
};

class ShardPipeline {
 public:
  // Note [Parallel reads] in shard_pipeline.cc.
  static constexpr int kReadThreads = 2;

  // Reads samples indices[0, n) into `batches` (the group's, from the pool:
  // `batch_size` samples each but the last, their sample numbers set) on
  // reading thread `thread`, 0 <= thread < kReadThreads, one call at a time
  // for each. On an error `batches` keeps those before the first batch with
  // one, and the error is returned.
  using ReadGroupFn =
      std::function<absl::Status(int thread, const int64_t* indices, int64_t n, int64_t batch_size,
                                 std::vector<ShardBatch>& batches)>;

  // Batches of `shape`; at most `read_ahead_bytes` of them queued or being
  // read (or one batch, when a batch is larger). REQUIRES: `advisor`
  // outlives the pipeline, and `read_group` may be called until it is
  // destroyed.
  ShardPipeline(int64_t read_ahead_bytes, BatchShape shape, const ColdReadAdvisor& advisor,
                ReadGroupFn read_group);
  ~ShardPipeline();
  ShardPipeline(const ShardPipeline&) = delete;
  ShardPipeline& operator=(const ShardPipeline&) = delete;

  BatchPool& pool() { return pool_; }

  // Starts reading `samples` in batches of `batch_size`; drops whatever was
  // read ahead. REQUIRES: batch_size >= 1.
  void Start(SampleStream samples, int64_t batch_size);
  // The next batch of the last Start(), waiting for it to be read. A read
  // error once the batches before it are returned; FAILED_PRECONDITION past
  // the last batch.
  absl::StatusOr<ShardBatch> Next();

  // Next() waiting for the reading threads, in total.
  double wait_seconds() const;
  // The most decoded bytes queued ahead or being read at once.
  int64_t max_ready_bytes() const;

 private:
  // The advisor's side of the handshake with the reading threads.
  class Progress final : public ReadingProgress {
   public:
    explicit Progress(ShardPipeline& pipeline) : pipeline_(pipeline) {}
    std::optional<int64_t> AwaitWindow(int64_t window, int64_t at_least) override;
    void Advised(int64_t advised) override;

   private:
    ShardPipeline& pipeline_;
  };

  // Stops and joins the threads.
  void Stop();
  // A reading thread (Note [Parallel reads] in shard_pipeline.cc).
  void Run(int thread);
  // Where the next group a reading thread claims ends (a position of the
  // stream; Note [Grouped reads] in shard_reader.cc).
  int64_t GroupEnd() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where the advisor's window of `window` samples ends.
  int64_t WindowEnd(int64_t window) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t read_ahead_bytes_;
  const BatchShape shape_;
  const ColdReadAdvisor& advisor_;
  const ReadGroupFn read_group_;
  BatchPool pool_;
  Progress progress_{*this};

  mutable absl::Mutex mu_;
  std::deque<ShardBatch> ready_ ABSL_GUARDED_BY(mu_);
  int64_t ready_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // queued and being read
  int64_t max_ready_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t batches_left_ ABSL_GUARDED_BY(mu_) = 0;  // not yet taken by Next()
  double wait_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  // Note [Parallel reads]: the samples of the last Start(), drawn by the
  // reading threads a batch at a time, the batch size, and the batches of
  // the Start() claimed by a reading thread and put in the queue so far.
  SampleStream samples_ ABSL_GUARDED_BY(mu_);
  int64_t batch_size_ ABSL_GUARDED_BY(mu_) = 1;
  // Note [Grouped reads] in shard_reader.cc: the batches a reading thread
  // claims at once.
  int64_t group_batches_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t claimed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t reading_at_ ABSL_GUARDED_BY(mu_) = 0;  // the first sample not yet claimed
  int64_t advised_ ABSL_GUARDED_BY(mu_) = 0;     // samples the advisor has read ahead
  std::vector<std::thread> readers_;
  std::thread advisor_thread_;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_SHARD_PIPELINE_H_
