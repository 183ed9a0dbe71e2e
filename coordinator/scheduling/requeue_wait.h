// RequeueWait: one running job's wait for its checkpoint before it goes
// back to the queue (Note [Re-queue] below). A
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

// Note [Re-queue]
// The Scheduler's PreemptLocked picks whole jobs by PlanPreemption.
// A job on the built-in trainer is checkpointable: it honours a checkpoint
// request (the `chorus checkpoint` signal) at its next step boundary,
// whatever its checkpoint schedule, and resumes from a checkpoint. A
// program job is not (nothing says it saves one), unless
// resources.preemptible lets it be stopped and started again from scratch.
//
// 1. The checkpointable job's ranks are answered, on their heartbeats, with
//    CHECKPOINT_AND_HOLD: they checkpoint at the end of the current step,
//    as for `chorus checkpoint`, and then train no further (a rank that
//    trained on would train steps the resumed run trains again). The step
//    they had reported and the newest committed checkpoint give
//    `target_step` (the next one after both). Its slots count as on their
//    way to the waiting job, so nothing else is preempted for it meanwhile.
//    A worker that does not know the directive trains on; the wait then
//    times out (step 2).
// 2. Every Tick (the Scheduler's RequeueDueLocked) reads the job's newest committed
//    checkpoint. Once it reaches target_step, or after
//    requeue_checkpoint_timeout (then from the newest one there is, with
//    an event saying how many steps that loses), the ranks are told to stop
//    and the job becomes PENDING (JobManager::Requeue) with a reason naming
//    who preempted it and the step it resumes from, and resume_from set to
//    its own id: the newest complete checkpoint when it is placed again,
//    which a restarted coordinator reads from the state database as for
//    any job. Its place in the queue is its priority, fair share and submit
//    time, none of which changed.
// 3. The stopped ranks' slots stay busy until they exit (ClusterState::stopping):
//    a process that still holds the device is not a free slot, and the
//    exit of the old run's rank must not be taken for one of the next run
//    on the same slot.
// 4. Placed again, it starts as a new run: generation 1 of the job, whose
//    workers resume from the checkpoint exactly as a job submitted with
//    resume_from does. The worker reads a generation above 1 as an elastic
//    re-formation (survivors keep their memory), which a fresh start is
//    not; so the run restarts the generation count and its store keys get
//    a namespace of their own (`JOB/run-N/gen-G`, from Job.preemptions).
//
// A coordinator restart during step 2 takes the job back as RUNNING (its
// wait was in memory only); the next plan preempts it again and asks for a
// new checkpoint. Ranks that were already holding take no second one: the
// wait then times out and the job resumes from the checkpoint they held
// at, losing nothing but the wait. After step 2 the job is PENDING with its
// resume_from in the state database.

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
