// ReportQueue: a rank's reports along the way (RankService.Report with
// final=false) sent by a thread of its own, so that the thread that trains
// never waits for the coordinator (Note [Reports off the training thread]).
//
// At most one report is pending. Offer replaces a pending report that no
// send has taken yet with the newer one: a report's metrics are the newest
// the rank has (step, loss, the latest evaluation), and the coordinator
// shows the latest it received, so a replaced report loses only an
// intermediate point. The thread takes the pending report whenever no send
// is in flight and hands it to the injected send function with a deadline
// of its own. A send that fails is logged (the first of a run of failures,
// and the first success after one) and its report dropped: the next one
// carries newer metrics.
//
// The final report is not this queue's: its caller stops the queue with
// Flush and then sends it itself, synchronously, retried as long as it
// needs.
//
// Thread-safety: Offer and counts() may be called from any thread at any
// time, also after Flush. Flush and the destructor are the owner's, called
// from one thread. The send function runs on the queue's thread, one call
// at a time, without the queue's lock held.
//
// Example:
//   ReportQueue reports([&](const v1::ReportRequest& request, absl::Time deadline) {
//     grpc::ClientContext context;
//     context.set_deadline(absl::ToChronoTime(deadline));
//     v1::ReportResponse response;
//     return FromGrpcStatus(stub->Report(&context, request, &response));
//   });
//   ... on the training thread, at each logged step:
//   reports.Offer(RequestFor(metrics));
//   ... after training:
//   reports.Flush(absl::Now());
//   SendFinalReport(final_metrics);  // retried, wait_for_ready
#ifndef CHORUS_WORKER_RUNTIME_REPORT_QUEUE_H_
#define CHORUS_WORKER_RUNTIME_REPORT_QUEUE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "common/clock.h"

namespace chorus {

// Note [Reports off the training thread]
// A coordinator leader that is frozen (SIGSTOPped, swapped out, stuck in the
// kernel) keeps its TCP connections up and answers nothing: a call to it
// ends only at its deadline. chorus-trainer used to send its metrics with a
// blocking Report (10 s deadline) from the training thread, in the metrics
// callback, so against a frozen leader every logged step waited 10 s and
// logged "report: Deadline Exceeded": training ran at 0.14 of its normal
// step rate. Once the ranks are connected, training needs nothing from the
// coordinator (heartbeats already have their own thread, HeartbeatStream),
// and reports along the way are best effort, so they go through a
// ReportQueue: Offer copies the report and returns. A frozen coordinator
// then costs one send in flight, until its deadline, and one report
// pending, the newest; when the coordinator answers again the newest
// metrics reach it with the next send. An SDK program's
// Session::ReportMetrics goes the same way.
//
// Stopping must stay bounded too: the final report follows it, and a rank
// that failed exits after it. A send in flight cannot be taken back, so its
// deadline is the bound: every send's deadline is at most attempt_timeout
// after it began, and Flush waits for a send in flight at most until then.
// The final report keeps its own rules (retried for up to a minute with
// wait_for_ready: it must arrive, and a coordinator that restarts comes
// back within that).
class ReportQueue {
 public:
  // Sends one report; must return by `deadline` (a gRPC call given the
  // deadline does).
  using SendFunction =
      std::function<absl::Status(const v1::ReportRequest& request, absl::Time deadline)>;

  struct Options {
    // Each send's deadline is this long after it begins: the most a send
    // may take, and so the most Flush waits for one in flight. A
    // coordinator that answers at all answers a report in milliseconds.
    absl::Duration attempt_timeout = absl::Seconds(5);
    // For the deadlines; null = the real clock.
    Clock* clock = nullptr;
  };

  // What became of the reports offered so far. Once Flush has returned,
  // offered == sent + failed + coalesced + dropped.
  struct Counts {
    int64_t offered = 0;
    int64_t sent = 0;    // their send returned OK
    int64_t failed = 0;  // their send returned an error (logged)
    // Replaced by a newer report before any send took them.
    int64_t coalesced = 0;
    // Pending when Flush's deadline came, or offered after Flush.
    int64_t dropped = 0;
  };

  // Starts the queue's thread. `send` must stay callable until Flush or
  // the destructor has returned.
  ReportQueue(SendFunction send, Options options);
  explicit ReportQueue(SendFunction send) : ReportQueue(std::move(send), Options()) {}
  // Flush(now): the pending report, if any, is dropped; waits for a send in
  // flight (until its deadline at most) and joins the thread.
  ~ReportQueue();
  ReportQueue(const ReportQueue&) = delete;
  ReportQueue& operator=(const ReportQueue&) = delete;

  // Makes `request` the pending report, replacing one no send has taken
  // yet. Never waits for a send. After Flush, drops it.
  void Offer(v1::ReportRequest request);

  // Stops the queue: waits for a send in flight, sends the report still
  // pending, if any, with a deadline no later than `deadline` (drops it when
  // `deadline` has passed by then), and joins the thread. Returns by
  // `deadline` or by the deadline of the send in flight when it was called,
  // whichever is later. Later calls return at once.
  void Flush(absl::Time deadline);

  Counts counts() const;

 private:
  // A report the thread took and the deadline its send gets.
  struct Attempt {
    v1::ReportRequest request;
    absl::Time deadline;
  };

  void Run();
  // Waits for a pending report or Flush; the next send, or nullopt when
  // the thread is done.
  std::optional<Attempt> NextAttempt();
  // Counts a send's outcome and logs it as the class comment says.
  void Finished(const v1::ReportRequest& request, const absl::Status& status);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SendFunction send_;
  const Options options_;
  RealClock real_clock_;
  Clock& clock_;
  mutable absl::Mutex mu_;
  std::optional<v1::ReportRequest> pending_ ABSL_GUARDED_BY(mu_);
  // Set by Flush: the thread sends what is pending until then, and ends.
  std::optional<absl::Time> stop_by_ ABSL_GUARDED_BY(mu_);
  Counts counts_ ABSL_GUARDED_BY(mu_);
  // Sends that failed since the last one that did not (for the logs).
  int64_t failures_in_a_row_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: starts after everything above is set
};

}  // namespace chorus

#endif  // CHORUS_WORKER_RUNTIME_REPORT_QUEUE_H_
