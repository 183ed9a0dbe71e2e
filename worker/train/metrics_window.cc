#include "worker/train/metrics_window.h"

#include <algorithm>

namespace chorus {

void MetricsWindow::AddMicroBatch(double loss, double wait_seconds) {
  loss_ += loss;
  wait_seconds_ += wait_seconds;
}

MetricsWindow::Summary MetricsWindow::Close(absl::Time now, int64_t samples_per_step) {
  const double seconds = absl::ToDoubleSeconds(now - start_);
  const double steps = static_cast<double>(std::max<int64_t>(1, steps_));
  Summary s;
  s.steps = steps_;
  s.loss = loss_ / steps;
  s.step_seconds = seconds / steps;
  s.compute_seconds = (seconds - wait_seconds_) / steps;
  s.wait_seconds = wait_seconds_ / steps;
  s.samples_per_second = static_cast<double>(steps_ * samples_per_step) / std::max(seconds, 1e-9);
  start_ = now;
  loss_ = 0;
  wait_seconds_ = 0;
  steps_ = 0;
  return s;
}

}  // namespace chorus
