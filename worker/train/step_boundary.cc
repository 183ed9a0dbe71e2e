#include "worker/train/step_boundary.h"

#include <algorithm>
#include <numeric>

namespace chorus {
namespace {

constexpr int kWorldBits = 20;
constexpr int64_t kWorldMask = (int64_t{1} << kWorldBits) - 1;

}  // namespace

int64_t PackReformRequest(int64_t generation, int world_size) {
  const int64_t world = world_size > 0 && world_size <= kWorldMask ? world_size : 0;
  return generation << kWorldBits | world;
}

ReformRequest UnpackReformRequest(int64_t packed) {
  return ReformRequest{packed >> kWorldBits, static_cast<int>(packed & kWorldMask)};
}

int64_t BoundarySamples(int min_ranks, int max_ranks, int planned_world, int64_t per_rank_step,
                        int64_t epoch_samples) {
  int64_t l = 1;
  if (planned_world > 0) {
    l = planned_world;
  } else {
    for (int64_t w = std::max(1, min_ranks); w <= max_ranks; ++w) {
      l = l / std::gcd(l, w) * w;
      if (l * per_rank_step > epoch_samples) return epoch_samples + 1;
    }
  }
  if (l * per_rank_step > epoch_samples) return epoch_samples + 1;
  return l * per_rank_step;
}

}  // namespace chorus
