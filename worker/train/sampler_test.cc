#include "worker/train/sampler.h"

#include <map>
#include <numeric>
#include <set>

#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(SamplerTest, EverySampleExactlyOncePerEpochAcrossRanks) {
  for (int world : {1, 2, 3, 4, 7}) {
    for (bool shuffle : {false, true}) {
      const int64_t n = 1000, batch = 5;
      std::map<int64_t, int> seen;
      size_t per_rank = 0;
      for (int rank = 0; rank < world; ++rank) {
        SamplerOptions o{n, world, rank, batch, /*seed=*/42, shuffle, /*pad=*/false};
        std::vector<int64_t> idx = EpochIndices(o, 3);
        if (rank == 0) per_rank = idx.size();
        EXPECT_EQ(idx.size(), per_rank) << "every rank gets the same number of samples";
        EXPECT_EQ(static_cast<int64_t>(idx.size()), BatchesPerEpoch(o) * batch);
        for (int64_t i : idx) ++seen[i];
      }
      const int64_t dropped = n % (batch * world);
      EXPECT_EQ(static_cast<int64_t>(seen.size()), n - dropped) << world;
      for (const auto& [i, count] : seen)
        EXPECT_EQ(count, 1) << "sample " << i << " world " << world;
    }
  }
}

TEST(SamplerTest, ResumingMidEpochAtAnotherWorldSizeCoversTheRestExactlyOnce) {
  const int64_t n = 1000, batch = 5;
  for (int before : {1, 2, 3}) {
    for (int after : {1, 2, 3, 4}) {
      // `before` ranks train 17 global batches of epoch 2, then `after` ranks
      // take over from the saved position.
      const int64_t start = 17 * batch * before;
      std::map<int64_t, int> seen;
      for (int rank = 0; rank < before; ++rank) {
        std::vector<int64_t> idx =
            EpochIndices(SamplerOptions{n, before, rank, batch, 42, true, false}, 2);
        for (int64_t b = 0; b < 17 * batch; ++b) ++seen[idx[b]];
      }
      for (int rank = 0; rank < after; ++rank) {
        SamplerOptions o{n, after, rank, batch, 42, true, false, start};
        for (int64_t i : EpochIndices(o, 2)) ++seen[i];
        EXPECT_EQ(BatchesPerEpoch(o), (n - start) / (batch * after));
      }
      const int64_t dropped = (n - start) % (batch * after);
      EXPECT_EQ(static_cast<int64_t>(seen.size()), n - dropped) << before << " -> " << after;
      for (const auto& [i, count] : seen)
        EXPECT_EQ(count, 1) << "sample " << i << ": " << before << " -> " << after;
    }
  }
}

TEST(SamplerTest, PadCoversEverySampleAndRepeatsOnlyTheRemainder) {
  SamplerOptions o{10, 3, 0, 2, 7, true, /*pad=*/true};
  std::map<int64_t, int> seen;
  for (int rank = 0; rank < 3; ++rank) {
    o.rank = rank;
    for (int64_t i : EpochIndices(o, 0)) ++seen[i];
  }
  EXPECT_EQ(seen.size(), 10u);
  int total = 0;
  for (const auto& [i, c] : seen) total += c;
  EXPECT_EQ(total, 12);  // 2 batches x 2 x 3 ranks
}

TEST(SamplerTest, ShuffleDependsOnEpochAndSeedOnly) {
  SamplerOptions o{100, 2, 1, 10, 5, true, false};
  EXPECT_EQ(EpochIndices(o, 4), EpochIndices(o, 4));
  EXPECT_NE(EpochIndices(o, 4), EpochIndices(o, 5));
  SamplerOptions other = o;
  other.seed = 6;
  EXPECT_NE(EpochIndices(o, 4), EpochIndices(other, 4));
}

