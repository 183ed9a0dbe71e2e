// Hang restart: what an elastic job's hang_detection.action RESTART does
// with its diagnoses (Note [Hang restart]), which survivors of a forming
// generation are evicted for their silence (Note [A survivor that does not
// join]), and when a change of generation is overdue. Pure functions of a
// running job and the time: the Scheduler applies what they return
// (Evict's actions, ReformLocked, EndLocked).
//
// Thread-safety: plain functions; the Scheduler holds its lock around the
// RunningJob they read.
//
// Example:
//   HangRestart restart = PlanHangRestart(run, diagnoses, clock.Now());
//   if (restart.kind == HangRestart::kEvict) {
//     for (const Eviction& e : restart.evictions) Evict(e.rank, e.why, e.by);
//   }
#ifndef CHORUS_COORDINATOR_SCHEDULING_HANG_RESTART_H_
#define CHORUS_COORDINATOR_SCHEDULING_HANG_RESTART_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/scheduling/running_job.h"

namespace chorus {

// Note [Hang restart]
// hang_detection.action RESTART of an elastic job acts on a diagnosis by
// what it says about who is to blame.
//  - DEAD and NEVER_JOINED name a culprit: it is evicted (its agent stops
//    it), and its exit starts generation g+1 with a newcomer in its place.
//  - MISMATCH names two ranks that issued different collectives at one
//    sequence number, and neither is reliably the wrong one;
//    STUCK_IN_COLLECTIVE blames no rank (every rank issued the collective:
//    the transport is suspect). There is no rank to replace, so the job
//    starts g+1 with the same members (ReformKind::kHangRestart):
//    the ranks hear of it on their next heartbeat (RE_RENDEZVOUS), abort
//    their communicator, which fails the collective they are blocked in, and
//    join g+1 in the same processes with their last complete step; g+1
//    builds a new transport (docs/elastic.md).
// When both kinds hold at once, eviction wins. A rank that is dead or
// absent from the collective would keep g+1 from forming if it stayed a
// member (it never joins, and the job fails after elastic.wait_seconds);
// the others being stuck is most likely its doing; and its eviction
// re-forms every survivor's transport anyway, for one restart instead of
// two.
// A re-formation with the same members needs every member to hear of it
// and join, so the restart waits (nothing is done, and the job is not
// failed) while
//  - generation g has not formed, or the job is being taken back after a
//    coordinator restart: g+1 is already forming, or members are missing;
//  - an evicted rank's exit has not been reported: that exit starts g+1;
//  - a rank has sent no heartbeat for kRankSilentAfter: a rank stopped
//    inside a collective looks STUCK_IN_COLLECTIVE to the detector
//    (stall_after_seconds, default 3) before it is DEAD (dead_after_seconds,
//    default 5); once DEAD it is evicted.
// A mismatch that the program's own code makes (two models called in a
// different order) comes back in every generation: elastic.max_restarts
// bounds the attempts, and then the job fails with the history.

// Note [A survivor that does not join]
// A generation forms once every member has joined. A survivor of the
// generation before joins within a second of hearing of the change (its
// heartbeat's RE_RENDEZVOUS or its own failed collective); one that is
// frozen (SIGSTOP, a stalled VM) never does, and the generation used to
// wait for it until elastic.wait_seconds and then fail the job, though a
// free slot could have taken its place. So, as a frozen rank of a formed
// generation is DEAD after hang_detection.dead_after_seconds without a
// heartbeat, a survivor that has not joined the forming generation and
// whose process has sent no heartbeat (of either generation: a survivor
// still heartbeats in the old one until it joins) for as long is evicted:
// its agent stops it, and its exit re-forms the job without it, with a
// newcomer on a free slot, as any lost rank. Newcomers are not judged so:
// starting a process takes seconds, and they have sent nothing yet; they
// have elastic.wait_seconds.

// A rank the coordinator has its agent stop: `by` whom and `why` (its
// exit's reason quotes both: RankState::evicted).
struct Eviction {
  int rank = 0;
  std::string why;
  std::string by;
};

// What hang_detection.action RESTART does with `diagnoses` of `run` now.
struct HangRestart {
  enum Kind {
    kNone,     // no diagnosis it acts on: the job's hang policy decides
    kEvict,    // DEAD or NEVER_JOINED: stop `evictions` (once each)
    kWait,     // MISMATCH or STUCK_IN_COLLECTIVE, but not every member could re-form now
    kRestart,  // MISMATCH or STUCK_IN_COLLECTIVE: the next generation with the same members
  };
  Kind kind = kNone;
  // kEvict: the ranks named, less those evicted already or exited.
  std::vector<Eviction> evictions;
  std::string cause;  // kRestart: the change's cause
};
HangRestart PlanHangRestart(const RunningJob& run, const std::vector<v1::Diagnosis>& diagnoses,
                            absl::Time now);

// Note [A survivor that does not join]: the ranks of `run`'s forming
// generation to evict now (none unless it forms).
std::vector<Eviction> SilentJoiners(const RunningJob& run, absl::Time now);

// The reason an elastic job whose re-formed generation has not formed by
// `now` (elastic.wait_seconds), or whose ranks a restart-all stopped have not
// all exited by then, fails with; nullopt while it may still form.
std::optional<std::string> ReformOverdue(const RunningJob& run, absl::Time now);

// Has `e.rank`'s agent stop it (SIGTERM, SIGKILL after 1 s: a stopped
// process ignores SIGTERM) and marks it evicted, with an event. Once: no
// actions for a rank evicted already, exited, or whose agent is gone.
JobActions Evict(RunningJob& run, const std::string& job_id, const Eviction& e,
                 const AgentRegistry& agents);

// What a Tick makes of `run`'s deadlines at `now`, in this order: a change
// of generation overdue fails the job (ReformOverdue; nothing else is
// checked then); survivors silent while the generation forms are evicted
// (SilentJoiners); after a coordinator restart or a lost agent, all ranks
// back is an event, and ranks missing past the grace fail the job, or
// re-form an elastic one without them (Note [An elastic job's lost agent]
// in agent_departure.h: GiveUpLostAgents).
struct DeadlineCheck {
  std::optional<std::string> fail;
  std::vector<Eviction> evictions;
  std::optional<std::string> event;
  bool give_up_lost_agents = false;
};
DeadlineCheck CheckDeadlines(RunningJob& run, absl::Time now);

// What a Tick makes of `run`'s current `diagnoses`: nothing while it waits
// below resources.min_ranks or a restart-all stops its ranks; for an
// elastic job with hang_detection.action RESTART, Note [Hang restart]
// (evictions first, then a restart with the same members: `restart` is its
// cause; a diagnosis it waits on does nothing); else the job's hang policy
// (HangFailure: `fail` is the reason).
struct DiagnosisCheck {
  std::vector<Eviction> evictions;
  std::optional<std::string> restart;
  std::optional<std::string> fail;
};
DiagnosisCheck CheckDiagnoses(const RunningJob& run, const std::vector<v1::Diagnosis>& diagnoses,
                              absl::Time now);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_HANG_RESTART_H_
