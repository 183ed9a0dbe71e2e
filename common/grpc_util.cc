#include "common/grpc_util.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/auth.h"
#include "common/host_port.h"
#include "glog/logging.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace chorus {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

// Adds "authorization: Bearer TOKEN" to every call on the channel.
class BearerTokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(std::string header) : header_(std::move(header)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", header_});
    }
    methods->Proceed();
  }

 private:
  std::string header_;
};

class BearerTokenFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(std::string token) : header_("Bearer " + std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(header_);
  }

 private:
  std::string header_;
};

// Note [Following the leader]
// Several coordinators share one state and one of them leads
// (coordinator/state/leadership.h); the others answer every call with UNAVAILABLE
// and the leader's address. Clients find the leader through gRPC itself: a
// list of coordinators becomes one channel with round_robin over all of
// them and client-side health checking on kLeaderHealthService, so a
// subchannel counts as ready only while its coordinator's health service
// says SERVING for it, which only the leader does. Every call therefore
// goes to the leader; when leadership moves, the old leader's Watch stream
// reports NOT_SERVING (or its connection drops) and the new one's SERVING,
// and calls follow within the time the health streams take to tell
// (well under a second on a LAN). The paths that already survive a
// coordinator restart on one address (retries on UNAVAILABLE,
// wait_for_ready with a deadline, the recovery grace) then cover a
// "restart" at another address of the list as well. round_robin needs
// every address up front: host names are resolved once, when the channel
// is made, with getaddrinfo (one address per host; a coordinator moved to
// a new IP needs a new channel, i.e. a client restart).
constexpr char kLeaderServiceConfig[] =
    R"({"loadBalancingConfig":[{"round_robin":{}}],)"
    R"("healthCheckConfig":{"serviceName":"chorus.v1.Leader"}})";

// The first IPv4 and IPv6 address `host` resolves to ("" where none).
absl::Status Resolve(const std::string& host, std::string* v4, std::string* v6) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("coordinator host \"", host, "\" does not resolve: ", gai_strerror(rc)));
  }
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0)
      continue;
    if (a->ai_family == AF_INET && v4->empty()) *v4 = text;
    if (a->ai_family == AF_INET6 && v6->empty()) *v6 = text;
  }
  freeaddrinfo(found);
  return absl::OkStatus();
}

// Note [Driving a list channel]
// gRPC makes progress on a channel's connections (a TCP connect, the TLS
// and HTTP/2 handshakes, the health stream) only while some thread polls
// for it: a call waiting on the channel, or gRPC's backup poller, which
// runs every 5 s, longer than a connection attempt may take (the attempt is
// abandoned after the reconnect backoff, 0.2-2 s). With one address a call
// made while the coordinator restarts waits for the connection and so polls
// it. On a list channel round_robin fails calls at once while no
// coordinator is ready, so a client that retries without wait_for_ready
// (the agent's stream, a rank's Join) polls nothing, and after a failover
// the new leader's connection never completed (the agent of
// failover_e2e_test never reconnected). So a list channel gets a thread
// that waits on its state changes, 0.5 s at a time, which polls its
// connections. It holds the channel only while it waits, and ends when it
// is the channel's last holder.
void DriveConnections(const std::shared_ptr<grpc::Channel>& channel) {
  std::thread([weak = std::weak_ptr<grpc::Channel>(channel)] {
    while (true) {
      std::shared_ptr<grpc::Channel> held = weak.lock();
      if (held == nullptr || held.use_count() == 1) return;
      const grpc_connectivity_state state = held->GetState(/*try_to_connect=*/true);
      held->WaitForStateChange(state, absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
    }
  }).detach();
}

// Note [Noticing a frozen coordinator]
// A coordinator that is frozen (SIGSTOPped, swapped out, its VM paused)
// keeps its TCP connections: its kernel still acknowledges what clients
// send. So without pings a connection to it looks healthy for as long as
// the freeze lasts: a stream over it (an agent's, a rank's heartbeats, a
// program supervisor's, `chorus watch`) never ends, and a list channel
// keeps sending calls to a frozen leader, whose health stream said SERVING
// before it froze (Note [Following the leader]). So every coordinator
// channel sends an HTTP/2 ping when it has read nothing for
// kCoordinatorKeepaliveTime, with or without calls open (an idle agent's
// channel too) and however long it has sent no data (gRPC stops after two
// pings without data unless told otherwise), and closes the connection
// when a ping is not answered within kCoordinatorKeepaliveTimeout: its
// calls fail UNAVAILABLE within about 4 s, the retries the clients already
// make on UNAVAILABLE take over, and on a list channel the frozen leader's
// connection leaves READY, so calls go to whichever coordinator leads
// next. A ping is a 17-byte frame each way, every 2 s per idle connection.
// gRPC's servers take that many pings for abuse (by default at most one
// per 5 minutes while they send no data, then GOAWAY "too_many_pings" after
// two strikes), so every server these channels reach accepts them
// (AcceptCoordinatorKeepalive). The coordinator's own channel to etcd
// pings too, less often, as etcd allows (coordinator/etcd/etcd_client.cc).
void SetCoordinatorKeepalive(grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kCoordinatorKeepaliveTime)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kCoordinatorKeepaliveTimeout)));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

}  // namespace