TEST(SamplerTest, StreamOrderIsAPermutationThatStaysWithinShardsAndBlocks) {
  const std::vector<int64_t> sizes = {7, 0, 12, 5, 9};  // 33 samples, one empty shard
  const std::vector<int64_t> order = StreamOrder(sizes, 4, 11, true, 3);
  ASSERT_EQ(order.size(), 33u);
  EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), 33u);
  for (int64_t i : order) EXPECT_TRUE(i >= 0 && i < 33) << i;
  // Shuffling within blocks of 4 moves a sample at most 3 positions from
  // where the shard order put it: each block holds the same samples as the
  // unshuffled blocks over the same shard order.
  const std::vector<int64_t> one = StreamOrder(sizes, 1, 11, true, 3);
  for (size_t b = 0; b < order.size(); b += 4) {
    const size_t end = std::min(order.size(), b + 4);
    EXPECT_EQ(std::set<int64_t>(order.begin() + b, order.begin() + end),
              std::set<int64_t>(one.begin() + b, one.begin() + end))
        << "block at " << b;
  }
  // With blocks of one, each shard's samples are consecutive and in order.
  for (size_t i = 1; i < one.size(); ++i) {
    if (one[i] != one[i - 1] + 1) {
      const std::set<int64_t> firsts = {0, 7, 19, 24};
      EXPECT_TRUE(firsts.count(one[i])) << "a shard starts at " << one[i];
    }
  }
  EXPECT_EQ(StreamOrder(sizes, 4, 11, false, 3)[20], 20) << "no shuffle: stored order";
  EXPECT_NE(StreamOrder(sizes, 4, 11, true, 4), order) << "another epoch, another order";
}

TEST(SamplerTest, StreamOrderResumedAtAnotherWorldSizeCoversTheRestExactlyOnce) {
  const std::vector<int64_t> sizes = {100, 37, 250, 13};
  const int64_t n = 400, batch = 3;
  const std::vector<int64_t> order = StreamOrder(sizes, 16, 42, true, 1);
  for (int before : {1, 2, 3}) {
    for (int after : {1, 2, 4}) {
      const int64_t start = 11 * batch * before;
      std::map<int64_t, int> seen;
      for (int rank = 0; rank < before; ++rank) {
        std::vector<int64_t> idx =
            ShareOfOrder(order, SamplerOptions{n, before, rank, batch, 42, true, false});
        for (int64_t b = 0; b < 11 * batch; ++b) ++seen[idx[b]];
      }
      for (int rank = 0; rank < after; ++rank) {
        for (int64_t i :
             ShareOfOrder(order, SamplerOptions{n, after, rank, batch, 42, true, false, start})) {
          ++seen[i];
        }
      }
      const int64_t dropped = (n - start) % (batch * after);
      EXPECT_EQ(static_cast<int64_t>(seen.size()), n - dropped) << before << " -> " << after;
      for (const auto& [i, count] : seen) EXPECT_EQ(count, 1) << "sample " << i;
    }
  }
}

TEST(SamplerTest, StreamShareIsTheShareOfTheStreamOrder) {
  const std::vector<std::vector<int64_t>> layouts = {{100, 37, 250, 13}, {0, 5, 0, 7, 1}, {9}};
  for (const std::vector<int64_t>& sizes : layouts) {
    const int64_t n = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    for (int64_t block : {1, 4, 64}) {
      for (bool shuffle : {true, false}) {
        for (bool pad : {false, true}) {
          for (int world : {1, 3}) {
            for (int64_t start : {int64_t{0}, n / 3}) {
              for (int rank = 0; rank < world; ++rank) {
                SamplerOptions o{n, world, rank, 2, 42, shuffle, pad, start};
                EXPECT_EQ(StreamShare(sizes, block, o, 5),
                          ShareOfOrder(StreamOrder(sizes, block, 42, shuffle, 5), o))
                    << "n " << n << " block " << block << " shuffle " << shuffle << " pad " << pad
                    << " world " << world << " rank " << rank << " start " << start;
              }
            }
          }
        }
      }
    }
  }
}

// The micro-batches of each optimizer step with a global batch of `global`
// samples at `world` ranks, by (step, micro-batch number in the step): rank
// r's micro-batch m of a step is number m * world + r (Note [Global batch]
// in sampler.cc). `share(o)` is a rank's samples.
template <typename Share>
std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> GlobalSteps(
    SamplerOptions o, int64_t global, int world, const Share& share) {
  o.world_size = world;
  o.chunk = o.batch_size;
  o.step_batches = global / (o.batch_size * world);
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> steps;
  for (int rank = 0; rank < world; ++rank) {
    o.rank = rank;
    const std::vector<int64_t> mine = share(o);
    EXPECT_EQ(static_cast<int64_t>(mine.size()), BatchesPerEpoch(o) * o.batch_size);
    for (int64_t j = 0; j * o.batch_size < static_cast<int64_t>(mine.size()); ++j) {
      const int64_t step = j / o.step_batches, m = j % o.step_batches;
      steps[{step, m * world + rank}].assign(mine.begin() + j * o.batch_size,
                                             mine.begin() + (j + 1) * o.batch_size);
    }
  }
  return steps;
}

