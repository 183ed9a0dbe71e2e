// Heartbeat composition: how a rank's training progress and its
// communicator's flight recorder become the v1::RankHeartbeat the
// coordinator's hang detector reads. chorus-rank composes one every second
// for its heartbeat stream; an SDK program (sdk/chorus/progress.h) composes
// the same record for its supervisor over the progress channel, so the
// coordinator sees both alike.
//
// Thread-safety: plain functions; `progress` is read through its atomics
// and the flight recorder takes its own lock, so they may be called while
// training runs on another thread.
//
// Example:
//   v1::RankHeartbeat hb = ProgressHeartbeat(progress, &comm->flight_recorder(), absl::Now());
//   hb.set_rank(rank);
#ifndef CHORUS_WORKER_RUNTIME_HEARTBEAT_COMPOSE_H_
#define CHORUS_WORKER_RUNTIME_HEARTBEAT_COMPOSE_H_

#include <string>

#include "absl/time/time.h"
#include "chorus/communicator.h"
#include "chorus/v1/coordinator.pb.h"
#include "worker/comm/flight_recorder.h"
#include "worker/runtime/training_progress.h"

namespace chorus {

// How many completed collectives a summary carries besides those in flight.
inline constexpr int kHeartbeatRecentCollectives = 4;

// One flight-recorder entry as the coordinator's proto holds it.
v1::CollectiveRecord ToProto(const FlightRecord& record);

// The recorder's sequence numbers, the collectives in flight and the last
// `recent` completed ones.
v1::FlightRecorderSummary SummarizeFlightRecorder(const FlightRecorder& recorder,
                                                  int recent = kHeartbeatRecentCollectives);

// What the rank knows about itself at `now`: step, epoch, phase and how long
// it has been in it, timings, loss, samples per second and (if `recorder`
// is not null) the flight recorder summary. Identity fields (job, generation,
// rank) and time_us are left unset.
v1::RankHeartbeat ProgressHeartbeat(const TrainingProgress& progress,
                                    const FlightRecorder* recorder, absl::Time now);

// ProgressHeartbeat plus who sends it (`joined`'s generation and rank,
// `job_id`) and time_us: chorus-rank's heartbeat.
v1::RankHeartbeat ComposeHeartbeat(const v1::JoinResponse& joined, const std::string& job_id,
                                   const Communicator& comm, const TrainingProgress& progress,
                                   absl::Time now);

}  // namespace chorus

#endif  // CHORUS_WORKER_RUNTIME_HEARTBEAT_COMPOSE_H_
