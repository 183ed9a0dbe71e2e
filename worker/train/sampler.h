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
// epoch), options), computed block by block: it holds the rank's share and
// one block, never the whole order (a rank of a job over a billion samples
// would otherwise hold 8 GB for it). REQUIRES: block >= 1, and
// options.num_samples the sum of shard_sizes.
std::vector<int64_t> StreamShare(const std::vector<int64_t>& shard_sizes, int64_t block,
                                 const SamplerOptions& options, int64_t epoch);

// Batches per rank per epoch.
int64_t BatchesPerEpoch(const SamplerOptions& options);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_SAMPLER_H_
