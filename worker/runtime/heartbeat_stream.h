// HeartbeatStream: a rank's RankService.Heartbeat stream to the coordinator,
// kept open for the life of the object. A background thread sends the
// heartbeat `compose` returns every `interval`; when the stream breaks (the
// coordinator restarted or is unreachable, or ended it after a directive,
// which goes to `on_directive` as soon as it arrives) it waits
// `reconnect_delay`, opens a new one and goes on. Training never waits for
// it: once the ranks are connected they do not depend on the coordinator.
//
// Thread-safety: `compose` and `paused` run on the stream's thread, and
// `on_directive` on a reader thread of the open stream, without the
// stream's lock; the accessors may be called from any thread. The
// destructor stops both threads and joins them: the open stream is closed
// the ordinary way (half-close, then the coordinator's status), not
// cancelled.
//
// Example:
//   HeartbeatStream heartbeats(*stub, [&] { return ComposeHeartbeat(progress); });
//   RunTraining();
//   // leaving the scope ends the stream
#ifndef CHORUS_WORKER_RUNTIME_HEARTBEAT_STREAM_H_
#define CHORUS_WORKER_RUNTIME_HEARTBEAT_STREAM_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/clock.h"

namespace chorus {

class HeartbeatStream {
 public:
  struct Options {
    absl::Duration interval = absl::Seconds(1);
    // Between a broken stream and the next attempt to open one.
    absl::Duration reconnect_delay = absl::Seconds(1);
    // For the waits between heartbeats; null = the real clock.
    Clock* clock = nullptr;
    // Called with each directive the coordinator sends (it sends one just
    // before it ends the stream, e.g. RE_RENDEZVOUS to an elastic job's
    // next generation), on the stream's reader thread as soon as it
    // arrives (Note [Directives are read at once]); may be empty.
    std::function<void(const v1::Directive&)> on_directive;
    // Asked on the stream's thread before each heartbeat; while it returns
    // true none is sent (the stream stays open), so the coordinator sees
    // the rank fall silent. May be empty (never paused).
    std::function<bool()> paused;
  };

  // Starts sending at once. `stub` must outlive this object.
  HeartbeatStream(v1::RankService::StubInterface& stub, std::function<v1::RankHeartbeat()> compose,
                  Options options);
  HeartbeatStream(v1::RankService::StubInterface& stub, std::function<v1::RankHeartbeat()> compose)
      : HeartbeatStream(stub, std::move(compose), Options()) {}
  ~HeartbeatStream();
  HeartbeatStream(const HeartbeatStream&) = delete;
  HeartbeatStream& operator=(const HeartbeatStream&) = delete;

  // Heartbeats the stream accepted so far (over all streams).
  int64_t sent() const;
  // Streams opened so far (1 + reconnections).
  int64_t streams_opened() const;

 private:
  void Run();
  bool StopOrStreamEnded() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  v1::RankService::StubInterface& stub_;
  const std::function<v1::RankHeartbeat()> compose_;
  const Options options_;
  RealClock real_clock_;
  Clock& clock_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The open stream's reader saw it end.
  bool stream_ended_ ABSL_GUARDED_BY(mu_) = false;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t streams_opened_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: starts after everything above is set
};

}  // namespace chorus

#endif  // CHORUS_WORKER_RUNTIME_HEARTBEAT_STREAM_H_
