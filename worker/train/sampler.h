// DistributedSampler: which samples each rank trains on in each epoch.
//
// Every epoch the sample order is shuffled from (seed, epoch) — the same
// permutation on every rank — and cut into world_size interleaved shards, so
// every sample is seen exactly once per epoch across ranks. Samples that do
// not fill a whole global batch are dropped (DROP) or padded with samples
// from the start of the permutation (PAD); either way every rank gets the
// same number of full batches, which keeps collectives in step.
//
// Streamed (sharded) datasets use the same sharding over another order:
// StreamOrder's, in which consecutive positions stay in one shard, so a
// rank reads its share of a shard while the shard is read, instead of
// jumping across all files (Note [Streamed order] in sampler.cc).
//
// Thread-compatible; pure function of its arguments.
#ifndef CHORUS_WORKER_TRAIN_SAMPLER_H_
#define CHORUS_WORKER_TRAIN_SAMPLER_H_

#include <cstdint>
#include <random>
#include <vector>

namespace chorus {

struct SamplerOptions {
  int64_t num_samples = 0;
  int world_size = 1;
  int rank = 0;
  int64_t batch_size = 1;  // per rank
  uint64_t seed = 0;
  bool shuffle = true;
  bool pad = false;  // false: drop the remainder
  // Samples of this epoch already trained (by any world size): the first
  // `start` of the epoch's permutation are skipped, the rest sharded.
  int64_t start = 0;
  // How the rest is dealt out: `chunk` consecutive positions at a time,
  // rank after rank. 1 deals sample by sample; batch_size deals whole
  // micro-batches, so that micro-batch k of the rest is the same samples at
  // every world size (Note [Global batch] in sampler.cc).
  // REQUIRES: batch_size % chunk == 0.
  int64_t chunk = 1;
  // Micro-batches per rank per optimizer step: the rest is cut into whole
  // steps of batch_size x world_size x step_batches samples (the last one
  // padded or dropped).
  int64_t step_batches = 1;
};

// Indices of rank's samples in `epoch`, batch after batch.
std::vector<int64_t> EpochIndices(const SamplerOptions& options, int64_t epoch);
// Rank's share of `order` (an epoch's order of all num_samples samples, the
// same on every rank): what EpochIndices returns for that order.
std::vector<int64_t> ShareOfOrder(std::vector<int64_t> order, const SamplerOptions& options);

// The epoch's order of a dataset in shards of `shard_sizes` samples
// (sample ids numbered shard after shard): with `shuffle`, a seeded
// shuffle of the shards, then of every `block` consecutive positions; else
// the stored order. A function of its arguments alone, so the same for
// every world size. REQUIRES: block >= 1.
std::vector<int64_t> StreamOrder(const std::vector<int64_t>& shard_sizes, int64_t block,
                                 uint64_t seed, bool shuffle, int64_t epoch);

// ShareOfOrder(StreamOrder(shard_sizes, block, options.seed, options.shuffle,
// epoch), options), computed block by block (StreamCursor): it holds the
// rank's share and one block, never the whole order. REQUIRES: block >= 1,
// and options.num_samples the sum of shard_sizes.
std::vector<int64_t> StreamShare(const std::vector<int64_t>& shard_sizes, int64_t block,
                                 const SamplerOptions& options, int64_t epoch);

// StreamShare's samples one at a time, holding one shuffle block and the
// shards' order instead of the rank's whole share: a rank streaming a token
// file of 4 G samples would otherwise hold 32 GB of sample numbers (8 bytes
// a sample). A copy continues from where the original is.
//
// Example:
//   StreamCursor cursor(index.ShardSizes(), spec.shuffle_buffer(), sampler, epoch);
//   for (int64_t k = 0; k < cursor.size(); ++k) Read(cursor.Next());
class StreamCursor {
 public:
  // REQUIRES: as StreamShare's.
  StreamCursor(const std::vector<int64_t>& shard_sizes, int64_t block,
               const SamplerOptions& options, int64_t epoch);

  // The rank's samples in the epoch (from options.start on): StreamShare's size.
  int64_t size() const { return size_; }
  // The next of them. REQUIRES: fewer than size() taken.
  int64_t Next();

 private:
  // The stream order's sample at position `q`: blocks are drawn forward
  // from the current one, or from the epoch's first again (the padding
  // wraps around to the start).
  int64_t At(int64_t q);
  void Restart();
  void NextBlock();

  SamplerOptions o_;
  int64_t epoch_;
  int64_t step_;                // positions per block: `block` with shuffle, else 1
  std::vector<int64_t> first_;  // shard s holds samples [first_[s], first_[s + 1])
  int64_t start_ = 0, remaining_ = 0, size_ = 0, taken_ = 0;
  // The walk through the order: the shards in their order, the next sample
  // to draw into a block, and the current block of positions
  // [block_begin_, block_begin_ + block_.size()).
  std::mt19937_64 rng_;
  std::vector<size_t> shards_;
  size_t shard_ = 0;
  int64_t next_ = 0;
  int64_t block_begin_ = 0;
  std::vector<int64_t> block_;
};

// Batches per rank per epoch (from options.start on): a multiple of
// options.step_batches.
int64_t BatchesPerEpoch(const SamplerOptions& options);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_SAMPLER_H_
