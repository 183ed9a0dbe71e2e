// FlightRecorder: a bounded ring of the collectives one communicator issued.
//
// Every op gets a sequence number (1, 2, ...) and a fingerprint. The recorder
// keeps, for the newest `capacity` ops, when each was enqueued, started and
// finished and how it ended. Heartbeats carry Snapshot() to the coordinator,
// whose hang detector compares ranks: the same seq must carry the same
// fingerprint on every rank, and a rank whose last enqueued seq is behind the
// others' is the one that never joined. See docs/hang-detection.md.
//
// Thread-safety: all methods may be called concurrently; Snapshot() copies
// only the in-flight entries and the `recent` newest finished ones.
//
// Example:
//   FlightRecorder recorder;
//   int64_t seq = recorder.Enqueued({"allreduce", "float32", 1024, {}, "ddp:model/bucket0"});
//   recorder.Started(seq);
//   recorder.Finished(seq, OpState::kCompleted, "");
//   FlightRecorder::Snapshot s = recorder.TakeSnapshot(/*recent=*/4);
#ifndef CHORUS_WORKER_COMM_FLIGHT_RECORDER_H_
#define CHORUS_WORKER_COMM_FLIGHT_RECORDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace chorus {

// What identifies one collective. Two ranks at the same seq must agree.
struct Fingerprint {
  std::string op;          // allreduce/sum, broadcast, allgather, barrier, send, recv, sendrecv
  std::string dtype;       // float32, float64, float16, bfloat16, int32, int64, or "" (barrier)
  int64_t count = 0;       // elements
  std::vector<int> group;  // global ranks of the group; empty = the whole world
  std::string tag;         // caller tag, e.g. "ddp:model/bucket3"

  int64_t bytes() const;
  std::string ToString() const;  // "allreduce/sum float32[1024] ddp:model/bucket3"
  bool operator==(const Fingerprint& other) const;
  bool operator!=(const Fingerprint& other) const { return !(*this == other); }
};

// kRunning only for a device backend (Note [Device op states]).
enum class OpState { kEnqueued, kStarted, kRunning, kCompleted, kFailed, kTimedOut };
const char* OpStateName(OpState state);

// Where an op stands among its kind, for pairing one rank's records with
// another's (Note [Pairing ranks' ops] in coordinator/hang/hang_detector.h):
// seqs count every op, so they differ between ranks once some send or
// receive more than others. Indices are 1-based; 0 means none.
struct OpIndex {
  int64_t collective = 0;  // among the communicator's collectives
  int send_to = -1;        // a send (or a SendRecv's send part): the peer
  int64_t send = 0;        // and its index among this rank's sends to it
  int recv_from = -1;      // a receive: the peer
  int64_t recv = 0;        // and its index among this rank's receives from it
};

struct FlightRecord {
  int64_t seq = 0;
  Fingerprint fingerprint;
  OpIndex index;
  OpState state = OpState::kEnqueued;
  absl::Time enqueued = absl::InfinitePast();
  absl::Time started = absl::InfinitePast();   // InfinitePast until started
  absl::Time running = absl::InfinitePast();   // a device op: when the device reached it
  absl::Time finished = absl::InfinitePast();  // InfinitePast until finished
  std::string error;                           // set when kFailed / kTimedOut
};

class FlightRecorder {
 public:
  static constexpr size_t kDefaultCapacity = 2048;

  // `clock` (not owned; null = real time) must outlive the recorder.
  // `device`: where a device backend runs its ops ("cuda:0"); empty for a
  // host backend.
  explicit FlightRecorder(size_t capacity = kDefaultCapacity, Clock* clock = nullptr,
                          std::string device = "");
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Records a new op and returns its sequence number.
  int64_t Enqueued(Fingerprint fingerprint, OpIndex index = OpIndex());
  // For a host backend the op runs from here; a device backend's op is
  // queued on the device's stream behind the work queued there before it.
  void Started(int64_t seq);
  // A device backend's started op that the device has reached: its kernels
  // run (for a collective: they wait for the peers). No-op unless started.
  void Running(int64_t seq);
  // REQUIRES: state is kCompleted, kFailed or kTimedOut.
  void Finished(int64_t seq, OpState state, std::string error);

  struct Snapshot {
    int64_t last_enqueued_seq = 0;
    int64_t last_started_seq = 0;
    // Newest seq that finished (any way). Collectives finish in seq order;
    // a point-to-point op may finish after later ops (Note
    // [Point-to-point progress] in p2p_lanes.h).
    int64_t last_finished_seq = 0;
    // Newest seq that completed successfully.
    int64_t last_completed_seq = 0;
    // How many collectives were enqueued (the newest one's index).
    int64_t collectives_enqueued = 0;
    // Ops not finished yet, oldest first, then up to `recent` finished ones,
    // newest last. Entries overwritten in the ring are absent.
    std::vector<FlightRecord> in_flight;
    std::vector<FlightRecord> recent;
  };
  Snapshot TakeSnapshot(size_t recent = 0) const;

  // Every entry still in the ring, oldest first, as a JSON object.
  std::string DumpJson() const;

  size_t capacity() const { return ring_.size(); }
  const std::string& device() const { return device_; }

 private:
  FlightRecord* Find(int64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const FlightRecord* Find(int64_t seq) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RealClock real_clock_;
  Clock* const clock_;
  const std::string device_;
  mutable absl::Mutex mu_;
  std::vector<FlightRecord> ring_ ABSL_GUARDED_BY(mu_);
  int64_t last_enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_started_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_finished_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_completed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t collectives_enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  // Every op before it has finished (or left the ring).
  int64_t first_unfinished_ ABSL_GUARDED_BY(mu_) = 1;
};

// Note [Device op states]
// A host backend (Gloo) runs an op on its own thread: once started it is
// inside the collective. A device backend (NCCL) only queues the op on the
// GPU's stream, behind whatever the rank queued before it (the backward
// pass's kernels, say); the op thread goes on at once. So "started" says
// only that the op is queued on the device, and the op is inside the
// collective only once the GPU reaches it: the backend records an event in
// front of the op's kernels and marks the op kRunning when that event has
// passed. A rank whose op stays started while its peers' copies of it are
// running has a GPU still busy with earlier work: the hang detector names
// that rank instead of blaming the collective.

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_FLIGHT_RECORDER_H_
