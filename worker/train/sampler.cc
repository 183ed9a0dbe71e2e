#include "worker/train/sampler.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace chorus {

int64_t BatchesPerEpoch(const SamplerOptions& o) {
  const int64_t global = o.batch_size * o.world_size;
  const int64_t n = o.num_samples - std::clamp<int64_t>(o.start, 0, o.num_samples);
  if (global <= 0 || n <= 0) return 0;
  return o.pad ? (n + global - 1) / global : n / global;
}

std::vector<int64_t> EpochIndices(const SamplerOptions& o, int64_t epoch) {
  std::vector<int64_t> order(o.num_samples);
  std::iota(order.begin(), order.end(), 0);
  if (o.shuffle) {
    // mt19937_64 is specified by the standard: the same permutation everywhere.
    std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
    for (int64_t i = o.num_samples - 1; i > 0; --i) {
      std::uniform_int_distribution<int64_t> pick(0, i);
      std::swap(order[i], order[pick(rng)]);
    }
  }
  // Resuming mid-epoch: the samples already trained are the permutation's
  // prefix; the rest is sharded among the ranks there are now.
  const int64_t start = std::clamp<int64_t>(o.start, 0, o.num_samples);
  order.erase(order.begin(), order.begin() + start);
  const int64_t remaining = static_cast<int64_t>(order.size());
  const int64_t total = BatchesPerEpoch(o) * o.batch_size * o.world_size;
  for (int64_t i = remaining; i < total; ++i) order.push_back(order[i % remaining]);
  order.resize(total);
  std::vector<int64_t> mine;
  mine.reserve(total / std::max(1, o.world_size));
  for (int64_t i = o.rank; i < total; i += o.world_size) mine.push_back(order[i]);
  return mine;
}

}  // namespace chorus
