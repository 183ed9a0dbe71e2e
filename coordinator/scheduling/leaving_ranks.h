// LeavingRanks: the ranks one elastic job loses without a failure, each known
// by the slot it runs on (agent id, slot) and in one state:
//   yielding   a rank of the current generation that a higher-priority job
//              preempted (Note [Preemption by shrinking] in preemption.h):
//              it leaves at the next change of generation;
//   departing  no rank any more (it left at a step boundary, its agent
//              draining or its slot preempted, or it was a staged newcomer
//              that was stopped: Note [Staged growth] in
//              staged_growth.h) whose process has not exited: its slot
//              stays busy until the exit is reported.
// Transitions move a rank from state to state; the Scheduler frees the slot
// when OnExited says a departing rank is gone.
//
// Thread-safety: none; the Scheduler holds its lock around every use.
//
// Example:
//   LeavingRanks leaving;
//   leaving.Yield("agent-1", 0);                    // preempted
//   leaving.OnGenerationBegun({{"agent-1", 0}});    // it left at the boundary
//   if (leaving.OnExited("agent-1", 0)) agents.SetBusy("agent-1", 0, false);
#ifndef CHORUS_COORDINATOR_SCHEDULING_LEAVING_RANKS_H_
#define CHORUS_COORDINATOR_SCHEDULING_LEAVING_RANKS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace chorus {

class LeavingRanks {
 public:
  using Slot = std::pair<std::string, int>;  // agent id, slot
  enum class State { kYielding, kDeparting };

  // Transitions.
  // A preemption picked the rank on `slot`: it leaves at the next change.
  void Yield(const std::string& agent_id, int slot);
  // The rank (or staged newcomer) on `slot` was stopped, or left: its slot
  // is busy until it exits.
  void Depart(const std::string& agent_id, int slot);
  // A change of generation began: `left` (the ranks that leave at its step
  // boundary and exit by themselves) depart; no rank yields any more (a
  // yielding one that exited or lost its agent is simply gone).
  void OnGenerationBegun(const std::vector<Slot>& left);
  // The process on `slot` exited: true (and forgotten) if it was departing,
  // so that its slot is free; false otherwise.
  bool OnExited(const std::string& agent_id, int slot);
  // The agent is gone: the ranks that had departed from it are gone with it.
  void OnAgentGone(const std::string& agent_id);

  // Reads.
  bool yielding(const std::string& agent_id, int slot) const;
  bool departing(const std::string& agent_id, int slot) const;
  // Whether any rank yields or departs.
  bool empty() const { return states_.empty(); }
  // How many ranks yield or depart: slots on their way to a preempting job.
  int size() const { return static_cast<int>(states_.size()); }
  // The departing ranks' slots, by agent id and slot.
  std::vector<Slot> Departing() const;
  // Whether a departing rank's process runs on `agent_id`.
  bool DepartingOn(const std::string& agent_id) const;

 private:
  std::map<Slot, State> states_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_LEAVING_RANKS_H_
