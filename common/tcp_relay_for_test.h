// A TCP relay on 127.0.0.1 for tests that need a connection to misbehave
// between a gRPC client and its server: frozen (a SIGSTOPped server, as
// its clients see it) or slow to start (a congested slow link, on which a
// new connection's handshakes take seconds).
//
// Example:
//   TcpRelay relay(server_port);
//   channel = MakeCoordinatorChannel(absl::StrCat("127.0.0.1:", relay.port()));
//   relay.HoldNewConnections(absl::Seconds(3));  // later connections start slowly
//   relay.Cut();                                 // the current ones are closed
//   relay.Freeze();                              // nothing moves any more
#ifndef CHORUS_COMMON_TCP_RELAY_FOR_TEST_H_
#define CHORUS_COMMON_TCP_RELAY_FOR_TEST_H_

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace chorus {

// Relays 127.0.0.1:port() to 127.0.0.1:`backend_port`, every accepted
// connection to a connection of its own. Its threads are joined by the
// destructor.
class TcpRelay {
 public:
  explicit TcpRelay(int backend_port);
  ~TcpRelay();
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  int port() const { return port_; }  // 0: could not listen
  // From now on the relay reads and writes nothing more in either direction
  // and accepts no connection, but keeps every socket open, so the kernel
  // still acknowledges what clients send.
  void Freeze() { frozen_.store(true); }
  // Connections accepted from now on relay nothing, either way, for `hold`
  // after they were accepted: their handshakes take that long. Zero: none
  // held (the default). Connections already relaying are not affected.
  void HoldNewConnections(absl::Duration hold) ABSL_LOCKS_EXCLUDED(mu_);
  // Closes every connection relaying now, both ways, as a cut that outlasted
  // their peers' patience would; new ones are accepted as before.
  void Cut() { cuts_.fetch_add(1); }
  // Connections accepted so far.
  int accepted() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void AcceptConnections();
  int ConnectToBackend() const;
  // Copies bytes both ways from `start` on, until either side closes, the
  // relay stops or a Cut; while frozen, touches neither socket.
  void Pump(int client, int backend, absl::Time start);

  const int backend_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> frozen_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int> cuts_{0};
  mutable absl::Mutex mu_;
  absl::Duration hold_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  int accepted_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;  // last: starts after everything above is set
};

}  // namespace chorus

#endif  // CHORUS_COMMON_TCP_RELAY_FOR_TEST_H_
