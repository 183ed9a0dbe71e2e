// The Gloo backend of Communicator: CPU tensors over TCP, a full mesh of
// connections bootstrapped through a Store. The default backend.
//
// Thread-safety: as Communicator. Each communicator owns one thread that runs
// its ops in order; sub-groups share the parent's TCP device.
//
// Example:
//   GlooOptions options;
//   options.rank = rank;
//   options.size = 4;
//   PrefixStore store(coordinator_store, "job7/gen3");
//   ASSIGN_OR_RETURN(std::shared_ptr<Communicator> comm,
//                    CreateGlooCommunicator(options, store));
#ifndef CHORUS_WORKER_COMM_GLOO_COMMUNICATOR_H_
#define CHORUS_WORKER_COMM_GLOO_COMMUNICATOR_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/communicator.h"
#include "common/clock.h"
#include "worker/comm/flight_recorder.h"
#include "worker/comm/store.h"

namespace chorus {

struct GlooOptions {
  int rank = 0;
  int size = 1;
  // Address the TCP transport binds and advertises to peers.
  std::string hostname = "127.0.0.1";
  // How long creation waits for every peer to publish its address and connect.
  absl::Duration connect_timeout = absl::Seconds(60);
  // An op running longer than this fails with DEADLINE_EXCEEDED and breaks
  // the communicator (Note [Communicator failures]).
  absl::Duration op_timeout = absl::Minutes(5);
  // All-reduce messages are cut into segments of this size so that reducing
  // one overlaps receiving the next.
  size_t segment_bytes = size_t{1} << 20;
  // When every rank runs on this host (SharedMemoryHostKey), all-reduces may
  // go through shared memory instead of TCP (Note [Shared-memory
  // all-reduce]); other ops always use TCP. The environment variable
  // CHORUS_GLOO_SHM=0 turns it off as well.
  bool shared_memory = true;
  // With shared memory set up: time both paths on the first all-reduces of
  // each message size and keep the faster per size (TransportTuner), or, if
  // false, always use shared memory. CHORUS_GLOO_SHM=1 in the environment
  // sets it false.
  bool measure_transport = true;
  // Called on the op thread with each size class's decision, which is also
  // logged; may be empty.
  std::function<void(const std::string&)> on_transport_decision;
  // Shared-memory all-reduces move this many bytes per step. Small segments
  // keep a step's data (the rank's copy, its peers' reads) in the caches:
  // at 25 MB, 1 MB segments took 5.4-6.1 ms against 11-12 ms with 16 MB
  // (bench/allreduce_bench --shm_segment_kb).
  size_t shm_segment_bytes = size_t{1} << 20;
  size_t flight_recorder_capacity = FlightRecorder::kDefaultCapacity;
  // Not owned; null = real time. Used by the flight recorder.
  Clock* clock = nullptr;
};

// Builds a communicator of options.size ranks; blocks until all of them have
// connected or connect_timeout passes (DEADLINE_EXCEEDED naming the ranks that
// never published their address). `store` must be namespaced to this group of
// ranks and outlive the communicator (NewGroup uses it).
absl::StatusOr<std::shared_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options,
                                                                     Store& store);

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_GLOO_COMMUNICATOR_H_
