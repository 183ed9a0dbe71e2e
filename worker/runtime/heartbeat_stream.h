// HeartbeatStream: a rank's RankService.Heartbeat stream to the coordinator,
// kept open for the life of the object. A background thread sends the
// heartbeat `compose` returns every `interval`; when the stream breaks (the
// coordinator restarted or is unreachable, or ended it after a directive,
// which goes to `on_directive` as soon as it arrives) it waits a jittered
// backoff of at most `reconnect_delay`, opens a new one and goes on. Training never waits for
// it: once the ranks are connected they do not depend on the coordinator.
//
// With `Options::agent` (the rank's end of its node agent's heartbeat
// channel, AgentChannelFromEnvironment()) the heartbeats go to the agent
// instead, which sends its ranks' heartbeats to the coordinator in one
// message per interval and passes their directives back (Note [Heartbeats
// through the agent] in worker/agent/agent.cc); `compose`, `paused` and
// `on_directive` work the same. When the agent's end closes, the stream
// goes on directly to the coordinator as without one.
//
// Thread-safety: `compose` and `paused` run on the stream's thread, and
// `on_directive` on a reader thread of the open stream, without the
// stream's lock; the accessors may be called from any thread. The
// destructor stops both threads and joins them: the open stream is closed
// the ordinary way (a last heartbeat composed then, a half-close, then the
// coordinator's status), not cancelled.
//
// Example:
//   HeartbeatStream heartbeats(*stub, [&] { return ComposeHeartbeat(progress); });
//   RunTraining();
//   // leaving the scope ends the stream
#ifndef CHORUS_WORKER_RUNTIME_HEARTBEAT_STREAM_H_
#define CHORUS_WORKER_RUNTIME_HEARTBEAT_STREAM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/clock.h"
#include "worker/runtime/progress_channel.h"

namespace chorus {

class HeartbeatStream {
 public:
  struct Options {
    absl::Duration interval = absl::Seconds(1);
    // The most time between a broken stream and the next attempt to open
    // one: the waits start at half of it and double up to it, each drawn
    // at random from the upper half of its ceiling (Note [Backoff] in
    // common/backoff.cc); a stream that stayed open this long starts them
    // over.
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
    // The agent's heartbeat channel; null: straight to the coordinator.
    std::shared_ptr<ProgressSender> agent;
  };

  // Starts sending at once. `stub` must outlive this object.
  HeartbeatStream(v1::RankService::StubInterface& stub, std::function<v1::RankHeartbeat()> compose,
                  Options options);
  HeartbeatStream(v1::RankService::StubInterface& stub, std::function<v1::RankHeartbeat()> compose)
      : HeartbeatStream(stub, std::move(compose), Options()) {}
  ~HeartbeatStream();
  HeartbeatStream(const HeartbeatStream&) = delete;
  HeartbeatStream& operator=(const HeartbeatStream&) = delete;

  // Heartbeats the stream accepted so far (over all streams, and those the
  // agent's channel took).
  int64_t sent() const;
  // Streams to the coordinator opened so far (1 + reconnections; 0 while
  // the heartbeats go through the agent).
  int64_t streams_opened() const;
  // Sends the next heartbeat now instead of at the end of the interval (a
  // program's first word that it re-forms in its own process: Note [Urgent
  // heartbeats] in worker/agent/agent.cc). Any thread.
  void SendNow();

 private:
  void Run();
  // Sends through options_.agent until stop_ or the agent's end closes.
  void RunThroughAgent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the stream's last heartbeat with `send` (Note [The last
  // heartbeat]), without holding mu_ while it sends.
  void SendLast(const std::function<bool()>& send) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StopOrAgentGone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What ends the wait between two heartbeats.
  bool WakeThroughAgent() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool WakeOnStream() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  // The agent's end of the channel closed.
  bool agent_gone_ ABSL_GUARDED_BY(mu_) = false;
  bool send_now_ ABSL_GUARDED_BY(mu_) = false;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t streams_opened_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: starts after everything above is set
};

// The rank's end of its agent's heartbeat channel, from
// CHORUS_AGENT_HEARTBEATS_FD; null (heartbeats go straight to the
// coordinator) when it is unset, and, with a warning, when it does not name
// an open channel.
std::shared_ptr<ProgressSender> AgentChannelFromEnvironment();

}  // namespace chorus

#endif  // CHORUS_WORKER_RUNTIME_HEARTBEAT_STREAM_H_