void AcceptCoordinatorKeepalive(grpc::ServerBuilder& builder) {
  // Note [Noticing a frozen coordinator]. Pings at half the clients'
  // interval still count as expected, leaving room for timers that fire
  // early; and no number of pings ends a connection (0 strikes: no limit).
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      static_cast<int>(absl::ToInt64Milliseconds(kCoordinatorKeepaliveTime / 2)));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

absl::StatusOr<std::string> CoordinatorListTarget(const std::string& addresses) {
  absl::StatusOr<std::vector<HostPort>> list = ParseHostPortList(addresses);
  if (!list.ok()) return list.status();
  std::vector<std::string> v4;
  std::vector<std::string> v6;
  for (const HostPort& entry : *list) {
    std::string four;
    std::string six;
    if (absl::Status s = Resolve(entry.host, &four, &six); !s.ok()) return s;
    if (!four.empty()) v4.push_back(FormatHostPort(four, entry.port));
    if (!six.empty()) v6.push_back(FormatHostPort(six, entry.port));
  }
  // One scheme per target: IPv4 when every host has an IPv4 address.
  if (v4.size() == list->size()) return absl::StrCat("ipv4:", absl::StrJoin(v4, ","));
  if (v6.size() == list->size()) return absl::StrCat("ipv6:", absl::StrJoin(v6, ","));
  return absl::UnavailableError(
      absl::StrCat("coordinators \"", addresses,
                   "\": some resolve to IPv4 addresses only and others to IPv6 only; list "
                   "coordinators that all have an address of one family"));
}

std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(const std::string& address,
                                                      absl::Duration connect_timeout) {
  const ClientSecurity& security = ClientSecurityConfig();
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!security.tls_ca_pem.empty()) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = security.tls_ca_pem;
    tls.pem_cert_chain = security.tls_cert_pem;
    tls.pem_private_key = security.tls_key_pem;
    credentials = grpc::SslCredentials(tls);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxCoordinatorMessageBytes);
  args.SetMaxSendMessageSize(kMaxCoordinatorMessageBytes);
  // A restarted coordinator must be found again within its recovery grace
  // period (default 30 s, seconds in tests): reconnect attempts every 0.2 s
  // at first and never more than 2 s apart, instead of gRPC's 1 s growing to
  // 120 s. An attempt itself (TCP, TLS and HTTP/2 handshakes) may take
  // `connect_timeout` (kReconnectingConnectTimeout in grpc_util.h says which).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(connect_timeout)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  SetCoordinatorKeepalive(args);
  std::string target = address;
  if (absl::StrContains(address, ',')) {
    // Note [Following the leader].
    absl::StatusOr<std::string> list = CoordinatorListTarget(address);
    if (list.ok()) {
      target = *std::move(list);
      args.SetServiceConfigJSON(kLeaderServiceConfig);
      // The target names IP addresses; TLS checks every coordinator's
      // certificate against the first coordinator's name as written.
      if (!security.tls_ca_pem.empty()) {
        args.SetSslTargetNameOverride(ParseHostPortList(address)->front().host);
      }
    } else {
      // Callers check their lists first; the channel over the list as
      // written fails every call, naming it.
      LOG(ERROR) << list.status().message();
    }
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!security.token.empty())
    interceptors.push_back(std::make_unique<BearerTokenFactory>(security.token));
  std::shared_ptr<grpc::Channel> channel = grpc::experimental::CreateCustomChannelWithInterceptors(
      target, credentials, args, std::move(interceptors));
  if (target != address) DriveConnections(channel);
  return channel;
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& address,
    absl::Duration timeout) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  // Wait for the connection within the deadline instead of failing at once
  // while the channel is still connecting.
  context.set_wait_for_ready(true);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    absl::Status s = FromGrpcStatus(status);
    if (s.code() == absl::StatusCode::kDeadlineExceeded ||
        s.code() == absl::StatusCode::kUnavailable) {
      return absl::Status(s.code(), absl::StrCat("no coordinator answered at ", address, " within ",
                                                 absl::FormatDuration(timeout)));
    }
    return absl::Status(s.code(),
                        absl::StrCat("health check of ", address, " failed: ", s.message()));
  }
  return response.status();
}

// Note [Why none leads]
// With a list of coordinators a call goes only to the leader (Note
// [Following the leader]), so while none leads it fails after its deadline
// with nothing but "Deadline Exceeded", and an agent cannot tell a cluster
// that is gone from one waiting for its state store. When the coordinators
// are up but none can be elected (etcd unreachable or without quorum) every
// follower says why in its refusals' trailing metadata chorus-no-leader.
// So the CLI quotes the first reason given after a call that no leader
// answered, and an agent keeps its ranks past its reconnect window while
// one is given (worker/agent/agent.cc).
std::string NoLeaderReason(const std::string& addresses, absl::Duration budget,
                           const LeaderProbe& probe) {
  absl::StatusOr<std::vector<HostPort>> list = ParseHostPortList(addresses);
  if (!list.ok()) return "";
  const absl::Time deadline = absl::Now() + budget;
  for (const HostPort& entry : *list) {
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    const std::string address = FormatHostPort(entry.host, entry.port);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(std::min(deadline, now + absl::Seconds(1))));
    if (probe(MakeCoordinatorChannel(address), &context).ok()) continue;
    const auto& trailers = context.GetServerTrailingMetadata();
    auto why = trailers.find(kNoLeaderMetadataKey);
    if (why != trailers.end()) {
      return absl::StrCat(address, " says: ",
                          absl::string_view(why->second.data(), why->second.size()));
    }
  }
  return "";
}

}  // namespace chorus
