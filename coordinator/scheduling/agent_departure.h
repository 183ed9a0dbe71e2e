// What a running job does when a node agent it has ranks on is gone or
// drained, as transitions of the job's state that return what the
// Scheduler is to do:
//   OnAgentLost       the agent's stream ended: rebind, wait for it, re-form
//                     without its ranks, or fail;
//   OnAgentDrained    `chorus drain`: an elastic job re-forms without the
//                     agent's ranks at its next step boundary; any other
//                     job keeps them there until it ends;
//   GiveUpLostAgents  the agents waited for are not back by the deadline:
//                     the job re-forms without their ranks;
//   GiveUpUnbound     the agent connected again without some of its ranks:
//                     the job re-forms without them.
// The Scheduler applies the answers (records the event, re-forms, ends the
// job) and removes the agent from the registry.
//
// Thread-safety: none; the Scheduler holds its lock around every call.
//
// Example:
//   AgentLoss loss = OnAgentLost(run, agent_id, hello, grace, false, clock.Now());
//   if (loss.kind == AgentLoss::Kind::kReform) ... re-form with loss.text as the cause
#ifndef CHORUS_COORDINATOR_SCHEDULING_AGENT_DEPARTURE_H_
#define CHORUS_COORDINATOR_SCHEDULING_AGENT_DEPARTURE_H_

#include <string>

#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/scheduling/running_job.h"

namespace chorus {

// Note [An elastic job's lost agent]
// An agent's stream ends when its node dies, and also when a slow or cut
// link made the agent's keepalive give the connection up (its ranks train
// on: their collectives go between the nodes) or the connection's end
// reaches the coordinator before the agent's new hello does (Note [An agent
// back before its stream ended] below covers the other order).
// Re-formed at once, the job restarted a generation for a rank that never
// stopped: an elastic job with a rank across a 6 s cut counted two
// restarts. So an elastic job, too, waits for the agent (Note [Agent
// reconnect grace] in running_job.h), but only kElasticAgentGrace (or the
// reconnect grace, if shorter: 0 turns the wait off): an agent that is not
// back by then is lost, and the job re-forms without its ranks, as it did
// at once before. A node that died costs the job that much more time to
// re-form.
inline constexpr absl::Duration kElasticAgentGrace = absl::Seconds(5);

struct AgentLoss {
  enum class Kind {
    kNone,    // no rank of the job that had not left ran there
    kRebind,  // its ranks there wait for the agent's new hello, which names
              // it (Note [An agent back before its stream ended])
    kAwait,   // the job waits for the agent's ranks; `text` is the event
    kReform,  // an elastic job re-forms now; `text` is the cause
    kFail,    // the job fails; `text` is the reason
  };
  Kind kind = Kind::kNone;
  std::string text;
};

// The stream of agent `agent_id` (its hello `hello`) ended at `now` while
// `run` had ranks on it; `rebinding`: the agent's process has connected
// again already. Ranks that had left with a drain are gone with it. An
// elastic job rebinds, or waits the shorter of `reconnect_grace` and
// kElasticAgentGrace, or (a zero grace) re-forms at once; any other job
// waits `reconnect_grace`, or fails at once when that is zero. A wait
// extends the job's deadline (recovering_until) and records the agent in
// its wait_cause.
AgentLoss OnAgentLost(RunningJob& run, const std::string& agent_id, const v1::AgentHello& hello,
                      absl::Duration reconnect_grace, bool rebinding, absl::Time now);

// Note [An elastic job's lost agent]: the agents `run` waited for are not
// back. Their ranks still unbound are lost on them, the wait ends, and the
// cause of the re-formation is returned (each agent, its ranks and the
// grace it had).
std::string GiveUpLostAgents(RunningJob& run);

// Note [An agent back before its stream ended]
// On a slow, lossy link an agent's keepalive gives its connection up (no
// answer to a ping within 2 s while TCP resends) well before the
// coordinator's own keepalive does (10 + 10 s), and the agent connects again
// while the coordinator still holds its old stream (Note [Agent reconnect
// grace] in running_job.h says how it is recognized). Its ranks never
// stopped: they train on, their collectives going between the nodes. An
// elastic job used to re-form at once, as for an agent lost, which the
// ranks still running then saw as a restart for nothing; now the ranks the
// new hello lists are rebound to it in the same step, and the job re-forms
// only without those it does not list (exited meanwhile, or gone).

// The agent `agent` (its new hello, its new id) connected again and
// rebound what it listed: ranks of its earlier registration still unbound
// are lost on it. The cause of the re-formation, or "" when none is left.
std::string GiveUpUnbound(RunningJob& run, const v1::AgentHello& agent);

struct AgentDrain {
  enum class Kind {
    kNone,    // no rank of the job runs there
    kReform,  // an elastic job's planned change; `text` is the cause
    kStays,   // a job that is not elastic keeps running; `text` is the event
  };
  Kind kind = Kind::kNone;
  std::string text;
};

// Agent `agent_id` (`who`: its id and host, for messages) is drained: what
// `run` does with its ranks that have not exited there.
AgentDrain OnAgentDrained(const RunningJob& run, const std::string& agent_id,
                          const std::string& who);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_AGENT_DEPARTURE_H_
