// StagedGrowth: one elastic job's staged growth (Note [Staged growth] in
// scheduler_elastic.cc): the newcomers started for its next generation
// before that generation forms. Its transitions say what the Scheduler is to do (Actions: slots to
// free, newcomers to stop, the change to request); it sends nothing itself.
//
// Thread-safety: none; the Scheduler holds its lock around every use.
//
// Example:
//   StagedGrowth staged;
//   staged.Start(/*generation=*/3, /*world_size=*/4, "1 free slot(s) ...", {newcomer},
//                now, absl::Seconds(60));
//   StagedGrowth::JoinOutcome join = staged.OnJoin("agent-2", 0, 3, false, false);
//   if (join.request_change) { /* the survivors re-form at their next step boundary */ }
#ifndef CHORUS_COORDINATOR_SCHEDULING_STAGED_GROWTH_H_
#define CHORUS_COORDINATOR_SCHEDULING_STAGED_GROWTH_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/scheduling/agent_registry.h"
#include "coordinator/scheduling/placement.h"

namespace chorus {

// A newcomer of a staged growth: launched for the next generation before it
// forms.
struct StagedNewcomer {
  RankSlot slot;    // where it runs (local_rank and local_world_size planned)
  int rank = 0;     // its planned rank
  bool up = false;  // its program has asked to join (it is waiting)
};

// A staged growth under way. (Defined outside StagedGrowth, as
// RequeueWaitState in requeue_wait.h.)
struct StagedGrowthState {
  int64_t generation = 0;
  int world_size = 0;
  std::string cause;
  std::vector<StagedNewcomer> newcomers;
  absl::Time deadline;
  absl::Duration wait;  // elastic.wait_seconds
};

class StagedGrowth {
 public:
  // What a transition asks of the Scheduler.
  struct Actions {
    // Slots (agent id, slot) now free: their newcomer exited before it
    // joined.
    std::vector<std::pair<std::string, int>> freed;
    // Newcomers to stop, by agent id; their slots stay busy until their
    // exits are reported (the job's departing ranks). `stop_reason` says why.
    std::map<std::string, std::vector<int>> stop;
    std::string stop_reason;
    // Newcomers the next generation takes (agent id, slot): running
    // already, they join; they are not launched again.
    std::vector<std::pair<std::string, int>> adopted;
    // Every newcomer is up and no change is requested yet: the growth's
    // change is to be requested now (its cause is cause()).
    bool request_change = false;
  };

  // Whether a growth is staged.
  bool active() const { return growth_.has_value(); }
  // The staged growth's generation, world size and cause. REQUIRES: active().
  int64_t generation() const { return growth_->generation; }
  int world_size() const { return growth_->world_size; }
  const std::string& cause() const { return growth_->cause; }
  absl::Time deadline() const { return growth_->deadline; }
  // Its newcomers not stopped or exited; empty when none is staged.
  const std::vector<StagedNewcomer>& newcomers() const;

  // Transitions. `change_requested`: whether the job has a planned change
  // requested (ElasticPhase::planned()), the growth's own once all are up.

  // `newcomers` were launched for `generation` of `world_size` ranks after
  // `cause`; they must all be up within `wait`. REQUIRES: !active().
  void Start(int64_t generation, int world_size, std::string cause,
             std::vector<StagedNewcomer> newcomers, absl::Time now, absl::Duration wait);

  // A Join from `agent_id`'s `slot` for `generation`.
  struct JoinOutcome {
    enum Kind {
      kNotStaged,      // not a newcomer of this growth: an ordinary Join
      kStartsProgram,  // its chorus-rank: answer the planned membership now
      kUp,             // its program: answer UNAVAILABLE (join again)
    };
    Kind kind = kNotStaged;
    StagedNewcomer newcomer;
    // Every newcomer is up now and no change is requested yet: as
    // Actions::request_change.
    bool request_change = false;
  };
  JoinOutcome OnJoin(const std::string& agent_id, int slot, int64_t generation,
                     bool starts_program_first, bool change_requested);

  // The process on `agent_id`'s `slot` exited: nullopt when it is not a
  // newcomer. Its slot is freed; before the change is requested (or when
  // it was the last) the others are stopped and the growth is over, after
  // it the change plans without it.
  std::optional<Actions> OnExited(const std::string& agent_id, int slot, bool change_requested);

  // Newcomers not all up by the deadline, the change not requested: they
  // are stopped and the growth is over.
  Actions OnTick(absl::Time now, bool change_requested);

  // The next generation was planned on `next_ranks`: the newcomers on its
  // slots are adopted, the others stopped; the growth is over either way.
  Actions OnGenerationBegun(const std::vector<RankSlot>& next_ranks);

  // Stops every newcomer for `why`; the growth is over.
  Actions Drop(const std::string& why);

  // The newcomers' slots (on registered agents that are not draining),
  // ahead of `free`: a re-formation's plan takes them before any other.
  std::vector<AgentSlots> SlotsFirst(const AgentRegistry& agents,
                                     std::vector<AgentSlots> free) const;

 private:
  std::optional<StagedGrowthState> growth_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_STAGED_GROWTH_H_
