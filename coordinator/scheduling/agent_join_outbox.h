// AgentJoinOutbox: answers to the joins agents send for their ranks
// (v1::RankJoins), gathered per agent so that the answers that are ready at
// the same moment leave as one v1::RankJoinAnswers message (Note [Joins
// through the agent] in scheduler.h).
//
// A join through an agent waits in its generation's Rendezvous like any
// other, with the callback DoneFor returns; the callback only records the
// answer. Send() then writes what was recorded, one message per agent. The
// Scheduler calls Send() each time it has delivered a batch of answers
// (Outbox::Flush), so an answer is recorded and sent by the same flush.
//
// Thread-safety: all methods may be called concurrently; senders run
// without the outbox's lock held.
//
// Example:
//   AgentJoinOutbox outbox;
//   Rendezvous::Done done = outbox.DoneFor("agent-1", /*connection=*/1, send, request);
//   done(response);   // recorded
//   outbox.Send();    // one RankJoinAnswers message to agent-1
#ifndef CHORUS_COORDINATOR_SCHEDULING_AGENT_JOIN_OUTBOX_H_
#define CHORUS_COORDINATOR_SCHEDULING_AGENT_JOIN_OUTBOX_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/scheduling/agent_registry.h"
#include "coordinator/scheduling/rendezvous.h"

namespace chorus {

class AgentJoinOutbox {
 public:
  AgentJoinOutbox() = default;
  AgentJoinOutbox(const AgentJoinOutbox&) = delete;
  AgentJoinOutbox& operator=(const AgentJoinOutbox&) = delete;

  // The callback the join `request` of agent `agent_id`'s connection
  // `connection` (AgentRegistry::Agent::order: an agent that reconnects
  // keeps its id, not its stream) waits with: it records the answer, to go
  // out through `send` at the next Send(), beside the other answers to the
  // same connection only. The outbox must outlive it.
  Rendezvous::Done DoneFor(const std::string& agent_id, int64_t connection, AgentSender send,
                           const v1::JoinRequest& request);

  // Sends each agent one message with the answers recorded for it since
  // the last call; none to an agent without any.
  void Send();

 private:
  struct Pending {
    AgentSender send;
    v1::CoordinatorMessage message;
  };

  absl::Mutex mu_;
  // By agent id and connection.
  std::map<std::pair<std::string, int64_t>, Pending> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_AGENT_JOIN_OUTBOX_H_
