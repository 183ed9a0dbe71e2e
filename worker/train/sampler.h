// DistributedSampler: which samples each rank trains on in each epoch.
//
// Every epoch the sample order is shuffled from (seed, epoch) — the same
// permutation on every rank — and cut into world_size interleaved shards, so
// every sample is seen exactly once per epoch across ranks. Samples that do
// not fill a whole global batch are dropped (DROP) or padded with samples
// from the start of the permutation (PAD); either way every rank gets the
// same number of full batches, which keeps collectives in step.
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
// Batches per rank per epoch.
int64_t BatchesPerEpoch(const SamplerOptions& options);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_SAMPLER_H_
