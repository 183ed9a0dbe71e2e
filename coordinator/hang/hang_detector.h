// Hang and deadlock diagnosis from the ranks' latest heartbeats (docs/hang-detection.md).
//
// A pure function of what the ranks last said and the time now, so it is
// tested without processes or a network. Every rank of a job uses one world
// communicator, so the k-th collective of two ranks is the same collective,
// and the k-th send from a to b meets the k-th receive on b from a (Note
// [Pairing ranks' ops]).
//
//   DEAD                 no heartbeat for hang_detection.dead_after_seconds
//   MISMATCH             two ranks issued different collectives as their k-th
//   NEVER_JOINED         ranks wait inside collective #k; rank r never issued
//                        it; or rank a waits in a send (receive) that rank r
//                        has not posted the receive (send) for
//   STUCK_IN_COLLECTIVE  every rank is inside #k far longer than usual
//   STRAGGLER            one rank computes much longer per step than the others;
//                        the message says how long the others waited for it
//
// "Far longer than usual" is max(stall_after_seconds, 10 x the recent median
// duration of collectives with the same tag). A rank that declared a pause
// (SETUP, EVAL, CHECKPOINT) is not called a culprit until the pause exceeds
// phase_limit_seconds.
#ifndef CHORUS_COORDINATOR_HANG_HANG_DETECTOR_H_
#define CHORUS_COORDINATOR_HANG_HANG_DETECTOR_H_

#include <vector>

#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"

namespace chorus {

// Ranks send a heartbeat every second; one older than this means the rank
// itself is silent (stopped, wedged, or its host gone), not just busy.
inline constexpr absl::Duration kRankSilentAfter = absl::Milliseconds(2500);

// Note [A silent agent's ranks]
// Most ranks' heartbeats reach the coordinator through their node agent's
// stream (Note [Heartbeats through the agent] in worker/agent/agent.cc),
// which carries a message every second: the heartbeats its ranks sent, or a
// ping when none did. A rank that falls silent while its agent goes on
// talking is stopped or wedged, and is DEAD after dead_after_seconds. When
// the agent falls silent too, the silence says nothing about the rank: on a
// slow, lossy link the agent's connection stalls for seconds while TCP
// resends, its keepalive gives it up and it connects again, and its ranks
// train on meanwhile (their collectives go between the nodes, not through
// the coordinator). Measured on a link with 300 ms delay and 5 % loss, such
// a rank was DEAD and evicted twice in a minute. So a rank's silence counts
// only up to what its agent's last message vouches for
// (RankView.relay_heard_at + kAgentMessageInterval), and an agent's own
// silence postpones its ranks' DEAD by at most kAgentSilenceForgiven: a
// node that is gone for good has its ranks DEAD that much later (unless
// its stream ends first, which re-forms or waits for the agent: Note
// [Agent reconnect grace] in running_job.h).
inline constexpr absl::Duration kAgentMessageInterval = absl::Milliseconds(1500);
inline constexpr absl::Duration kAgentSilenceForgiven = absl::Seconds(10);

// Note [A starved node]
// On a machine whose CPUs are oversubscribed (other jobs, a build, a noisy
// neighbour) every collective takes longer, and one that is rare in a job
// (the final evaluation's all-reduce, whose usual duration nobody has
// measured yet) can outlast stall_after_seconds on every rank at once:
// STUCK_IN_COLLECTIVE, and with action RESTART a re-formation that the same
// starvation makes slow too. A collective that is truly stuck leaves its
// ranks idle, waiting on the network; a starved one leaves them runnable,
// waiting for a CPU. So each node agent sends, with every message, the
// share of the last ~10 s in which its node's runnable tasks waited for a
// CPU (common/cpu_pressure.h: PSI's cpu "some", else the load average),
// and when every rank inside the collective runs on a node at or above
// kStarvedPressure the diagnosis is NODE_SLOW, a warning on which no action
// is taken. Starvation only stretches time: past kStarvedPatience times the
// threshold the same wait is STUCK_IN_COLLECTIVE again, so a hang on a busy
// machine is still found, later. A rank that stops heartbeating is DEAD
// whatever its node's load: a starved heartbeat thread still gets a CPU
// within a second, and dead_after_seconds is not stretched.
inline constexpr double kStarvedPressure = 0.5;
inline constexpr int kStarvedPatience = 3;

// Whether a diagnosis is a warning only (STRAGGLER, NODE_SLOW): reported,
// never acted on.
bool IsWarningOnly(v1::Diagnosis::Kind kind);

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
  // When the rank's heartbeats come through its agent: the time of the
  // agent's last message (Note [A silent agent's ranks]); InfiniteFuture
  // when the rank sends them itself.
  absl::Time relay_heard_at = absl::InfiniteFuture();
  // Its node's CPU pressure as its agent last said (Note [A starved
  // node]); 0 when unknown.
  double node_cpu_pressure = 0;

  const v1::RankHeartbeat& hb() const { return recorded != nullptr ? *recorded : heartbeat; }
};

// Note [Who the others waited for]
// In synchronous training every rank leaves a collective at about the same
// time, so step times even out and a rank that is slow at computing is
// invisible in them. What differs is the wait: each rank measures, per step,
// how long it waited inside gradient synchronization (from its arrival until
// the collective ended). A rank that arrives late waits little; those that
// arrived before it wait for it. So rank r's "others waited for me" time per
// step is the sum over the other ranks o of max(0, wait_o - wait_r): with one
// slow rank it is the sum of the others' extra wait, and for the ranks that
// waited it is about 0. Ranks on different hosts are compared by durations each
// measured on its own clock, so clock offsets between hosts do not matter.
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

// Note [Pairing ranks' ops]
// A flight recorder's seq counts every op a rank issues. While ranks issue
// the same ops that is enough: the same seq is the same collective
// everywhere. Sends and receives break it: in a pipeline the first stage
// sends what the second receives, the middle stages do both, and from the
// first message on their seqs differ. Read by seq, the first stage's
// "send/to1" and the second's "recv/from0" at #1 were a MISMATCH, and so was
// every collective after them. So each record says where it stands among
// its kind (CollectiveRecord.collective_index, send_index/send_to,
// recv_index/recv_from): collectives are compared by index, and a rank
// waiting in a send to b (or a receive from b) long after it began is
// paired with b's receives from it (sends to it). If b has not posted the
// matching one, b is NEVER_JOINED, named with what it is doing, as for a
// collective; sends and receives are never a MISMATCH, and a rank waiting
// in one is not blocked in a collective (they wait beside later ops: Note
// [Point-to-point progress] in worker/comm/p2p_lanes.h). Records from ranks
// that predate the indices are compared by seq as before.

// Every diagnosis that holds now, most severe first.
std::vector<v1::Diagnosis> DiagnoseHangs(const v1::HangDetectionSpec& spec,
                                         const std::vector<RankView>& ranks, absl::Time now);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_HANG_HANG_DETECTOR_H_
