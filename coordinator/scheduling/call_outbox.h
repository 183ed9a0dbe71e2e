// CallOutbox: what one call into the Scheduler decided under its lock and
// does after releasing it (Note [The scheduler's writes after its lock]
// below): durable writes first, in each job's order, then messages to
// agents, then the launches of started jobs whose start was recorded, then
// answers to joins (those through agents gathered into one message per
// agent), and last a callback with what the writes settled.
//
// Thread-safety: one per call, used by one thread; AgentJoinOutbox and
// JobWrites have their own locks.
//
// Example:
//   CallOutbox out(agent_joins, writes, after_writes);
//   {
//     absl::MutexLock lock(&mu);
//     out.writes.Add(job_id, [...] { ... });
//     out.messages.emplace_back(send, message);
//   }
//   out.Flush();
#ifndef CHORUS_COORDINATOR_SCHEDULING_CALL_OUTBOX_H_
#define CHORUS_COORDINATOR_SCHEDULING_CALL_OUTBOX_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chorus/v1/coordinator.pb.h"
#include "coordinator/scheduling/agent_join_outbox.h"
#include "coordinator/scheduling/agent_registry.h"
#include "coordinator/scheduling/rendezvous.h"
#include "coordinator/state/job_writes.h"

namespace chorus {

// Note [The scheduler's writes after its lock]
// A durable write (an fsync'd SQLite commit, an etcd transaction) takes
// seconds on a slow disk or a slow etcd, and every heartbeat, join and
// agent message of every job waits for the scheduler's lock. So what the
// scheduler decides under the lock that must be written (a job's start,
// end, re-formation, re-queue, events, placements, elastic record) goes
// into the call's Outbox as a write, in its job's order (JobWrites), and
// runs once the lock is released, before the call's messages and answers
// go out: an agent is told to launch, and a rank to join a generation,
// only after what a restarted coordinator needs to take them back is
// durable, as before. A slow write then holds up only its own job's later
// writes and the call that made it.
// What the state store shows lags the scheduler meanwhile, so the
// scheduler never decides from it what it decided itself: a job it started
// (one of its running jobs) or whose end is being written (ClusterState::settling) is not queued,
// though the store may still say PENDING. A start whose write fails is
// undone (its launches are not sent; Scheduler::AfterWrites); a re-queued job is
// placed once its write has made it PENDING; any other failed write is
// logged, and a write refused by etcd's fence has already ended this
// coordinator's term (EtcdStateStoreOptions::on_fenced).
// One per call (CallOutbox), its after-writes step AfterWrites.

struct CallOutbox {
  // Called by Flush, after everything else, when the writes settled a job,
  // a start was not recorded, or a job was re-queued: `settled` (the
  // `settling` below), `unrecorded` (jobs whose launches were dropped) and
  // `requeued`.
  using AfterWrites =
      std::function<void(const std::vector<std::string>& settled,
                         const std::vector<std::string>& unrecorded, bool requeued)>;

  CallOutbox(AgentJoinOutbox& agent_joins, JobWrites& order, AfterWrites after_writes)
      : agent_joins(agent_joins), after_writes(std::move(after_writes)), writes(order) {}
  CallOutbox(const CallOutbox&) = delete;
  CallOutbox& operator=(const CallOutbox&) = delete;

  // Runs the writes, sends the rest in the order above, and calls
  // after_writes if there is anything for it. Everything is cleared: the
  // outbox may be used again.
  void Flush();

  std::vector<std::pair<AgentSender, v1::CoordinatorMessage>> messages;
  Rendezvous::Answers joins;
  // Where answers to joins through agents gather (Note [Joins through the
  // agent] in agent_join_outbox.h): sent, one message per agent, after `joins`.
  AgentJoinOutbox& agent_joins;
  // A started job's launch messages, sent after `messages` if its start was
  // recorded (`recorded` is set by its write).
  struct Launch {
    std::string job_id;
    std::shared_ptr<bool> recorded;
    std::vector<std::pair<AgentSender, v1::CoordinatorMessage>> messages;
  };
  std::vector<Launch> launches;
  // Jobs whose end or start was written (or failed to be) by `writes`:
  // settled again once they have run.
  std::vector<std::string> settling;
  // Set by the writes: a re-queued job is PENDING again.
  bool requeued = false;
  AfterWrites after_writes;
  // Durable writes, run first. Last, so that writes left to its destructor
  // (a call that returned early) still find the fields above.
  JobWrites::Batch writes;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_CALL_OUTBOX_H_
