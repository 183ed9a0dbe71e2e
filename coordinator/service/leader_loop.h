// LeaderLoop: a coordinator process's life between leading and following.
//
// While it does not lead it serves a follower server (when it has one: a
// coordinator alone has none, it leads at once) and campaigns; on winning it
// stops the follower and starts the full coordinator on the same ports;
// when leadership is lost it shuts the full coordinator down at once (so it
// writes nothing more) and goes back to following and campaigning. Stop
// (SIGTERM) gives leadership up, so another coordinator takes over at once,
// and ends Run.
//
// Thread-safety: Run on one thread; Stop, leading() and leader_changes()
// from any thread.
//
// Example:
//   LeaderLoop loop(leadership, {.start_leader = ..., .start_follower = ...});
//   std::thread signals([&] { sigwait(...); loop.Stop(); });
//   absl::Status ended = loop.Run();
#ifndef CHORUS_COORDINATOR_SERVICE_LEADER_LOOP_H_
#define CHORUS_COORDINATOR_SERVICE_LEADER_LOOP_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/state/leadership.h"

namespace chorus {

class LeaderLoop {
 public:
  // A running server: the full coordinator or the follower server.
  class Serving {
   public:
    virtual ~Serving() = default;
    virtual int port() const = 0;
    // 0 when there is no HTTP port.
    virtual int http_port() const = 0;
    // Stops serving; calls in flight get `grace` to finish. Returns when the
    // ports can be bound again.
    virtual void Shutdown(absl::Duration grace) = 0;
  };

  // The ports a first server bound. Zero until then: "as the options say".
  // Every later server gets the bound ones, so that clients keep dialling
  // the same address when the options asked for any free port.
  struct Ports {
    int grpc = 0;
    int http = 0;
  };
  using Starter = std::function<absl::StatusOr<std::unique_ptr<Serving>>(const Ports&)>;

  struct Options {
    // The full coordinator.
    Starter start_leader;
    // The follower server; null for none (a coordinator alone).
    Starter start_follower;
    // Called once, when the first server listens (port files).
    std::function<void(const Ports&)> on_listening;
    // How long calls in flight may finish after Stop (leadership lost: none).
    absl::Duration stop_grace = absl::Seconds(5);
  };

  LeaderLoop(Leadership& leadership, Options options);
  LeaderLoop(const LeaderLoop&) = delete;
  LeaderLoop& operator=(const LeaderLoop&) = delete;

  // Leads and follows until Stop: OK then. An error when a server cannot
  // start (leadership, if won, is given up first) or the election cannot go
  // on.
  absl::Status Run();
  // Gives leadership up and makes Run return (after the full coordinator's
  // stop_grace). Idempotent.
  void Stop();

  // Whether this coordinator leads: true from just before its full server
  // starts (so that whatever that server answers finds it leading) until
  // that server has stopped.
  bool leading() const;
  // How often this coordinator became leader or stopped leading (a full
  // server that fails to start counts as both).
  int64_t leader_changes() const;

 private:
  bool stopping() const;
  // Starts the follower server (if there is one) and campaigns; OK when
  // this coordinator leads.
  absl::Status FollowUntilElected();
  // Starts `starter`'s server, remembering the ports of the first one.
  absl::StatusOr<std::unique_ptr<Serving>> StartOn(const Starter& starter);
  void SetLeading(bool leading);

  Leadership& leadership_;
  const Options options_;
  Ports ports_;             // only Run's thread
  bool listening_ = false;  // only Run's thread
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  int64_t leader_changes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SERVICE_LEADER_LOOP_H_