TEST(SamplerTest, AGlobalBatchTrainsTheSameMicroBatchesInEveryStepAtEveryWorldSize) {
  // 1000 samples, global batch 60 of micro-batches of 5: 12 micro-batches a
  // step, 12 / world per rank.
  const int64_t n = 1000, batch = 5, global = 60;
  for (bool pad : {false, true}) {
    for (int64_t start : {int64_t{0}, 7 * global}) {
      const SamplerOptions o{n, 1, 0, batch, /*seed=*/42, /*shuffle=*/true, pad, start};
      auto epoch = [](const SamplerOptions& o) { return EpochIndices(o, 2); };
      const auto one = GlobalSteps(o, global, 1, epoch);
      const int64_t steps = pad ? (n - start + global - 1) / global : (n - start) / global;
      ASSERT_EQ(static_cast<int64_t>(one.size()), steps * 12) << "pad " << pad;
      std::map<int64_t, int> seen;
      for (const auto& [key, samples] : one) {
        for (int64_t i : samples) ++seen[i];
      }
      if (!pad) {
        EXPECT_EQ(static_cast<int64_t>(seen.size()), steps * global);
        for (const auto& [i, count] : seen) EXPECT_EQ(count, 1) << "sample " << i;
      }
      for (int world : {2, 3, 4, 6, 12}) {
        EXPECT_EQ(GlobalSteps(o, global, world, epoch), one)
            << "world " << world << " pad " << pad << " start " << start;
      }
      // Resumed at step 7 at another world size: the full epoch's steps 7 on.
      if (start == 0) {
        SamplerOptions resumed = o;
        resumed.start = 7 * global;
        const auto rest = GlobalSteps(resumed, global, 4, epoch);
        for (const auto& [key, samples] : rest) {
          if (pad && key.first + 7 >= steps - 1) continue;  // the padded step wraps elsewhere
          EXPECT_EQ(samples, one.at({key.first + 7, key.second})) << "step " << key.first + 7;
        }
      }
    }
  }
  // Streamed data deals out its stream order the same way.
  const std::vector<int64_t> sizes = {100, 37, 250, 13};
  const SamplerOptions o{400, 1, 0, 4, 7, true, true, 48};
  auto stream = [&sizes](const SamplerOptions& o) { return StreamShare(sizes, 64, o, 3); };
  auto of_order = [&sizes](const SamplerOptions& o) {
    return ShareOfOrder(StreamOrder(sizes, 64, 7, true, 3), o);
  };
  const auto one = GlobalSteps(o, 48, 1, stream);
  for (int world : {1, 2, 3, 4, 6, 12}) {
    EXPECT_EQ(GlobalSteps(o, 48, world, stream), one) << "world " << world;
    EXPECT_EQ(GlobalSteps(o, 48, world, of_order), one) << "world " << world;
  }
}

TEST(SamplerTest, AStreamCursorCopyContinuesWhereTheOriginalIs) {
  const std::vector<int64_t> sizes = {100, 37, 250, 13};
  // 400 samples, 3 ranks x 16, padded: the share wraps around to the start.
  const SamplerOptions o{400, 3, 1, 16, 7, true, true, 50};
  const std::vector<int64_t> share = StreamShare(sizes, 64, o, 2);
  StreamCursor cursor(sizes, 64, o, 2);
  ASSERT_EQ(cursor.size(), static_cast<int64_t>(share.size()));
  for (int64_t k = 0; k < 40; ++k) ASSERT_EQ(cursor.Next(), share[k]) << k;
  StreamCursor copy = cursor;
  for (int64_t k = 40; k < cursor.size(); ++k) {
    ASSERT_EQ(copy.Next(), share[k]) << k;
    ASSERT_EQ(cursor.Next(), share[k]) << k;
  }
}

}  // namespace
}  // namespace chorus
