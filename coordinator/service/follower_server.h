// FollowerServer: what a coordinator serves on its ports while another one
// leads (or while none is elected yet), so that a client given only this
// coordinator's address learns where to go instead of timing out.
//
// gRPC: the standard health service ("" SERVING while an election can go
// on, NOT_SERVING while it cannot: Note [A follower that cannot elect];
// kLeaderHealthService NOT_SERVING, so clients that follow the leader never
// send calls here) and
// a catch-all answering every other method UNAVAILABLE with the leader's
// address in the message and in the trailing metadata kLeaderMetadataKey.
// HTTP (when there is a port): /metrics for this coordinator, and every
// other path a 307 redirect to the same path on the leader's status page.
//
// Thread-safety: Start returns a running server; Shutdown may be called
// from any thread, more than once; the destructor calls it.
//
// Example:
//   ASSIGN_OR_RETURN(auto follower, FollowerServer::Start(options, leadership, metrics));
//   leadership.Campaign();
//   follower->Shutdown();
#ifndef CHORUS_COORDINATOR_SERVICE_FOLLOWER_SERVER_H_
#define CHORUS_COORDINATOR_SERVICE_FOLLOWER_SERVER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "coordinator/service/server.h"
#include "coordinator/state/leadership.h"
#include "grpcpp/support/status.h"

namespace grpc {
class CallbackGenericService;
class Server;
}  // namespace grpc

namespace chorus {

class HealthService;
class HttpServer;

// Trailing metadata of a follower's answers: the leader's HOST:PORT.
inline constexpr char kLeaderMetadataKey[] = "chorus-leader";
// A follower's answers while no coordinator can lead
// (Leadership::ElectionError, e.g. etcd without quorum) say why in the
// trailing metadata kNoLeaderMetadataKey (common/grpc_util.h).

// Note [A follower that cannot elect]
// A follower answers the health service's whole-server status ("", what
// `chorus ping` asks) SERVING while an election can go on, and NOT_SERVING
// while it cannot (Leadership::ElectionError: etcd unreachable or without
// quorum), within kElectionWatchInterval of the change. Before, a
// coordinator cut from its etcd answered `chorus ping` SERVING and said why
// only in its log every 5 s; `chorus ping` now shows the reason its calls
// are refused with (kNoLeaderMetadataKey). The leader-only service
// (kLeaderHealthService) is NOT_SERVING on every follower.
inline constexpr absl::Duration kElectionWatchInterval = absl::Milliseconds(200);

// The status a follower answers every coordinator call with: UNAVAILABLE
// naming the leader (or saying none is elected yet, or, with a non-OK
// `election_error`, why none can be), and what to give clients so that
// they follow it by themselves.
grpc::Status FollowerStatus(const std::optional<LeaderInfo>& leader,
                            const absl::Status& election_error = absl::OkStatus());

class FollowerServer {
 public:
  // Serves on `options.listen` and its HTTP port (ServerOptions's meaning;
  // tokens and TLS as the full coordinator would). `metrics_text` renders
  // this coordinator's /metrics. INVALID_ARGUMENT for bad options,
  // UNAVAILABLE when a port cannot be bound.
  static absl::StatusOr<std::unique_ptr<FollowerServer>> Start(
      const ServerOptions& options, const Leadership& leadership,
      std::function<std::string()> metrics_text);

  FollowerServer(const FollowerServer&) = delete;
  FollowerServer& operator=(const FollowerServer&) = delete;
  ~FollowerServer();

  int port() const { return port_; }
  // 0 when there is no HTTP port.
  int http_port() const;
  // Stops serving at once (no call here takes time) and waits until the
  // ports are free to bind again.
  void Shutdown();

 private:
  FollowerServer() = default;
  // Note [A follower that cannot elect]: on watch_, until Shutdown.
  void WatchElection(const Leadership& leadership);

  std::unique_ptr<TokenAuthorizer> auth_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<grpc::CallbackGenericService> catch_all_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_;
  int port_ = 0;
  bool shut_down_ = false;
  absl::Notification stopping_;
  std::thread watch_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SERVICE_FOLLOWER_SERVER_H_
