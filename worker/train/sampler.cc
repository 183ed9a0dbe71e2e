#include "worker/train/sampler.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace chorus {

int64_t BatchesPerEpoch(const SamplerOptions& o) {
  const int64_t steps = std::max<int64_t>(1, o.step_batches);
  const int64_t global = o.batch_size * o.world_size * steps;
  const int64_t n = o.num_samples - std::clamp<int64_t>(o.start, 0, o.num_samples);
  if (global <= 0 || n <= 0) return 0;
  return (o.pad ? (n + global - 1) / global : n / global) * steps;
}

namespace {

// mt19937_64 is specified by the standard: the same generator everywhere.
std::mt19937_64 EpochRng(uint64_t seed, int64_t epoch) {
  return std::mt19937_64(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
}

// Fisher-Yates over [first, last) with `rng`.
template <typename T>
void Shuffle(T* first, T* last, std::mt19937_64& rng) {
  for (int64_t i = last - first - 1; i > 0; --i) {
    std::uniform_int_distribution<int64_t> pick(0, i);
    std::swap(first[i], first[pick(rng)]);
  }
}

}  // namespace

std::vector<int64_t> EpochIndices(const SamplerOptions& o, int64_t epoch) {
  std::vector<int64_t> order(o.num_samples);
  std::iota(order.begin(), order.end(), 0);
  if (o.shuffle) {
    std::mt19937_64 rng = EpochRng(o.seed, epoch);
    Shuffle(order.data(), order.data() + order.size(), rng);
  }
  return ShareOfOrder(std::move(order), o);
}

// Note [Streamed order]
// A dataset streamed from shards cannot be read in a uniformly random
// order: every sample would be a seek into any file. Its epoch order is the
// shards in a seeded random order, their samples in stored order, and then
// every run of `block` consecutive positions shuffled, as a shuffle buffer
// of `block` samples would. Ranks take interleaved positions of that order
// (ShareOfOrder), so at any moment all ranks read within the same block of
// the same one or two shards, each its own 1/world of it. The order depends
// on the seed, the epoch and the shard sizes only, never on the world
// size: the exactly-once reasoning of EpochIndices (a resumed epoch skips
// the prefix already trained and shards the rest among the ranks there are
// now) holds for it unchanged.
// A rank draws its share of it as it reads (StreamCursor): the order is a
// walk through the shards, block by block, with one generator, so only the
// current block need be held; StreamShare is that walk collected.
std::vector<int64_t> StreamOrder(const std::vector<int64_t>& shard_sizes, int64_t block,
                                 uint64_t seed, bool shuffle, int64_t epoch) {
  std::vector<int64_t> first(shard_sizes.size() + 1, 0);
  for (size_t s = 0; s < shard_sizes.size(); ++s) first[s + 1] = first[s] + shard_sizes[s];
  std::vector<size_t> shards(shard_sizes.size());
  std::iota(shards.begin(), shards.end(), 0);
  std::mt19937_64 rng = EpochRng(seed, epoch);
  if (shuffle) Shuffle(shards.data(), shards.data() + shards.size(), rng);
  std::vector<int64_t> order;
  order.reserve(first.back());
  for (size_t s : shards) {
    for (int64_t i = first[s]; i < first[s + 1]; ++i) order.push_back(i);
  }
  if (shuffle) {
    const int64_t n = static_cast<int64_t>(order.size());
    for (int64_t b = 0; b < n; b += block) {
      Shuffle(order.data() + b, order.data() + std::min(n, b + block), rng);
    }
  }
  return order;
}

std::vector<int64_t> StreamShare(const std::vector<int64_t>& shard_sizes, int64_t block,
                                 const SamplerOptions& o, int64_t epoch) {
  StreamCursor cursor(shard_sizes, block, o, epoch);
  std::vector<int64_t> mine(cursor.size());
  for (int64_t& sample : mine) sample = cursor.Next();
  return mine;
}

StreamCursor::StreamCursor(const std::vector<int64_t>& shard_sizes, int64_t block,
                           const SamplerOptions& options, int64_t epoch)
    : o_(options), epoch_(epoch), step_(options.shuffle ? block : 1) {
  first_.assign(shard_sizes.size() + 1, 0);
  for (size_t s = 0; s < shard_sizes.size(); ++s) first_[s + 1] = first_[s] + shard_sizes[s];
  const int64_t n = first_.back();
  start_ = std::clamp<int64_t>(o_.start, 0, n);
  remaining_ = n - start_;
  size_ = BatchesPerEpoch(o_) * o_.batch_size;
  Restart();
}

void StreamCursor::Restart() {
  rng_ = EpochRng(o_.seed, epoch_);  // drawn in StreamOrder's order
  shards_.resize(first_.size() - 1);
  std::iota(shards_.begin(), shards_.end(), 0);
  if (o_.shuffle) Shuffle(shards_.data(), shards_.data() + shards_.size(), rng_);
  shard_ = 0;
  next_ = shards_.empty() ? 0 : first_[shards_[0]];
  block_begin_ = 0;
  block_.clear();
}

void StreamCursor::NextBlock() {
  block_begin_ += static_cast<int64_t>(block_.size());
  const int64_t size = std::min(step_, first_.back() - block_begin_);
  block_.clear();
  while (static_cast<int64_t>(block_.size()) < size) {
    while (next_ == first_[shards_[shard_] + 1]) next_ = first_[shards_[++shard_]];
    block_.push_back(next_++);
  }
  if (o_.shuffle) Shuffle(block_.data(), block_.data() + size, rng_);
}

int64_t StreamCursor::At(int64_t q) {
  if (q < block_begin_) Restart();
  while (q >= block_begin_ + static_cast<int64_t>(block_.size())) NextBlock();
  return block_[q - block_begin_];
}

int64_t StreamCursor::Next() {
  // Position i of the rest of the epoch (ShareOfOrder's order after the
  // trained prefix, padded by wrapping around it) is the stream order's
  // position start + i mod remaining; this rank's k-th sample is position
  // i = ((k / chunk) * world + rank) * chunk + k mod chunk.
  const int64_t chunk = std::max<int64_t>(1, o_.chunk);
  const int64_t k = taken_++;
  const int64_t i = ((k / chunk) * o_.world_size + o_.rank) * chunk + k % chunk;
  return At(start_ + i % remaining_);
}

std::vector<int64_t> ShareOfOrder(std::vector<int64_t> order, const SamplerOptions& o) {
  // Resuming mid-epoch: the samples already trained are the permutation's
  // prefix; the rest is sharded among the ranks there are now.
  const int64_t start = std::clamp<int64_t>(o.start, 0, o.num_samples);
  order.erase(order.begin(), order.begin() + start);
  const int64_t remaining = static_cast<int64_t>(order.size());
  const int64_t total = BatchesPerEpoch(o) * o.batch_size * o.world_size;
  for (int64_t i = remaining; i < total; ++i) order.push_back(order[i % remaining]);
  order.resize(total);
  const int64_t chunk = std::max<int64_t>(1, o.chunk);
  std::vector<int64_t> mine;
  mine.reserve(total / std::max(1, o.world_size));
  for (int64_t c = o.rank * chunk; c < total; c += chunk * o.world_size) {
    mine.insert(mine.end(), order.begin() + c, order.begin() + std::min(total, c + chunk));
  }
  return mine;
}

// Note [Global batch]
// training.global_batch_size fixes the samples of an optimizer step at
// every world size W, so that an elastic job that shrinks or grows trains
// the computation an undisturbed run would (docs/elastic.md "The global
// batch"):
// - The order of an epoch never depends on W (EpochIndices, StreamOrder), and
//   the rest of an epoch after `start` is cut into whole steps of G =
//   global_batch_size samples (step_batches = G / (batch_size x W) per rank;
//   BatchesPerEpoch pads or drops whole steps). Step s of the rest is
//   positions [s G, (s + 1) G) at every W, and `start` (epoch_offset, in
//   samples) is a multiple of G, so a resumed or re-formed epoch goes on
//   where the old one stopped.
// - The rest is dealt out a micro-batch (chunk = batch_size) at a time:
//   micro-batch m of a step on rank r is the step's micro-batch m W + r,
//   positions [s G + (m W + r) b, ... + b). So every micro-batch holds the
//   same samples at every W, and its random draws (dropout) are seeded from
//   its number (the trainer's SeededForward), not from the rank.
// - Each rank divides a micro-batch's mean loss by its step_batches and DDP
//   averages the gradients over the W ranks: the gradient is the mean over
//   the G/b micro-batches of the step, i.e. over the global batch, at every
//   W (micro-batches are equal in size).
// Only the order of the floating-point sums differs (the accumulation on a
// rank, then the all-reduce across ranks), so parameters agree to rounding,
// not bit for bit.

}  // namespace chorus
