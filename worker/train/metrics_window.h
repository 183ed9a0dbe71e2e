// What the training loop accumulates between two metric reports: the loss
// of every micro-batch, the seconds spent waiting for communication, and the
// steps taken; summarized into the per-step figures a report carries.
//
// Times come from the caller (no clock inside), so a window is a pure
// function of what was added and when it was closed.
//
// Thread-safety: not thread-safe; the training thread owns a window.
//
// Example:
//   MetricsWindow window(absl::Now());
//   window.AddMicroBatch(loss.item<double>(), waited);  // every micro-batch
//   window.EndStep();                                   // every step
//   MetricsWindow::Summary s = window.Close(absl::Now(), global_batch);
#ifndef CHORUS_WORKER_TRAIN_METRICS_WINDOW_H_
#define CHORUS_WORKER_TRAIN_METRICS_WINDOW_H_

#include <cstdint>

#include "absl/time/time.h"

namespace chorus {

class MetricsWindow {
 public:
  explicit MetricsWindow(absl::Time start) : start_(start) {}

  // One micro-batch: its loss (already divided by the micro-batches of a
  // step, so a step's losses sum to its mean loss) and the seconds its
  // backward waited for communication.
  void AddMicroBatch(double loss, double wait_seconds);
  // Counts a step.
  void EndStep() { ++steps_; }

  struct Summary {
    int64_t steps = 0;
    // Per step, averaged over the window's steps (a window without steps
    // divides by 1).
    double loss = 0;
    double step_seconds = 0;
    double compute_seconds = 0;  // step time minus the communication wait
    double wait_seconds = 0;
    double samples_per_second = 0;
  };
  // Summarizes the window from its start to `now`, `samples_per_step`
  // being what one step trains across all ranks, and starts the next
  // window at `now`.
  Summary Close(absl::Time now, int64_t samples_per_step);

  absl::Time start() const { return start_; }

 private:
  absl::Time start_;
  double loss_ = 0;
  double wait_seconds_ = 0;
  int64_t steps_ = 0;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_METRICS_WINDOW_H_
