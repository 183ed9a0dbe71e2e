// RunningJobTestPeer: what tests of the units around RunningJob use to put
// a rank in a state that no transition reaches in one step: a rank last
// heard a minute ago, one that exited with a given code, one awaited after
// a restart with a given host. Production code changes ranks only through
// RunningJob's transitions; this header is testonly.
//
// Example:
//   RankOf(run, 1).heard_at = kNow - absl::Seconds(60);
#ifndef CHORUS_COORDINATOR_SCHEDULING_RUNNING_JOB_TEST_PEER_H_
#define CHORUS_COORDINATOR_SCHEDULING_RUNNING_JOB_TEST_PEER_H_

#include <vector>

#include "coordinator/scheduling/running_job.h"

namespace chorus {

class RunningJobTestPeer {
 public:
  static std::vector<RankState>& Ranks(RunningJob& run) { return run.ranks_; }
};

// `run`'s ranks, and one of them, to set up a test's state.
inline std::vector<RankState>& RanksOf(RunningJob& run) { return RunningJobTestPeer::Ranks(run); }
inline RankState& RankOf(RunningJob& run, int rank) { return RanksOf(run).at(rank); }

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_RUNNING_JOB_TEST_PEER_H_
