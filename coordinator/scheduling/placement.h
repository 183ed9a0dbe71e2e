// Placement: which free slots the queued jobs get, as a pure function.
//
// The scheduler orders the queue with PlanQueue (queue_plan.h: priorities,
// fair share, quotas, backfill and reservations), which takes slots with
// SlotsFor and TakeSlots below. PlaceJobs is the plain order it replaced,
// kept as the reference its benchmark compares against:
//
// Strict FIFO: the oldest queued job is placed as soon as at least its
// min_ranks slots of its device are free, taking up to max_ranks; a job that
// does not fit stops placement, so later (smaller) jobs wait behind it and
// no job starves. Except a job that could not start even if every connected
// agent were idle (no agent of its device, min_ranks beyond all their slots,
// ranks larger than any agent's memory): it waits without blocking the jobs
// behind it, since nothing they do can make room for it; once agents that
// can hold it connect, it blocks as any other. Ranks are numbered in a stable order: agents in the
// order given (registration order), then slots. A rank's local_rank and local_world_size count the
// job's ranks on the same agent.
//
// Memory: a job whose ranks need `rank_bytes` each (common/memory_estimate.h)
// gets at most memory_bytes / rank_bytes of its ranks on one agent, and none
// on an agent that cannot hold one; an agent that does not report its memory
// (0) is not limited. Jobs already running on an agent are not counted: the
// estimate guards against sizes a machine cannot hold at all, it is no
// memory scheduler.
//
// Thread-safety: a pure function.
//
// Example:
//   std::vector<JobPlacement> placed = PlaceJobs(queued_oldest_first, agents_in_order);
//   for (const JobPlacement& p : placed) Launch(p.job_id, p.ranks);
#ifndef CHORUS_COORDINATOR_SCHEDULING_PLACEMENT_H_
#define CHORUS_COORDINATOR_SCHEDULING_PLACEMENT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "chorus/v1/job.pb.h"

namespace chorus {

// A queued job as placement sees it.
struct QueuedJob {
  std::string job_id;
  v1::ResourceSpec resources;
  int64_t rank_bytes = 0;  // estimated memory per rank; 0 = unknown
  // A re-formed generation numbers its survivors first (see
  // generation_plan.h): set for jobs with hot spares.
  bool survivors_first = false;
};

// `spec` (normalized) as placement sees it; rank_bytes is its memory
// estimate from the spec alone (files are not read: the coordinator may not
// see the ranks' files).
QueuedJob ToQueuedJob(const std::string& job_id, const v1::JobSpec& spec);

// The free slots of one agent.
struct AgentSlots {
  std::string agent_id;
  v1::ResourceSpec::Device device = v1::ResourceSpec::CPU;
  std::vector<int> free_slots;  // ascending
  int64_t memory_bytes = 0;     // the machine's memory; 0 = unknown
  std::string host;
  int total_slots = 0;  // busy or free; below free_slots.size() counts as that
};

// Where one rank of a placed job runs.
struct RankSlot {
  std::string agent_id;
  int slot = 0;
  int local_rank = 0;
  int local_world_size = 0;
};

struct JobPlacement {
  std::string job_id;
  std::vector<RankSlot> ranks;  // index = rank
};

// Places `queued` (oldest first) onto `agents` (in rank order), each job
// taking the slots the jobs before it left. Returns the placed jobs in queue
// order: a prefix of `queued`, less the jobs that FitsIdleAgents refuses.
std::vector<JobPlacement> PlaceJobs(const std::vector<QueuedJob>& queued,
                                    const std::vector<AgentSlots>& agents);

// The slots `job` could take of `free` (per agent of `agents`, ascending),
// as (agent index, slot) in rank order: agents of its device, on each at
// most RanksThatFit; at most `limit` of them.
std::vector<std::pair<size_t, int>> SlotsFor(const QueuedJob& job,
                                             const std::vector<AgentSlots>& agents,
                                             const std::vector<std::vector<int>>& free,
                                             size_t limit = SIZE_MAX);
// The placement of `job_id` on `slots` (from SlotsFor), which leave `free`.
JobPlacement TakeSlots(const std::string& job_id, const std::vector<AgentSlots>& agents,
                       const std::vector<std::pair<size_t, int>>& slots,
                       std::vector<std::vector<int>>& free);

// Whether `job` would start on `agents` if every one of their slots were
// free: its min_ranks on agents of its device, by slots and memory.
bool FitsIdleAgents(const QueuedJob& job, const std::vector<AgentSlots>& agents);

// How many ranks of `job` `agent` may hold, by memory alone (INT_MAX when
// either side is unknown).
int RanksThatFit(const QueuedJob& job, const AgentSlots& agent);

// Why `job`, placed on its own, would not start on `agents` now, in words for
// `chorus status` ("waiting for 2 free CPU slots; ..."); if it would, that it
// waits behind older queued jobs.
std::string PendingReason(const QueuedJob& job, const std::vector<AgentSlots>& agents);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_PLACEMENT_H_
