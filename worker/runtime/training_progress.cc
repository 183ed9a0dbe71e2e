#include "worker/runtime/training_progress.h"

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace chorus {

void TrainingProgress::Enter(v1::Phase p) {
  phase.store(p);
  phase_since_us.store(absl::ToUnixMicros(absl::Now()));
}

}  // namespace chorus
