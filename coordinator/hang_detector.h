// Hang and deadlock diagnosis from the ranks' latest heartbeats (DESIGN.md §6).
//
// A pure function of what the ranks last said and the time now, so it is
// tested without processes or a network. Collective sequence numbers are per
// communicator; every rank of a job uses one world communicator, so the same
// seq on two ranks is the same collective.
//
//   DEAD                 no heartbeat for hang_detection.dead_after_seconds
//   MISMATCH             two ranks issued different collectives at the same seq
//   NEVER_JOINED         ranks wait inside #s; rank r never issued #s
//   STUCK_IN_COLLECTIVE  every rank is inside #s far longer than usual
//   STRAGGLER            one rank computes much longer per step than the others
//
// "Far longer than usual" is max(stall_after_seconds, 10 x the recent median
// duration of collectives with the same tag). A rank that declared a pause
// (SETUP, EVAL, CHECKPOINT) is not called a culprit until the pause exceeds
// phase_limit_seconds.
#ifndef CHORUS_COORDINATOR_HANG_DETECTOR_H_
#define CHORUS_COORDINATOR_HANG_DETECTOR_H_

#include <vector>

#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"

namespace chorus {

struct RankView {
  int rank = 0;
  bool has_heartbeat = false;
  absl::Time heartbeat_at = absl::InfinitePast();
  v1::RankHeartbeat heartbeat;
  bool exited = false;
};

// Every diagnosis that holds now, most severe first.
std::vector<v1::Diagnosis> DiagnoseHangs(const v1::HangDetectionSpec& spec,
                                         const std::vector<RankView>& ranks, absl::Time now);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_HANG_DETECTOR_H_
