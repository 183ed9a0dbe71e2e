#include "chorus/progress.h"

#include <utility>

#include "common/clock.h"
#include "glog/logging.h"
#include "worker/comm/flight_recorder.h"
#include "worker/runtime/heartbeat_compose.h"
#include "worker/runtime/training_progress.h"

namespace chorus {

ProgressReporter::ProgressReporter(ProgressSink sink, const FlightRecorder* recorder,
                                   ProgressOptions options)
    : sink_(std::move(sink)),
      recorder_(recorder),
      options_(options),
      real_clock_(options.clock != nullptr ? nullptr : std::make_unique<RealClock>()),
      clock_(options.clock != nullptr ? *options.clock : *real_clock_),
      progress_(std::make_unique<TrainingProgress>()) {
  const absl::Time now = clock_.Now();
  progress_->phase.store(v1::SETUP);
  progress_->phase_since_us.store(absl::ToUnixMicros(now));
  {
    absl::MutexLock lock(&send_mu_);
    last_step_ = now;
  }
  if (options_.interval > absl::ZeroDuration()) thread_ = std::thread([this] { Loop(); });
}

ProgressReporter::~ProgressReporter() {
  {
    absl::MutexLock lock(&stop_mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void ProgressReporter::Step(int64_t step, double loss, int64_t samples) {
  {
    absl::MutexLock lock(&send_mu_);
    const absl::Time now = clock_.Now();
    const double seconds = absl::ToDoubleSeconds(now - last_step_);
    last_step_ = now;
    progress_->step.store(step);
    progress_->loss.store(loss);
    progress_->step_seconds.store(seconds);
    const double wait = comm_wait_seconds_ < seconds ? comm_wait_seconds_ : seconds;
    progress_->comm_wait_seconds.store(wait);
    progress_->compute_seconds.store(seconds - wait);
    comm_wait_seconds_ = 0;
    progress_->samples_per_second.store(seconds > 0 ? samples / seconds : 0.0);
  }
  if (options_.interval <= absl::ZeroDuration()) Send();
}

void ProgressReporter::SetEpoch(int64_t epoch) { progress_->epoch.store(epoch); }

void ProgressReporter::SetCommWait(absl::Duration wait) {
  absl::MutexLock lock(&send_mu_);
  comm_wait_seconds_ = absl::ToDoubleSeconds(wait);
}

v1::Phase ProgressReporter::EnterPhase(v1::Phase phase) {
  const auto previous = static_cast<v1::Phase>(progress_->phase.exchange(phase));
  progress_->phase_since_us.store(absl::ToUnixMicros(clock_.Now()));
  if (options_.interval <= absl::ZeroDuration()) Send();
  return previous;
}

v1::RankHeartbeat ProgressReporter::Current() {
  v1::RankHeartbeat hb = ProgressHeartbeat(*progress_, recorder_.load(), clock_.Now());
  if (const int64_t membership = membership_.load(); membership > 0) {
    hb.set_generation(membership >> 24);
    hb.set_rank(static_cast<int>(membership & 0xffffff));
  }
  if (left_.load()) hb.set_left_job(true);
  if (reforms_in_process_.load()) hb.set_reforms_in_process(true);
  return hb;
}

void ProgressReporter::SetMembership(int64_t generation, int rank) {
  membership_.store(generation << 24 | rank);
}

int64_t ProgressReporter::sent() const {
  absl::MutexLock lock(&send_mu_);
  return sent_;
}

int64_t ProgressReporter::refused() const {
  absl::MutexLock lock(&send_mu_);
  return refused_;
}

void ProgressReporter::Send() {
  absl::MutexLock lock(&send_mu_);
  const absl::Status s = sink_(Current());
  if (s.ok()) {
    ++sent_;
    return;
  }
  ++refused_;
  // A dropped record is replaced by the next one; anything else (the
  // supervisor is gone) is worth one line.
  if (s.code() != absl::StatusCode::kResourceExhausted && !warned_) {
    warned_ = true;
    LOG(WARNING) << "chorus: progress records are not getting through: " << s;
  }
}

void ProgressReporter::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&stop_mu_);
      if (clock_.AwaitWithDeadline(stop_mu_, absl::Condition(&stop_),
                                   clock_.Now() + options_.interval)) {
        return;
      }
    }
    Send();
  }
}

}  // namespace chorus
