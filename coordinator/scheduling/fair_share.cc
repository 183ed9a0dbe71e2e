#include "coordinator/scheduling/fair_share.h"

#include <cmath>

namespace chorus {

FairShare::FairShare(absl::Duration half_life, absl::Time now)
    : half_life_(half_life), last_(now) {}

void FairShare::Advance(absl::Time now, const std::map<std::string, int>& slots_held) {
  const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - last_));
  if (now > last_) last_ = now;
  const double h = absl::ToDoubleSeconds(half_life_);
  const double decay = std::exp2(-elapsed / h);
  for (auto it = usage_.begin(); it != usage_.end();) {
    it->second *= decay;
    it = it->second < 1e-3 ? usage_.erase(it) : std::next(it);
  }
  const double per_slot = h / std::log(2.0) * (1 - decay);
  for (const auto& [owner, slots] : slots_held) {
    if (slots > 0 && per_slot > 0) usage_[owner] += slots * per_slot;
  }
}

}  // namespace chorus
