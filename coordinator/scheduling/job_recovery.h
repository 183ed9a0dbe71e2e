// Job recovery: taking back, after a coordinator restart, the jobs that were
// RUNNING when it stopped, and the ranks of a job that is not elastic whose
// agent's stream ended (Note [Agent reconnect grace] in running_job.h).
//
// Their ranks kept running under their agents. A job comes back from its
// recorded placements with every rank LOST and unbound (RecoveredJob); as
// each agent reconnects, the ranks it still runs are bound again by host,
// agent pid and slot (RebindRanks), and ranks no job waits for are to be
// stopped. CheckRecovery tells when every rank is back, or that the wait is
// over with ranks missing (the job then fails).
//
// An elastic job may be in the middle of a change of generation when the
// coordinator stops; ElasticRecordOf is what the Scheduler saves of it, and
// RecoveredJob takes it back from that (Note [Elastic restart]).
//
// Thread-safety: none; the Scheduler holds its lock around every call.
//
// Example:
//   RunningJob run = RecoveredJob(job, clock.Now() + grace, *jobs.LoadElasticRecord(id));
//   std::map<std::string, std::vector<int>> orphans = RebindRanks(running, id, hello);
//   RecoveryProgress progress = CheckRecovery(run, clock.Now());
#ifndef CHORUS_COORDINATOR_SCHEDULING_JOB_RECOVERY_H_
#define CHORUS_COORDINATOR_SCHEDULING_JOB_RECOVERY_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/scheduling/running_job.h"
#include "coordinator/state/elastic_record.pb.h"

namespace chorus {

// Note [Elastic restart]
// An elastic job is always in one of five states, and a coordinator that
// stops and starts again on the same state directory must take each back so
// that the job ends as it would have without the restart:
//  - steady: generation g formed. Its ranks come back with their agents; a
//    survivor of an earlier generation reports the generation it was
//    launched in (< g), which still binds it (RebindRanks).
//  - planned: a drain or growth waits for the step boundary; the ranks were
//    told to re-form there and their Join of g+1 starts it. The cause is
//    saved so that Join still finds it.
//  - waiting: below resources.min_ranks with no free slot. The deadline
//    (elastic.wait_seconds from the loss, not from the restart), the cause
//    and the ranks lost before the restart are saved: those ranks are not
//    waited for (they are not "did not come back"), and the job forms when
//    slots come, or fails at the original deadline with the waiting reason.
//  - forming: g was started and has not formed. Its rendezvous starts again
//    empty (no rank was answered: the answers go out together) and its
//    deadline is the original one; the ranks join g again.
//  - restarting (a program job that restarts all, Note [Restart-all] in
//    running_job.h): g's ranks were told to stop. The change, its deadline
//    and the ranks told to stop are saved; one that comes back still
//    running is told again, and the exit of the last starts g+1.
// Job.generation, world size, placements and restarts are in the job record
// (JobManager::MarkReformed, SavePlacements); the rest is a
// coordinator::ElasticRecord the Scheduler saves whenever it changes. While
// ranks are still awaited, nothing re-forms (a rank not yet back would count
// as lost) unless the wait for slots has run out.

// What the state database keeps of an elastic job (`lost`: index = rank, the
// ranks of the current generation that are gone; those that exited 0 are
// recorded as finished).
coordinator::ElasticRecord ElasticRecordOf(const RunningJob& run, const std::vector<bool>& lost);
// The same with the ranks that exited or whose agent is gone lost (ranks on
// a draining agent still run, and unbound ones may come back).
coordinator::ElasticRecord ElasticRecordOf(const RunningJob& run, const AgentRegistry& agents);

// `job` (RUNNING, with placements) rebuilt to wait for its ranks until
// `until`; every rank counts as joined (it joined before the restart). An
// elastic job's `record` of the job's generation restores its change of
// generation (Note [Elastic restart]); any other record is ignored.
// REQUIRES: job.placements() is not empty.
RunningJob RecoveredJob(const v1::Job& job, absl::Time until,
                        const coordinator::ElasticRecord& record = {});

// Binds the ranks that agent `agent_id` (`hello`) reports running to the
// jobs in `running` waiting for them (they become TRAINING, or JOINING in a
// generation that has not formed); a rank reports the generation it was
// launched in, the job's or an earlier one. Returns, by job,
// the reported slots no job waits for; `bound` receives (job, slot) of the
// ranks bound.
std::map<std::string, std::vector<int>> RebindRanks(
    std::map<std::string, RunningJob>& running, const std::string& agent_id,
    const v1::AgentHello& hello, std::vector<std::pair<std::string, int>>* bound);

// Note [Exits told again]
// An agent's report of a rank's exit is written to its stream, and written is
// not read: a leader killed (or a machine lost) before reading it takes the
// report with it. The coordinator that takes over recovers the job from the
// state store and waits for its ranks; one that exited never comes back, so
// without the report the job would fail ("did not come back") however its ranks
// ended, and a rank that finished before the takeover is not in the store for a
// job that is not elastic. So an agent's hello tells again the exits it wrote
// lately (AgentHello .exited), and the coordinator takes each one that a rank
// it still waits for, on that agent's host and process, slot and generation,
// has not reported otherwise (AwaitsToldExit), as if it had just been sent. A
// coordinator that read them the first time matches none: the ranks are bound
// to the agent (a reconnection to the same leader) or no longer waited for.
// Exits the agent could not write at all are not in the hello; they follow the
// welcome (Note [Reports kept while disconnected] in worker/agent/agent.cc).

// The agent `agent_id` (`hello`) connected: RebindRanks, then each rank
// bound again takes its slot in `agents`, and its heartbeat clock restarts
// at `now` (Note [Agent reconnect grace] in running_job.h: the time away
// does not make it DEAD). Returns, by job, the messages to send: a stop for
// the reported slots no job waits for, and again for a rank a restart-all
// was stopping when the coordinator restarted (its agent may not have heard
// of it: Note [Restart-all] in running_job.h).
std::map<std::string, JobActions> BindAgentRanks(std::map<std::string, RunningJob>& running,
                                                 AgentRegistry& agents, const std::string& agent_id,
                                                 const v1::AgentHello& hello, absl::Time now);

// Whether `exited`, an exit agent `hello` tells again (Note [Exits told
// again] above), is that of a rank of `run` still waited for: not
// bound to an agent yet, not exited, last on that agent's host, process and
// slot, in the job's current generation.
bool AwaitsToldExit(const RunningJob& run, const v1::AgentHello& hello,
                    const v1::RankExited& exited);

struct RecoveryProgress {
  bool all_back = false;  // every rank is back: the wait is over
  std::string back;       // with all_back: the job event that says so
  std::string failure;    // non-empty: the wait is over with ranks missing
};
// For a job waiting for its ranks; a job not waiting reports neither. The
// wait is over with ranks missing once `now` reaches run.recovering_until();
// the failure names its cause (run.wait_cause()): the coordinator's restart,
// or the lost agents whose ranks are missing (Note [Agent reconnect grace]
// in running_job.h).
RecoveryProgress CheckRecovery(RunningJob& run, absl::Time now);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_JOB_RECOVERY_H_
