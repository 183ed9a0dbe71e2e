#include "coordinator/coordinator_process.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "coordinator/follower_server.h"

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

AdvertisedAddress AdvertisedAddressOf(const ServerOptions& options,
                                      const LeaderLoop::Ports& ports) {
  AdvertisedAddress advertised;
  absl::StatusOr<HostPort> listen = ParseHostPort(options.listen);
  if (listen.ok()) advertised.grpc = FormatHostPort(listen->host, ports.grpc);
  if (ports.http != 0 && options.http_listen != "off") {
    absl::StatusOr<HostPort> http = ParseHostPort(options.http_listen);
    const std::string host = options.http_listen.empty() || !http.ok() ? "127.0.0.1" : http->host;
    advertised.http_url = absl::StrCat("http://", FormatHostPort(host, ports.http));
  }
  return advertised;
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
