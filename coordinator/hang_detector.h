// Hang and deadlock diagnosis from the ranks' latest heartbeats (docs/hang-detection.md).
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
//   STRAGGLER            one rank computes much longer per step than the others;
//                        the message says how long the others waited for it
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

// Ranks send a heartbeat every second; one older than this means the rank
// itself is silent (stopped, wedged, or its host gone), not just busy.
inline constexpr absl::Duration kRankSilentAfter = absl::Milliseconds(2500);

struct RankView {
  int rank = 0;
  bool has_heartbeat = false;
  absl::Time heartbeat_at = absl::InfinitePast();
  v1::RankHeartbeat heartbeat;
  // When set, the heartbeat to read instead of `heartbeat`: the
  // coordinator's own record, not copied (every Tick and status request
  // views every rank; at 16,384 ranks the copies were most of their cost).
  // Must outlive the view.
  const v1::RankHeartbeat* recorded = nullptr;
  bool exited = false;

  const v1::RankHeartbeat& hb() const { return recorded != nullptr ? *recorded : heartbeat; }
};

// Note [Who the others waited for]: in synchronous training every rank
// leaves a collective at about the same time, so step times even out and a
// rank that is slow at computing is invisible in them. What differs is the
// wait: each rank measures, per step, how long it waited inside gradient
// synchronization (from its arrival until the collective ended). A rank that
// arrives late waits little; those that arrived before it wait for it. So
// rank r's "others waited for me" time per step is the sum over the other
// ranks o of max(0, wait_o - wait_r): with one slow rank it is the sum of
// the others' extra wait, and for the ranks that waited it is about 0.
// Ranks on different hosts are compared by durations each measured on its
// own clock, so clock offsets between hosts do not matter.
//
// `wait_seconds[i]` is rank i's wait per step, negative when unknown (no
// heartbeat with timings yet, or exited); such ranks get 0 and count for no
// one.
std::vector<double> WaitCausedBy(const std::vector<double>& wait_seconds);

// Note [Diagnoses during shutdown]
// Once a rank has said it finished training (a heartbeat in phase FINISHED,
// sent as its heartbeat stream ends, or its final report), the job is
// shutting down: the other ranks are past their last step too (in
// synchronous training nobody finishes before every rank has left the last
// collective), in their final evaluation, checkpoint and report, and then
// silent. What the detector reads in those seconds is void: the finished
// ranks are not watched (RunningJob::HangViews), and of the diagnoses of
// the others only DEAD is kept, for a rank that stopped heartbeating
// without saying it finished. Before this a job that trained every step
// and committed its final checkpoint was restarted as STUCK_IN_COLLECTIVE
// while its ranks exited 0, and then FAILED because its next generation
// never formed. The coordinator's side is in RunningJob: a finished rank's
// exit with code 0 counts as a success even when a restart was ordered as
// it finished, and so does a final report of the generation before.
void VoidDuringShutdown(std::vector<v1::Diagnosis>& diagnoses);

// Every diagnosis that holds now, most severe first.
std::vector<v1::Diagnosis> DiagnoseHangs(const v1::HangDetectionSpec& spec,
                                         const std::vector<RankView>& ranks, absl::Time now);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_HANG_DETECTOR_H_
