#include "worker/train/checkpoint_schedule.h"

namespace chorus {

CheckpointSchedule::CheckpointSchedule(const v1::CheckpointSpec& spec)
    : CheckpointSchedule(spec.every_steps(), !spec.has_at_end() || spec.at_end()) {}

bool CheckpointSchedule::NewRequest(std::optional<int64_t> agreed) {
  if (!agreed.has_value() || *agreed <= handled_requests_) return false;
  handled_requests_ = *agreed;
  return true;
}

CheckpointSchedule::Due CheckpointSchedule::AfterStep(int64_t step, int64_t total_steps,
                                                      bool requested) const {
  const bool periodic = every_steps_ > 0 && step % every_steps_ == 0;
  Due due;
  due.checkpoint = (periodic || requested) && step < total_steps;
  due.force = due.checkpoint && requested;
  return due;
}

}  // namespace chorus
