// JoinRelay: a program's joins, carried by its supervisor (chorus-rank) to
// the node agent. An SDK program re-forming an elastic job joins the next
// generation from its own process, and its only channel is the progress
// channel to its supervisor (progress_channel.h); the supervisor holds the
// channel to the agent. So the supervisor tells the program that joins may
// go over the progress channel (CHORUS_AGENT_JOINS=1 in its environment)
// when its agent takes them, and hands each join the program sends there to
// this relay, which sends it on over the agent's channel and passes the
// agent's answer back to the program (Note [Joins gathered by the agent] in
// worker/agent/agent.cc). When the agent's channel fails, the program is
// answered join_directly and calls RankService.Join itself.
//
// Thread-safety: Relay() from any thread; one thread of its own carries the
// joins one at a time (a program has one rank: its joins come one after
// another). The destructor stops it and joins it.
//
// Example:
//   JoinRelay relay(program_end, agent_end);
//   receiver.Receive(deadline);
//   for (v1::JoinRequest& join : program_end.TakeJoins()) relay.Relay(std::move(join));
#ifndef CHORUS_WORKER_RUNTIME_JOIN_RELAY_H_
#define CHORUS_WORKER_RUNTIME_JOIN_RELAY_H_

#include <deque>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/coordinator.pb.h"
#include "worker/runtime/progress_channel.h"

namespace chorus {

class JoinRelay {
 public:
  // `program`: the supervisor's end of the program's progress channel; it
  // must outlive the relay. `agent`: the supervisor's end of its agent's
  // channel (the agent takes joins).
  JoinRelay(ProgressReceiver& program, std::shared_ptr<ProgressSender> agent);
  ~JoinRelay();
  JoinRelay(const JoinRelay&) = delete;
  JoinRelay& operator=(const JoinRelay&) = delete;

  // Carries `join` to the agent and its answer back; returns at once.
  void Relay(v1::JoinRequest join) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // The agent's answer to `join`; nullopt when the relay stops first.
  std::optional<v1::AgentJoinAnswer> Carry(const v1::JoinRequest& join) ABSL_LOCKS_EXCLUDED(mu_);
  bool Stopping() const ABSL_LOCKS_EXCLUDED(mu_);

  ProgressReceiver& program_;
  const std::shared_ptr<ProgressSender> agent_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::JoinRequest> queue_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after everything above is set
};

}  // namespace chorus

#endif  // CHORUS_WORKER_RUNTIME_JOIN_RELAY_H_
