// Small helpers at the gRPC boundary shared by the CLI, workers and tests.
//
// Thread-safe: the functions keep no state.
//
// Example:
//   absl::StatusOr<ServingStatus> s = CheckHealth(channel, "127.0.0.1:29650", absl::Seconds(5));
#ifndef CHORUS_COMMON_GRPC_UTIL_H_
#define CHORUS_COMMON_GRPC_UTIL_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/status.h"

namespace chorus {

// grpc::Status <-> absl::Status; codes map one to one.
absl::Status FromGrpcStatus(const grpc::Status& status);
grpc::Status ToGrpcStatus(const absl::Status& status);

// Largest message either side of a coordinator channel accepts (store values
// are limited to 16 MB; checkpoint chunks are far smaller).
inline constexpr int kMaxCoordinatorMessageBytes = 32 << 20;

// The grpc.health.v1 service name a coordinator reports SERVING only while
// it leads its cluster (coordinator/state/leadership.h); clients given several
// coordinators send their calls to whichever one says SERVING for it.
inline constexpr char kLeaderHealthService[] = "chorus.v1.Leader";

// Every coordinator channel pings its connection after this long without
// reading from it, and drops the connection when a ping is not answered
// within the timeout: a frozen coordinator is noticed within their sum
// (Note [Noticing a frozen coordinator] in grpc_util.cc).
inline constexpr absl::Duration kCoordinatorKeepaliveTime = absl::Seconds(2);
inline constexpr absl::Duration kCoordinatorKeepaliveTimeout = absl::Seconds(2);
// How long one connection attempt of a coordinator channel may take before
// gRPC gives it up and tries again (gRPC reads it from the "min reconnect
// backoff" argument). Agents and ranks, which must find a restarted
// coordinator within its recovery grace period, keep 0.2 s: an attempt that
// reached the new process before it served is abandoned and made again
// soon. A one-shot client (the CLI) waits longer, so that a coordinator slow
// to answer on a loaded machine is not taken for one that is gone: at
// 0.2 s, `chorus up` beside a busy build failed "connection attempt timed
// out before receiving SETTINGS frame".
inline constexpr absl::Duration kReconnectingConnectTimeout = absl::Milliseconds(200);
inline constexpr absl::Duration kOneShotConnectTimeout = absl::Seconds(5);

// Makes the server `builder` builds accept the keepalive pings of
// coordinator channels, which gRPC's default server policy answers with
// GOAWAY "too_many_pings". Every server a coordinator channel reaches must
// call it: the coordinator's, a follower's, and fakes of them in tests.
void AcceptCoordinatorKeepalive(grpc::ServerBuilder& builder);

// A channel to the coordinator at `address` (HOST:PORT) with this process's
// client security (common/auth.h: TLS if a CA is configured, a bearer token
// on every call if one is). `address` may list several coordinators,
// "a:29650,b:29650,c:29650": the channel then connects to all of them and
// sends every call to the leader (Note [Following the leader] in
// grpc_util.cc); while none leads, calls fail UNAVAILABLE at once, or wait
// for a leader until their deadline when they are wait_for_ready. A
// connection to a coordinator that stops answering (frozen, or its host
// gone) is dropped within kCoordinatorKeepaliveTime +
// kCoordinatorKeepaliveTimeout, failing its calls UNAVAILABLE.
// `connect_timeout`: how long each connection attempt may take (above).
std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(
    const std::string& address, absl::Duration connect_timeout = kReconnectingConnectTimeout);

// The gRPC target of a channel over every coordinator in `addresses` (a
// list as ParseHostPortList reads it): "ipv4:IP:PORT,IP:PORT" or
// "ipv6:[IP]:PORT,...", host names resolved once, now. INVALID_ARGUMENT
// naming the bad entry, UNAVAILABLE naming a host that does not resolve,
// or hosts that resolve to IPv4 only and IPv6 only in one list.
absl::StatusOr<std::string> CoordinatorListTarget(const std::string& addresses);

// Trailing metadata of a follower coordinator's refusals while no
// coordinator can lead (etcd unreachable or without quorum): why
// (coordinator/service/follower_server.h).
inline constexpr char kNoLeaderMetadataKey[] = "chorus-no-leader";

// One call to the coordinator behind `channel` with `context`; any method a
// follower refuses will do (all but health).
using LeaderProbe =
    std::function<grpc::Status(const std::shared_ptr<grpc::Channel>&, grpc::ClientContext*)>;

// Why no coordinator of `addresses` (one HOST:PORT or a list) leads, as the
// first follower that knows says (kNoLeaderMetadataKey, quoted after
// "HOST:PORT says: "); empty when none says (unreachable, or the followers
// name a leader). Asks with `probe` one coordinator at a time, each for at
// most a second, all within `budget` (Note [Why none leads] in
// grpc_util.cc).
std::string NoLeaderReason(const std::string& addresses, absl::Duration budget,
                           const LeaderProbe& probe);

// Asks the grpc.health.v1 service behind `channel` (the coordinator at
// `address`, named in messages) for the whole server's status, waiting up to
// `timeout` for a connection. UNAVAILABLE / DEADLINE_EXCEEDED with a message
// naming `address` when nothing answers within `timeout`.
absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& address,
    absl::Duration timeout);

}  // namespace chorus

#endif  // CHORUS_COMMON_GRPC_UTIL_H_
