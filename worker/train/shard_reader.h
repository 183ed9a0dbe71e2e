// ShardReader: a rank's stream of batches from a sharded dataset
// (data.shards). The trainer hands it the rank's sample numbers for the rest
// of an epoch (the sampler's share of StreamOrder, sampler.h); background
// threads read those samples from the shard files, decode them into batch
// tensors and keep them in a queue bounded by data.shards.read_ahead_bytes,
// so that a step finds its batch ready when the disk keeps up. Two threads
// read batches in turn (Note [Parallel reads] in shard_pipeline.cc); the
// queue holds them in the stream's order.
//
// Only the rank's own samples are read; a second thread reads the bytes of
// the next read_ahead_bytes (at least 64 MiB) of them into the page cache
// in large forward reads, so that a cold disk streams (Note [Cold reads] in
// cold_read_advisor.cc).
// Memory: the queue and the batches being read (at most read_ahead_bytes
// together, or one batch when a batch is larger) and up to three batches
// more (being trained, just released, spare), plus the index
// (ShardIndex), whatever `Samples::next` holds (the trainer's StreamCursor:
// one shuffle block) and the places of the advisor's window of samples.
//
// The reader is made of parts, each in its own file:
// - ShardFormat (shard_format.h): the dataset's format (TAR, TOKENS or
//   TENSOR_FILES), chosen once by Open, reads and checks samples;
// - ShardPipeline (shard_pipeline.h): the reading threads, the queue and
//   the pool of batch buffers;
// - ColdReadAdvisor (cold_read_advisor.h): the thread that reads ahead into
//   the page cache;
// and the reader itself reads a group of samples in file order through the
// format (Note [Grouped reads] in shard_reader.cc) for the pipeline's
// threads.
//
// The position in the stream is not the reader's: it is the trainer's
// (epoch, samples of the epoch trained), which checkpoints and elastic
// re-formation carry as for in-memory data; Start() is called again with
// the re-sharded rest of the epoch (Note [Streamed order] in sampler.cc).
//
// Thread-safety: Start, Next and stats are called from one thread (the
// trainer's); the reader's own threads (reading, and reading ahead into the
// page cache) are joined by Start and the destructor.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> reader, ShardReader::Open(spec.data().shards(),
//   {})); StreamCursor cursor(reader->index().ShardSizes(), block, sampler, epoch);
//   reader->Start({cursor.size(), [cursor]() mutable { return cursor.Next(); }}, 64);
//   ASSIGN_OR_RETURN(ShardBatch batch, reader->Next());  // batch.x, batch.y, batch.indices
#ifndef CHORUS_WORKER_TRAIN_SHARD_READER_H_
#define CHORUS_WORKER_TRAIN_SHARD_READER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chorus/v1/job.pb.h"
#include "worker/train/cold_read_advisor.h"
#include "worker/train/data.h"
#include "worker/train/shard_batch.h"   // ShardBatch
#include "worker/train/shard_format.h"  // ShardReaderOptions
#include "worker/train/shard_index.h"
#include "worker/train/shard_pipeline.h"
#include "worker/train/tar_members.h"  // ParsePtMember, ParseTextLabel

namespace chorus {

class ShardReader {
 public:
  // Builds the index (ShardIndex::Build) and decodes the first sample, whose
  // types and shapes every other sample must have. Errors name the file.
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(const v1::ShardedData& spec,
                                                           const ShardReaderOptions& options);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const ShardIndex& index() const { return index_; }
  // The first sample as a one-sample Dataset (num_classes from the spec, or
  // the vocabulary for tokens): what Model::Build needs to know of the data.
  const Dataset& probe() const { return probe_; }

  // The sample numbers a Start() reads, in the order they are trained:
  // `count` of them, drawn one by one by `next`. The reader draws from a
  // copy of `next` to look ahead (Note [Cold reads] in cold_read_advisor.cc):
  // a copy continues from where the original is.
  using Samples = SampleStream;
  // Starts reading `samples` in batches of `batch_size`; drops whatever was
  // read ahead. REQUIRES: batch_size >= 1.
  void Start(Samples samples, int64_t batch_size);
  // The same for a list of sample numbers.
  void Start(std::vector<int64_t> indices, int64_t batch_size);
  // The next batch of the last Start(), waiting for it to be read. A read
  // or decode error names the file and byte offset; FAILED_PRECONDITION
  // past the last batch.
  absl::StatusOr<ShardBatch> Next();

  struct Stats {
    double wait_seconds = 0;  // Next() waiting for the reader, in total
    int64_t bytes_read = 0;   // from the shard files, in total
    int64_t reads = 0;        // the read calls that read them (Note [Grouped reads])
    // The most decoded bytes queued ahead or being read at once (the
    // read-ahead buffer's high-water mark).
    int64_t max_ready_bytes = 0;
  };
  Stats stats() const;

 private:
  // A reading thread's own: its shard files and the group it reads, in
  // file order (Note [Grouped reads] in shard_reader.cc).
  struct ReadingThread {
    ReadingThread(const ShardIndex& index, ReadCounts& counts) : files(index, counts) {}
    ShardFiles files;
    std::vector<Placement> order;
    std::vector<int64_t> positions, counts;  // sorting it (SortPositionsByIndex)
  };

  explicit ShardReader(ShardIndex index) : index_(std::move(index)) {}

  // ShardPipeline::ReadGroupFn: reads samples indices[0, n) into `batches`
  // on reading thread `thread`, in file order, through the format.
  absl::Status ReadGroup(int thread, const int64_t* indices, int64_t n, int64_t batch_size,
                         std::vector<ShardBatch>& batches);

  // Declared in the order they are built; the pipeline, whose threads use
  // all the others, is destroyed first.
  const ShardIndex index_;
  ReadCounts counts_;
  // One per reading thread; the first also reads Open()'s probe.
  std::vector<std::unique_ptr<ReadingThread>> threads_;
  std::unique_ptr<ShardFormat> format_;
  std::unique_ptr<ColdReadAdvisor> advisor_;
  std::unique_ptr<ShardPipeline> pipeline_;
  Dataset probe_;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_SHARD_READER_H_
