// Job recovery: taking back, after a coordinator restart, the jobs that were
// RUNNING when it stopped.
//
// Their ranks kept running under their agents. A job comes back from its
// recorded placements with every rank LOST and unbound (RecoveredJob); as
// each agent reconnects, the ranks it still runs are bound again by host,
// agent pid and slot (RebindRanks), and ranks no job waits for are to be
// stopped. CheckRecovery tells when every rank is back, or that the wait is
// over with ranks missing (the job then fails).
//
// Thread-safety: none; the Scheduler holds its lock around every call.
//
// Example:
//   RunningJob run = RecoveredJob(job, clock.Now() + grace);
//   std::map<std::string, std::vector<int>> orphans = RebindRanks(running, id, hello);
//   RecoveryProgress progress = CheckRecovery(run, clock.Now());
#ifndef CHORUS_COORDINATOR_JOB_RECOVERY_H_
#define CHORUS_COORDINATOR_JOB_RECOVERY_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/running_job.h"

namespace chorus {

// `job` (RUNNING, with placements) rebuilt to wait for its ranks until
// `until`; every rank counts as joined (it joined before the restart).
// REQUIRES: job.placements() is not empty.
RunningJob RecoveredJob(const v1::Job& job, absl::Time until);

// Binds the ranks that agent `agent_id` (`hello`) reports running to the
// jobs in `running` waiting for them (they become TRAINING). Returns, by job,
// the reported slots no job waits for; `bound` receives (job, slot) of the
// ranks bound.
std::map<std::string, std::vector<int>> RebindRanks(
    std::map<std::string, RunningJob>& running, const std::string& agent_id,
    const v1::AgentHello& hello, std::vector<std::pair<std::string, int>>* bound);

struct RecoveryProgress {
  bool all_back = false;  // every rank is back: the wait is over
  std::string failure;    // non-empty: the wait is over with ranks missing
};
// For a job waiting for its ranks; a job not waiting reports neither.
RecoveryProgress CheckRecovery(RunningJob& run, absl::Time now);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_JOB_RECOVERY_H_
