#include "worker/comm/p2p_lanes.h"

#include <utility>

namespace chorus {

P2pLanes::P2pLanes(Finish finish) : finish_(std::move(finish)) {}

P2pLanes::~P2pLanes() {
  std::map<int, std::unique_ptr<Lane>> lanes;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    lanes.swap(lanes_);
  }
  for (auto& [index, lane] : lanes) lane->thread.join();
}

void P2pLanes::Add(int lane, std::shared_ptr<QueuedWork> work, WaitFn wait) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Lane>& slot = lanes_[lane];
  if (slot == nullptr) {
    slot = std::make_unique<Lane>();
    Lane* raw = slot.get();
    slot->pending.emplace_back(std::move(work), std::move(wait));
    slot->thread = std::thread([this, raw] { Run(raw); });
    return;
  }
  slot->pending.emplace_back(std::move(work), std::move(wait));
}

void P2pLanes::Run(Lane* lane) {
  while (true) {
    std::pair<std::shared_ptr<QueuedWork>, WaitFn> next;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, lane]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !lane->pending.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (lane->pending.empty()) return;  // stopping
      next = std::move(lane->pending.front());
      lane->pending.pop_front();
    }
    absl::Status status = next.second();
    next.second = nullptr;  // drops the buffers before the caller wakes
    finish_(*next.first, std::move(status));
  }
}

}  // namespace chorus
