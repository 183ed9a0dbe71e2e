// ProgressReporter and PhaseScope: how an SDK program tells Chorus where
// its training is, so that `chorus status` and the coordinator's hang
// detector see it as they see a built-in rank. The reporter keeps the
// program's step, epoch, phase, step time, loss and throughput, and sends
// them — with the communicator's flight-recorder summary, the hang
// detector's evidence — as one v1::RankHeartbeat to its sink every
// `interval` from its own thread, so that a program blocked in a collective
// still shows how long it has waited. Steps and phase changes only update
// atomics (as the built-in trainer's do): a phase costs two stores, not a
// send, however many steps a second the program runs. Under Chorus the sink
// is the progress channel to the supervising chorus-rank
// (worker/runtime/progress_channel.h), which forwards the newest
// record in its heartbeats.
//
// Thread-safety: every method may be called from any thread; the sink is
// called from the caller's thread and from the reporter's own thread (never
// both at once). PhaseScope belongs to the thread that made it.
//
// Example:
//   ProgressReporter progress(sink, &comm.flight_recorder());
//   for (int64_t step = 1; step <= steps; ++step) {
//     { PhaseScope phase(progress, v1::FORWARD); loss = Forward(batch); }
//     { PhaseScope phase(progress, v1::BACKWARD); loss.backward(); }
//     progress.Step(step, loss.item<double>(), batch_size);
//   }
#ifndef CHORUS_SDK_PROGRESS_H_
#define CHORUS_SDK_PROGRESS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"

namespace chorus {

// Internal to Chorus and not installed with the SDK: a program passes the
// recorder its communicator has and no clock (tests inject one).
class Clock;           // common/clock.h
class FlightRecorder;  // a Communicator's (Communicator::flight_recorder())
struct TrainingProgress;

// Where progress records go. RESOURCE_EXHAUSTED: this record was dropped
// (the receiver is behind; the next one carries newer state).
using ProgressSink = std::function<absl::Status(const v1::RankHeartbeat& progress)>;

struct ProgressOptions {
  // How often the reporter's thread sends the current state (the
  // supervisor forwards the newest once a second); 0 = no thread, and every
  // Step() and phase change sends at once instead (tests).
  absl::Duration interval = absl::Milliseconds(200);
  // Time for step durations and phase ages; null = the real clock.
  Clock* clock = nullptr;
};

class ProgressReporter {
 public:
  // `recorder` (may be null: no flight recorder in the records) must
  // outlive the reporter. Starts in phase SETUP.
  ProgressReporter(ProgressSink sink, const FlightRecorder* recorder,
                   ProgressOptions options = ProgressOptions());
  // Stops the reporter's thread (after its current send).
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // Step `step` ended with `loss` over `samples` samples of this rank: the
  // step time is the time since the previous Step() (or since the reporter
  // was made), throughput samples / step time.
  void Step(int64_t step, double loss, int64_t samples);
  void SetEpoch(int64_t epoch);
  // Optional, for the straggler attribution: of the last step, how long
  // this rank waited for the others (gradient synchronization). Without it
  // the whole step counts as compute.
  void SetCommWait(absl::Duration wait);
  // Enters `phase`; returns the phase it left.
  v1::Phase EnterPhase(v1::Phase phase);
  // Sends the current state now (the last record before the program ends).
  void Flush() { Send(); }

  // Elastic programs (Session::JoinNextGeneration): the generation and rank
  // the program now belongs to, which its records carry from here on (the
  // supervisor's heartbeats follow them); the flight recorder of the new
  // communicator (must outlive the reporter, or be replaced before it goes);
  // and that the rank left the job at a drain (sticky).
  void SetMembership(int64_t generation, int rank);
  void SetFlightRecorder(const FlightRecorder* recorder) { recorder_.store(recorder); }
  void MarkLeft() { left_.store(true); }
  // The program re-forms in its own process (it uses the Session's elastic
  // hooks): every record says so from here on (sticky), and the coordinator
  // re-forms the job around its survivors instead of restarting every rank
  // (Note [Restart-all] in coordinator/scheduling/running_job.h). Returns whether this
  // call was the first.
  bool MarkReformsInProcess() { return !reforms_in_process_.exchange(true); }

  // The record the sink would get now.
  v1::RankHeartbeat Current();
  // Records sent, and records the sink refused (dropped or failed).
  int64_t sent() const;
  int64_t refused() const;

 private:
  void Send();
  void Loop();

  const ProgressSink sink_;
  std::atomic<const FlightRecorder*> recorder_;
  // generation << 24 | rank, one word so that a record never pairs one
  // generation with another's rank; 0: not set (the supervisor's own).
  std::atomic<int64_t> membership_{0};
  std::atomic<bool> left_{false};
  std::atomic<bool> reforms_in_process_{false};
  const ProgressOptions options_;
  // The real clock when options.clock is null.
  const std::unique_ptr<Clock> real_clock_;
  Clock& clock_;
  // Written here, read by the records (worker/runtime/heartbeat_compose.h).
  const std::unique_ptr<TrainingProgress> progress_;

  mutable absl::Mutex send_mu_;  // one send at a time, in order
  absl::Time last_step_ ABSL_GUARDED_BY(send_mu_);
  double comm_wait_seconds_ ABSL_GUARDED_BY(send_mu_) = 0;
  int64_t sent_ ABSL_GUARDED_BY(send_mu_) = 0;
  int64_t refused_ ABSL_GUARDED_BY(send_mu_) = 0;
  bool warned_ ABSL_GUARDED_BY(send_mu_) = false;

  absl::Mutex stop_mu_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread thread_;
};

// Enters a phase for its lifetime and returns to the phase before it.
class PhaseScope {
 public:
  PhaseScope(ProgressReporter& reporter, v1::Phase phase)
      : reporter_(reporter), previous_(reporter.EnterPhase(phase)) {}
  ~PhaseScope() { reporter_.EnterPhase(previous_); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  ProgressReporter& reporter_;
  const v1::Phase previous_;
};

}  // namespace chorus

#endif  // CHORUS_SDK_PROGRESS_H_
