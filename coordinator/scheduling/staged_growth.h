// StagedGrowth: one elastic job's staged growth (Note [Staged growth]
// below): the newcomers started for its next generation
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

// Note [Staged growth]
// A rank lost from a program that re-forms in its own process (the Python
// package, the C++ SDK) is replaced in two steps, so that the survivors do
// not wait for the replacement's program to start (a Python newcomer
// imports torch and chorus for most of a second before it can connect):
//  1. the failure's generation (g+1) forms at once with the survivors alone
//     when they are at least resources.min_ranks: the free slots the full
//     plan would have taken are left free, and the generation owes its
//     replacements (RunningJob::replacements_owed);
//  2. once g+1 has formed, the Scheduler's GrowLocked takes the free slots at once (not
//     after elastic.scale_up_interval_seconds, which paces growth onto new
//     slots, not the return to the size the job had): an ordinary planned
//     growth, g+2 at the survivors' next step boundary, not a restart.
// Below min_ranks, or for the built-in trainer (its newcomers load LibTorch
// while the survivors rebuild their transport anyway) and a program that
// restarts all (Note [Restart-all]), g+1 takes its newcomers at once, as
// before. "The next generation" of a failure is thus g+1 with the
// survivors alone; the newcomers come in g+2 (docs/python.md, "Elastic
// scripts"; tests/bench/python_bench.py times both).
// A growth of such a program (a replacement owed, or free slots after the
// scale-up interval) is staged too, so that the survivors are told to
// re-form only once the newcomers' programs are up and waiting:
//  3. the Scheduler's GrowLocked plans the growth's generation and launches its newcomers
//     at once, for that generation, before it forms (StagedGrowth);
//     the survivors go on training;
//  4. the newcomer's chorus-rank joins with starts_program_first and is
//     answered at once (StagedJoinLocked: JoinResponse.staged, the planned
//     rank), so it starts the program without waiting for anyone;
//  5. the program (the SDK's Session::FromEnvironment) joins the
//     generation itself; that Join, answered UNAVAILABLE (join again) until
//     the generation forms, marks the newcomer up. Once all are up, the
//     change is requested (RequestReformLocked): the survivors re-form at
//     their next step boundary, and ReformLocked takes the staged newcomers
//     (their slots come first among the free ones) without launching them
//     again; their next Join completes the generation.
// Newcomers not up within elastic.wait_seconds, or that a failure's
// generation does not take (with the survivors alone), are stopped and the
// growth is tried again; one that exits first frees its slot. A coordinator
// restart forgets the debt and the staged growth: the job then grows after
// the scale-up interval, and a staged newcomer's Join finds no rank.

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
