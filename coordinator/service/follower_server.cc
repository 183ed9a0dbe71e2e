#include "coordinator/service/follower_server.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/grpc_util.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "coordinator/http/http_server.h"
#include "coordinator/service/health_service.h"
#include "glog/logging.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"

namespace chorus {
namespace {

using grpc::health::v1::HealthCheckResponse;

// Answers every method no service registered (all of chorus.v1) with
// FollowerStatus, without reading the request.
class CatchAll final : public grpc::CallbackGenericService {
 public:
  explicit CatchAll(const Leadership& leadership) : leadership_(leadership) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    // While the election fails (etcd unreachable or without quorum) asking
    // etcd for the leader would only wait out the same error.
    absl::Status election_error = leadership_.ElectionError();
    if (!election_error.ok()) return new Refusal(context, std::nullopt, election_error);
    return new Refusal(context, leadership_.Leader(), absl::OkStatus());
  }

 private:
  class Refusal final : public grpc::ServerGenericBidiReactor {
   public:
    Refusal(grpc::GenericCallbackServerContext* context, const std::optional<LeaderInfo>& leader,
            const absl::Status& election_error) {
      if (leader.has_value() && !leader->address.empty()) {
        context->AddTrailingMetadata(kLeaderMetadataKey, leader->address);
      }
      const grpc::Status refusal = FollowerStatus(leader, election_error);
      if (!election_error.ok()) {
        context->AddTrailingMetadata(kNoLeaderMetadataKey, refusal.error_message());
      }
      Finish(refusal);
    }
    void OnDone() override { delete this; }
  };

  const Leadership& leadership_;
};

// "?k=v&..." of `params`, percent-encoded; empty for none.
std::string QueryString(const std::map<std::string, std::string>& params) {
  std::string query;
  auto encode = [&query](const std::string& text) {
    for (const unsigned char c : text) {
      if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
        query += static_cast<char>(c);
      } else {
        absl::StrAppend(&query, "%", absl::Hex(c, absl::kZeroPad2));
      }
    }
  };
  for (const auto& [key, value] : params) {
    query += query.empty() ? "?" : "&";
    encode(key);
    query += "=";
    encode(value);
  }
  return query;
}

// A follower's answer to every page but /metrics: 307 to the same page on
// the leader's HTTP port, or 503 when there is none to send the client to.
HttpResponse RedirectToLeader(const Leadership& leadership, const HttpRequest& request) {
  const std::optional<LeaderInfo> leader = leadership.Leader();
  HttpResponse response;
  if (!leader.has_value() || leader->http_url.empty()) {
    response.status = 503;
    response.body = absl::StrCat("this coordinator is a follower and ",
                                 leader.has_value() ? "the leader has no HTTP port"
                                                    : "no leader is elected yet; retry shortly",
                                 "\n");
    return response;
  }
  response.status = 307;
  response.location = leader->http_url + request.path + QueryString(request.params);
  response.body = absl::StrCat("the leader's status page: ", response.location, "\n");
  return response;
}

// The HTTP routes of a follower: its own /metrics, a redirect for the rest.
std::vector<HttpRoute> FollowerRoutes(const Leadership& leadership,
                                      std::function<std::string()> metrics_text) {
  std::vector<HttpRoute> routes;
  routes.push_back(
      {"/metrics", false, [metrics_text = std::move(metrics_text)](const HttpRequest&) {
         return HttpResponse{200, kPlainText, metrics_text()};
       }});
  routes.push_back({"/", true, [&leadership](const HttpRequest& request) {
                      return RedirectToLeader(leadership, request);
                    }});
  return routes;
}

}  // namespace

grpc::Status FollowerStatus(const std::optional<LeaderInfo>& leader,
                            const absl::Status& election_error) {
  constexpr char kHint[] =
      "(give clients every coordinator: --coordinator a:29650,b:29650,c:29650)";
  if (!election_error.ok()) {
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("no coordinator can lead: ", election_error.message(),
                     "; submissions and every other change are refused until the state store "
                     "answers again (running jobs keep training)"));
  }
  if (!leader.has_value() || leader->address.empty()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("this coordinator is a follower and no leader is elected "
                                     "yet; retry shortly ",
                                     kHint));
  }
  return grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      absl::StrCat("this coordinator is a follower; the leader is ", leader->address, " ", kHint));
}

absl::StatusOr<std::unique_ptr<FollowerServer>> FollowerServer::Start(
    const ServerOptions& options, const Leadership& leadership,
    std::function<std::string()> metrics_text) {
  ASSIGN_OR_RETURN(ListenPlan plan, PlanListening(options));
  std::unique_ptr<FollowerServer> follower(new FollowerServer());
  follower->auth_ = std::move(plan.auth);
  follower->health_ = std::make_unique<HealthService>();
  follower->health_->SetStatus("", HealthCheckResponse::SERVING);
  follower->health_->SetStatus(kLeaderHealthService, HealthCheckResponse::NOT_SERVING);
  follower->catch_all_ = std::make_unique<CatchAll>(leadership);
  grpc::ServerBuilder builder;
  // As the full server (ConfigureGrpc in server.cc): no second process on
  // this port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // List channels keep a health stream open to every coordinator, pinging
  // (Note [Noticing a frozen coordinator] in common/grpc_util.cc).
  AcceptCoordinatorKeepalive(builder);
  builder.AddListeningPort(options.listen, plan.credentials, &follower->port_);
  builder.RegisterService(follower->health_.get());
  builder.RegisterCallbackGenericService(follower->catch_all_.get());
  follower->server_ = builder.BuildAndStart();
  if (follower->server_ == nullptr || follower->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "--listen ", options.listen, ": cannot listen (is the port in use by another process?)"));
  }
  if (plan.http_address.has_value()) {
    HttpServer::Options http_options;
    http_options.host = plan.http_address->host;
    http_options.port = plan.http_address->port;
    http_options.require_token = !IsLoopbackHost(plan.http_address->host);
    http_options.auth = follower->auth_.get();
    ASSIGN_OR_RETURN(follower->http_,
                     HttpServer::Start(http_options, FollowerRoutes(leadership, metrics_text)));
  }
  LOG(INFO) << "following (another coordinator leads or none is elected yet) on "
            << FormatHostPort(ParseHostPort(options.listen)->host, follower->port_);
  FollowerServer* watching = follower.get();
  follower->watch_ = std::thread([watching, &leadership] { watching->WatchElection(leadership); });
  return follower;
}

void FollowerServer::WatchElection(const Leadership& leadership) {
  bool serving = true;
  do {
    const absl::Status error = leadership.ElectionError();
    if (error.ok() == serving) continue;
    serving = error.ok();
    health_->SetStatus("",
                       serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING);
    if (serving) {
      LOG(INFO) << "the election can go on again: serving";
    } else {
      LOG(WARNING) << "not serving until an election can go on: " << error.message();
    }
  } while (!stopping_.WaitForNotificationWithTimeout(kElectionWatchInterval));
}

int FollowerServer::http_port() const { return http_ != nullptr ? http_->port() : 0; }

void FollowerServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  stopping_.Notify();
  if (watch_.joinable()) watch_.join();
  if (health_ != nullptr) health_->Shutdown();
  if (http_ != nullptr) http_->Shutdown();
  if (server_ != nullptr) {
    server_->Shutdown(absl::ToChronoTime(absl::Now()));
    server_->Wait();
  }
}

FollowerServer::~FollowerServer() { Shutdown(); }

}  // namespace chorus
