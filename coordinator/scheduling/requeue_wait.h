// RequeueWait: one running job's wait for its checkpoint before it goes
// back to the queue (Note [Re-queue] in scheduler_requeue.cc). A
// higher-priority job preempted it; its ranks checkpoint and hold; the wait
// ends once a checkpoint of the target step or later has committed, or at
// the deadline. Its transitions say what the Scheduler is to do; it reads no
// checkpoint and sends nothing itself.
//
// Thread-safety: none; the Scheduler holds its lock around every use.
//
// Example:
//   RequeueWait wait;
//   wait.Begin("preempted by job-000007 (HIGH, alice)", /*reported_step=*/120,
//              /*newest_checkpoint=*/100, now, absl::Seconds(60));
//   if (std::optional<RequeueWait::Due> due = wait.OnTick(newest_step, now)) {
//     // due->reason: "preempted by ...; resumes from step 121"
//   }
#ifndef CHORUS_COORDINATOR_SCHEDULING_REQUEUE_WAIT_H_
#define CHORUS_COORDINATOR_SCHEDULING_REQUEUE_WAIT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"

namespace chorus {

// What a RequeueWait holds while the job waits. (Defined outside the class:
// clang cannot default-construct a nested struct with member initializers
// through the std::optional that holds it in the class.)
struct RequeueWaitState {
  std::string cause;
  int64_t target_step = 0;
  int64_t reported_step = 0;  // the highest step a rank had reported
  absl::Time deadline;
  absl::Duration timeout;
};

class RequeueWait {
 public:
  // The wait is over: the job goes back to the queue.
  struct Due {
    int64_t resume_step = 0;  // its newest committed checkpoint; 0: from scratch
    std::string reason;       // the job's reason while PENDING
    // Set when the checkpoint did not commit in time: what the job's event
    // says of the steps that are lost.
    std::optional<std::string> warning;
  };

  // Whether the job waits for its checkpoint (its ranks are told
  // CHECKPOINT_AND_HOLD on their heartbeats).
  bool active() const { return wait_.has_value(); }
  // Who preempted it ("preempted by job-000007 (HIGH, alice)").
  // REQUIRES: active().
  const std::string& cause() const { return wait_->cause; }
  // The step the checkpoint asked for must reach. REQUIRES: active().
  int64_t target_step() const { return wait_->target_step; }

  // Transitions.
  // The job was preempted for `cause`; its ranks had reported
  // `reported_step` at most, its newest committed checkpoint is at
  // `newest_checkpoint` (0: none). It waits up to `timeout`.
  // REQUIRES: !active().
  void Begin(std::string cause, int64_t reported_step, int64_t newest_checkpoint, absl::Time now,
             absl::Duration timeout);
  // The job's newest committed checkpoint is at `newest_checkpoint` now:
  // the wait is due once it reaches the target step, or at the deadline
  // (with a warning), and is then over. nullopt while it goes on.
  std::optional<Due> OnTick(int64_t newest_checkpoint, absl::Time now);

 private:
  std::optional<RequeueWaitState> wait_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_REQUEUE_WAIT_H_
