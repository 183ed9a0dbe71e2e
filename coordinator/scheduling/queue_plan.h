// QueuePlan: the order of the queue, quotas, backfill and the reservation,
// as a pure function (docs/scheduling.md).
//
// Order: every HIGH job before any NORMAL one before any LOW one; within a
// priority, a job that holds its device's reservation first (Note
// [Reservation]), then the owner with the least decayed usage (slot-seconds,
// halving every fair_share_half_life, FairShare in fair_share.h) first; then
// submit order. In that order each job is placed on the free slots (placement.h),
// taking between min_ranks and max_ranks, unless one of these holds:
//   * its owner's running jobs (and those placed before it in this plan)
//     hold the user's max slots of its device, or too many for min_ranks
//     more: it waits "alice uses 8 of 8 CPU slots (quota)", blocking nobody;
//   * no connected agent could ever hold it (FitsIdleAgents): it waits,
//     blocking nobody;
//   * too few free slots: see Note [Reservation].
// A placed job takes at most the slots its owner's quota leaves.
//
// Note [Reservation]
// Per device, the first job in the order that waits only for free slots of
// that device holds its reservation: the free slots it could use (SlotsFor,
// fewer than its min_ranks) are withheld from every later job, and from
// running elastic jobs that would grow onto them. Since each slot of its
// device that frees is its first (it comes before every other waiting job of
// that device), it starts once enough running work ends: it cannot be
// starved by later or smaller jobs. Every other job that does not fit
// blocks nobody: later jobs take the slots no holder can use (another
// device, agents its ranks' memory does not fit) - that is backfill. No job declares how long it
// runs, so a later job is never started on reserved slots in the hope that it ends in time: no
// estimated start can be given either.
//
// A holder keeps its place: the plan is given the jobs that held a
// reservation in the plan before (QueueUsage::reservations_held), and those
// come before every other job of their priority, whatever the usage of the
// others' owners. Without that, fair share put a later job of an owner with
// less usage before the holder, and a small one started on the first slot
// that freed while the holder was told it was first in line (issue 57). So
// only a job of higher priority takes the reservation; its old holder keeps
// its claim while it waits behind it and is first again once it starts. A
// holder that comes to wait for its quota or an agent, not for free slots,
// gives the claim up. The claim lives in the scheduler's last plan, so a
// coordinator restart or a new leader starts from the fair-share order.
//
// Thread-safety: a pure function.
//
// Example:
//   QueuePlan plan = PlanQueue(queued_in_submit_order, agents.FreeSlots(), usage, policy);
//   for (const JobPlacement& p : plan.placed) Launch(p.job_id, p.ranks);
#ifndef CHORUS_COORDINATOR_SCHEDULING_QUEUE_PLAN_H_
#define CHORUS_COORDINATOR_SCHEDULING_QUEUE_PLAN_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "chorus/v1/job.pb.h"
#include "coordinator/scheduling/placement.h"
#include "coordinator/scheduling/scheduling_policy.h"

namespace chorus {

// A queued job as the queue plan sees it.
struct QueueEntry {
  QueuedJob job;
  std::string owner;  // "" is the anonymous user
  v1::JobSpec::Priority priority = v1::JobSpec::NORMAL;
};

// What the users have now.
struct QueueUsage {
  // Slots each owner's running jobs hold, per device.
  std::map<std::string, std::map<v1::ResourceSpec::Device, int>> slots_in_use;
  // Each owner's decayed usage in slot-seconds (FairShare::Usage).
  std::map<std::string, double> fair_share;
  // The jobs that held a reservation in the last plan and keep their claim
  // (QueuePlan::reservations_held of that plan; Note [Reservation]).
  std::set<std::string> reservations_held;
};

// Why a job waits, as a small fixed set (the reason's text says more); for
// /metrics, whose labels cannot carry the free text.
enum class WaitClass {
  kQuota,        // its owner's quota (or a quota below its min_ranks)
  kFreeSlots,    // too few free slots; it is first in line (holds the reservation)
  kReservation,  // behind the job that holds its device's reservation
  kNoAgent,      // no connected agent could hold it, even idle
};
inline constexpr WaitClass kAllWaitClasses[] = {WaitClass::kQuota, WaitClass::kFreeSlots,
                                                WaitClass::kReservation, WaitClass::kNoAgent};
// "quota", "free_slots", "reservation", "no_agent".
const char* WaitClassName(WaitClass wait);

// A job the plan does not start, and why.
struct WaitingJob {
  std::string job_id;
  std::string reason;  // for `chorus queue` and `chorus status`
  WaitClass wait = WaitClass::kFreeSlots;
};

struct QueuePlan {
  // Every queued job's id, in the order above.
  std::vector<std::string> order;
  // Jobs to start now, in that order.
  std::vector<JobPlacement> placed;
  // The others, in that order.
  std::vector<WaitingJob> waiting;
  // Each device's reservation holder (none: no entry) and the slots the
  // holders hold: agent id -> slots, ascending.
  std::map<v1::ResourceSpec::Device, std::string> reservation_holders;
  std::map<std::string, std::vector<int>> reserved;
  // The jobs that keep a claim to their device's reservation in the next
  // plan: this plan's holders, and earlier holders still waiting for free
  // slots behind a job of higher priority (Note [Reservation]).
  std::set<std::string> reservations_held;
};

// Plans `queued` (in submit order) onto the free slots of `agents` (in rank
// order).
QueuePlan PlanQueue(const std::vector<QueueEntry>& queued, const std::vector<AgentSlots>& agents,
                    const QueueUsage& usage, const SchedulingPolicy& policy);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_QUEUE_PLAN_H_
