#include "coordinator/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "httplib.h"

namespace chorus {
namespace {

const HttpRoute* FindRoute(const std::vector<HttpRoute>& routes, const std::string& path) {
  for (const HttpRoute& route : routes) {
    if (route.prefix ? absl::StartsWith(path, route.path) : path == route.path) return &route;
  }
  return nullptr;
}

void Answer(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, kPlainText);
}

absl::Status CheckOptions(const HttpServer::Options& options) {
  if (options.require_token && (options.auth == nullptr || !options.auth->enabled())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_listen ", options.host,
        ": requests from other machines must carry the admin token, and there are no tokens; "
        "pass --token_file or listen on 127.0.0.1"));
  }
  if (options.threads < 1 || options.port < 0 || options.port > 65535 ||
      options.io_timeout <= absl::ZeroDuration() || options.max_requests_per_connection < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP server: threads (", options.threads, ") and requests per connection (",
                     options.max_requests_per_connection, ") must be >= 1, the timeout (",
                     absl::FormatDuration(options.io_timeout), ") positive and the port (",
                     options.port, ") in [0, 65535]"));
  }
  return absl::OkStatus();
}

// Threads, timeouts and limits of the connections, and the socket options.
void ConfigureConnections(httplib::Server& server, const HttpServer::Options& options) {
  const int threads = options.threads;
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  const int64_t timeout_us = absl::ToInt64Microseconds(options.io_timeout);
  server.set_read_timeout(timeout_us / 1000000, timeout_us % 1000000);
  server.set_write_timeout(timeout_us / 1000000, timeout_us % 1000000);
  server.set_keep_alive_timeout(std::max<int64_t>(1, timeout_us / 1000000));
  server.set_keep_alive_max_count(options.max_requests_per_connection);
  server.set_payload_max_length(options.max_request_bytes);
  // The library's default adds SO_REUSEPORT, which would let a second
  // coordinator bind the same port and take half the requests.
  server.set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

// Before any route: only GET and HEAD, and the admin token when required.
void GuardRequests(httplib::Server& server, const HttpServer::Options& options) {
  const bool require_token = options.require_token;
  const TokenAuthorizer* auth = options.auth;
  server.set_pre_routing_handler(
      [require_token, auth](const httplib::Request& req, httplib::Response& res) {
        if (req.method != "GET" && req.method != "HEAD") {
          res.set_header("Allow", "GET, HEAD");
          Answer(res, 405, "only GET and HEAD are served here\n");
          return httplib::Server::HandlerResponse::Handled;
        }
        if (!require_token) return httplib::Server::HandlerResponse::Unhandled;
        std::optional<std::string> header;
        if (req.has_header("Authorization")) header = req.get_header_value("Authorization");
        absl::Status allowed = auth->CheckAuthorization(header, Role::kAdmin);
        if (allowed.ok()) return httplib::Server::HandlerResponse::Unhandled;
        if (allowed.code() == absl::StatusCode::kPermissionDenied) {
          Answer(res, 403, absl::StrCat(allowed.message(), "\n"));
        } else {
          res.set_header("WWW-Authenticate", "Bearer");
          Answer(res, 401,
                 absl::StrCat(allowed.message(),
                              " (send \"Authorization: Bearer ADMIN_TOKEN\" with each request)\n"));
        }
        return httplib::Server::HandlerResponse::Handled;
      });
}

// The routes, and a 500 (details in the log) for a handler that throws.
void Route(httplib::Server& server, std::vector<HttpRoute> routes) {
  server.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr error) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        LOG(ERROR) << "HTTP " << req.path << ": " << what;
        Answer(res, 500, "internal error; the coordinator's log has the details\n");
      });
  auto shared_routes = std::make_shared<const std::vector<HttpRoute>>(std::move(routes));
  server.Get(".*", [shared_routes](const httplib::Request& req, httplib::Response& res) {
    const HttpRoute* route = FindRoute(*shared_routes, req.path);
    if (route == nullptr) {
      Answer(res, 404, absl::StrCat("no page at ", req.path, "\n"));
      return;
    }
    HttpRequest request;
    request.path = req.path;
    for (const auto& [key, value] : req.params) request.params[key] = value;
    HttpResponse response = route->handler(request);
    res.status = response.status;
    res.set_header("Cache-Control", "no-store");
    res.set_header("X-Content-Type-Options", "nosniff");
    if (!response.location.empty()) res.set_header("Location", response.location);
    res.set_content(std::move(response.body), response.content_type.c_str());
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const Options& options,
                                                              std::vector<HttpRoute> routes) {
  RETURN_IF_ERROR(CheckOptions(options));
  auto server = std::make_unique<httplib::Server>();
  ConfigureConnections(*server, options);
  GuardRequests(*server, options);
  Route(*server, std::move(routes));
  int port = options.port;
  if (port == 0) {
    port = server->bind_to_any_port(options.host);
  } else if (!server->bind_to_port(options.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat("--http_listen ", options.host, ":", options.port,
                                               ": cannot listen (is the port in use?)"));
  }
  auto http = std::unique_ptr<HttpServer>(new HttpServer(std::move(server), port));
  http->listener_ = std::thread([raw = http->server_.get()] { raw->listen_after_bind(); });
  // stop() only ends a server whose listen loop has begun: wait for it, so
  // that Shutdown() right after Start() cannot miss it.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!http->server_->is_running()) {
    if (absl::Now() > deadline) {
      return absl::InternalError("HTTP server: the listening thread did not start within 10 s");
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return http;
}

HttpServer::HttpServer(std::unique_ptr<httplib::Server> server, int port)
    : server_(std::move(server)), port_(port) {}

HttpServer::~HttpServer() { Shutdown(); }

void HttpServer::Shutdown() {
  server_->stop();
  if (listener_.joinable()) listener_.join();
}

}  // namespace chorus
