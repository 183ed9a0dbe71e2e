#include "coordinator/service/coordinator_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "coordinator/service/follower_server.h"

namespace chorus {
namespace {

class LeaderServing final : public LeaderLoop::Serving {
 public:
  explicit LeaderServing(std::unique_ptr<CoordinatorServer> server) : server_(std::move(server)) {}
  int port() const override { return server_->port(); }
  int http_port() const override { return server_->http_port(); }
  void Shutdown(absl::Duration grace) override {
    if (server_ == nullptr) return;
    server_->Shutdown(grace);
    server_->Wait();
    server_.reset();  // releases the state directory and the ports
  }

 private:
  std::unique_ptr<CoordinatorServer> server_;
};

class FollowerServing final : public LeaderLoop::Serving {
 public:
  explicit FollowerServing(std::unique_ptr<FollowerServer> server) : server_(std::move(server)) {}
  int port() const override { return server_->port(); }
  int http_port() const override { return server_->http_port(); }
  void Shutdown(absl::Duration) override { server_->Shutdown(); }

 private:
  std::unique_ptr<FollowerServer> server_;
};

}  // namespace

std::string LeaderMetricsText(bool leading, int64_t leader_changes) {
  return absl::StrCat(
      "# HELP chorus_leader 1 while this coordinator leads its cluster, 0 while it follows.\n"
      "# TYPE chorus_leader gauge\n"
      "chorus_leader ",
      leading ? 1 : 0,
      "\n# HELP chorus_leader_changes_total Times this coordinator became leader or stopped "
      "leading.\n"
      "# TYPE chorus_leader_changes_total counter\n"
      "chorus_leader_changes_total ",
      leader_changes, "\n");
}

namespace {

// 0.0.0.0, ::, and the other spellings of the unspecified address.
bool IsWildcardHost(const std::string& host) {
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_UNSPECIFIED(&v6);
  in_addr v4{};
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 && v4.s_addr == INADDR_ANY;
}

}  // namespace

AdvertisedAddress AdvertisedAddressOf(const ServerOptions& options, const std::string& advertise,
                                      const LeaderLoop::Ports& ports) {
  AdvertisedAddress advertised;
  absl::StatusOr<HostPort> grpc = ParseHostPort(advertise.empty() ? options.listen : advertise);
  if (grpc.ok()) {
    const int port = advertise.empty() || grpc->port == 0 ? ports.grpc : grpc->port;
    advertised.grpc = FormatHostPort(grpc->host, port);
  }
  if (ports.http != 0 && options.http_listen != "off") {
    absl::StatusOr<HostPort> http = ParseHostPort(options.http_listen);
    std::string host = options.http_listen.empty() || !http.ok() ? "127.0.0.1" : http->host;
    if (IsWildcardHost(host) && grpc.ok()) host = grpc->host;
    advertised.http_url = absl::StrCat("http://", FormatHostPort(host, ports.http));
  }
  return advertised;
}

absl::Status ValidateAdvertisedAddress(const std::string& listen, const std::string& advertise) {
  constexpr char kWanted[] =
      "HOST:PORT of this coordinator as the other coordinators' clients reach it, e.g. "
      "--advertise_address node1.example:29650; port 0: the port --listen bound";
  if (!advertise.empty()) {
    absl::StatusOr<HostPort> address = ParseHostPort(advertise);
    if (!address.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--advertise_address: ", address.status().message(), " (want ", kWanted, ")"));
    }
    if (IsWildcardHost(address->host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--advertise_address ", advertise,
          ": a wildcard address cannot be dialled; clients would be sent to themselves (want ",
          kWanted, ")"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<HostPort> address = ParseHostPort(listen);
  if (address.ok() && IsWildcardHost(address->host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen ", listen,
        " listens on every interface, and with --state etcd:// a coordinator publishes its "
        "address for clients to follow the leader: give --advertise_address (",
        kWanted, ")"));
  }
  return absl::OkStatus();
}

CoordinatorProcess::CoordinatorProcess(ServerOptions options, Leadership& leadership, bool follow,
                                       std::function<void(const LeaderLoop::Ports&)> on_listening)
    : options_(std::move(options)),
      leadership_(leadership),
      loop_(leadership, LoopOptions(follow, std::move(on_listening))) {}

LeaderLoop::Options CoordinatorProcess::LoopOptions(
    bool follow, std::function<void(const LeaderLoop::Ports&)> on_listening) {
  LeaderLoop::Options loop;
  loop.start_leader = [this](const LeaderLoop::Ports& ports) { return StartLeader(ports); };
  if (follow) {
    loop.start_follower = [this](const LeaderLoop::Ports& ports) { return StartFollower(ports); };
  }
  loop.on_listening = std::move(on_listening);
  return loop;
}

std::string CoordinatorProcess::MetricsText() const {
  return LeaderMetricsText(loop_.leading(), loop_.leader_changes());
}

ServerOptions CoordinatorProcess::OnPorts(const LeaderLoop::Ports& ports) const {
  ServerOptions options = options_;
  if (ports.grpc != 0) {
    options.listen = FormatHostPort(ParseHostPort(options_.listen)->host, ports.grpc);
  }
  if (ports.http != 0 && options_.http_listen != "off") {
    const std::string host =
        options_.http_listen.empty() ? "127.0.0.1" : ParseHostPort(options_.http_listen)->host;
    options.http_listen = FormatHostPort(host, ports.http);
  }
  return options;
}

absl::StatusOr<std::unique_ptr<LeaderLoop::Serving>> CoordinatorProcess::StartLeader(
    const LeaderLoop::Ports& ports) {
  ServerOptions options = OnPorts(ports);
  options.extra_metrics = [this] { return MetricsText(); };
  options.leadership = &leadership_;
  ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorServer> server, CoordinatorServer::Start(options));
  return std::make_unique<LeaderServing>(std::move(server));
}

absl::StatusOr<std::unique_ptr<LeaderLoop::Serving>> CoordinatorProcess::StartFollower(
    const LeaderLoop::Ports& ports) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<FollowerServer> server,
      FollowerServer::Start(OnPorts(ports), leadership_, [this] { return MetricsText(); }));
  return std::make_unique<FollowerServing>(std::move(server));
}

}  // namespace chorus
