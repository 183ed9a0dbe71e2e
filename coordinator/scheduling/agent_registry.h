// AgentRegistry: the node agents connected to the coordinator and which of
// their slots are busy.
//
// Agents are kept in registration order, which is the order ranks are
// numbered in (placement.h). An agent's id ("agent-N") is never reused.
//
// Thread-safety: none; the Scheduler holds its lock around every call.
//
// Example:
//   AgentRegistry agents;
//   ASSIGN_OR_RETURN(std::string id, agents.Add(hello, send));
//   std::vector<PlaceJobs> placed = PlaceJobs(queued, agents.FreeSlots());
#ifndef CHORUS_COORDINATOR_SCHEDULING_AGENT_REGISTRY_H_
#define CHORUS_COORDINATOR_SCHEDULING_AGENT_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/scheduling/placement.h"

namespace chorus {

// Delivers a message to an agent (its stream's writer).
using AgentSender = std::function<void(const v1::CoordinatorMessage&)>;

class AgentRegistry {
 public:
  struct Agent {
    v1::AgentHello hello;  // device filled in (CPU when unspecified)
    AgentSender send;
    std::vector<bool> busy;  // per slot
    int64_t order = 0;       // registration order
    // `chorus drain`: its free slots are offered to no job.
    bool draining = false;
    // When its last message came (Note [A silent agent's ranks] in
    // hang_detector.h); its registration's time until then.
    absl::Time heard_at = absl::InfinitePast();
    // Its node's CPU pressure as its last message said (AgentMessage's
    // cpu_pressure; Note [A starved node] in hang_detector.h); 0 until then.
    double cpu_pressure = 0;
  };

  // Registers an agent with every slot free; returns its new id.
  // INVALID_ARGUMENT for a hello with slots outside [1, 1024].
  absl::StatusOr<std::string> Add(const v1::AgentHello& hello, AgentSender send);
  // Forgets the agent; false if it is unknown.
  bool Remove(const std::string& agent_id);
  // Null if unknown.
  const Agent* Find(const std::string& agent_id) const;
  // Marks a slot busy or free; ignored for an unknown agent.
  void SetBusy(const std::string& agent_id, int slot, bool busy);
  // Marks the agent as draining; false if it is unknown.
  bool SetDraining(const std::string& agent_id);
  // Records that a message from the agent came at `at`, saying its node's
  // CPU pressure was `cpu_pressure`; ignored for an unknown agent.
  void Heard(const std::string& agent_id, absl::Time at, double cpu_pressure = 0);
  // The id of the agent `name` names: its id, or the host of exactly one
  // agent. NOT_FOUND listing the agents, or INVALID_ARGUMENT when several
  // agents have that host.
  absl::StatusOr<std::string> Resolve(const std::string& name) const;
  // Every agent's id, in registration order.
  std::vector<std::string> Ids() const;
  // The agent process of `hello` connecting again while its old stream is
  // still open here (Note [An agent back before its stream ended] in
  // agent_departure.h): the id its hello says it was welcomed with, if an
  // agent of that id, host and pid is registered; nullopt otherwise, or for
  // a hello without an id or a pid. All three are compared: two agents on
  // one host name (containers sharing the host's network) may have the same
  // pid in their own pid namespaces.
  std::optional<std::string> StillOpen(const v1::AgentHello& hello) const;
  // Every agent's free slots, in registration order; a draining agent
  // offers none.
  std::vector<AgentSlots> FreeSlots() const;
  // Free slots of agents that are not draining.
  int free_slots() const;
  // How many agents are connected.
  int size() const { return static_cast<int>(agents_.size()); }
  // Slots of the connected agents, free and busy, by device.
  struct SlotCount {
    int64_t free = 0;
    int64_t used = 0;
  };
  std::map<v1::ResourceSpec::Device, SlotCount> SlotsByDevice() const;

 private:
  std::map<std::string, Agent> agents_;
  int64_t next_agent_ = 1;
};

// A message telling an agent to stop `slots` of `job_id` (10 s grace).
v1::CoordinatorMessage StopRanksMessage(const std::string& job_id, const std::vector<int>& slots,
                                        const std::string& reason);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_AGENT_REGISTRY_H_
