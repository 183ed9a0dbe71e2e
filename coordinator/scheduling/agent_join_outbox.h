// AgentJoinOutbox: answers to the joins agents send for their ranks
// (v1::RankJoins), gathered per agent so that the answers that are ready at
// the same moment leave as one v1::RankJoinAnswers message (Note [Joins
// through the agent] below).
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

// Note [Joins through the agent]
// When one rank of a 16,384-rank elastic job is lost, every survivor
// joins the next generation. One RankService.Join per rank cost the
// coordinator ~75 us of gRPC work each (a call, its metadata, its
// reactor, its answer), 16k of them more than a second on the critical
// path, growing with the job (docs/benchmarks.md, "Coordinator load").
// So an agent may send its ranks' joins as one RankJoins message on its
// own stream, and gets the answers back in RankJoinAnswers messages: the
// coordinator's per-message work is then per agent, and per rank only the
// rendezvous bookkeeping remains (O(1) each, Note [Rendezvous is
// O(ranks)] in rendezvous.h). The parts of an answer every rank
// shares (the spec, the checkpoint to resume from, the store namespace,
// the world size: most of its bytes) go once per agent, not once per rank
// (common/join_answers.h), so the bytes sent grow with ranks + agents,
// not ranks x spec.
// Each join in the batch is exactly a Scheduler::Join: the same generation
// checks, UNAVAILABLE for a generation not formed yet, leave for a
// draining rank, expiry after `deadline` naming the missing ranks, a
// retry superseding the pending join (ABORTED), completion counted once
// per rank whichever way it joined. Only two things differ: the agent
// speaks for its own slots only (agent_id and host are the stream's, not
// the request's), and the answers wait for the end of the call that made
// them, so that every answer of one completion reaches an agent in one
// message. A rank without an agent channel (an older agent, a program's
// supervisor) keeps its own Join; both kinds mix freely in a generation.
// Joins from an unknown agent are ignored (its stream is ending).

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
