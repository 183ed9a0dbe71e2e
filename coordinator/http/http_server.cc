#include "coordinator/http/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
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

// Note [Browser login]
// A browser cannot add "Authorization: Bearer ADMIN_TOKEN" to the requests
// of a page it opens, so with a token file the status page would be out of
// its reach. GET /login?token=ADMIN_TOKEN (the URL `chorus up` prints)
// checks the token like a bearer token; if it is an admin token, it opens a
// session: a fresh random secret (NewToken: 256 bits from getrandom, not
// the token and not derived from it) is kept here, and the answer is a 303
// to "/" that sets it as the cookie chorus_session, HttpOnly (page scripts
// cannot read it), SameSite=Strict (another site's page cannot make the
// browser send it) and Path=/, for Options::session_lifetime. Later
// requests carrying a live session's cookie pass as the admin. Sessions live
// in memory only: a restarted coordinator has none, and the user opens the
// login URL again. The token travels once, in the query; nothing logs
// queries or cookies (a failing handler's log line names only the path), the
// redirect carries "Referrer-Policy: no-referrer", and answers are not
// cached. A wrong or missing token is 401, a worker token 403, as for the
// header.
class Sessions {
 public:
  Sessions(absl::Duration lifetime, int max) : lifetime_(lifetime), max_(max) {}

  // A new session's secret, live until now + lifetime.
  absl::StatusOr<std::string> Open(absl::Time now) {
    ASSIGN_OR_RETURN(std::string secret, NewToken());
    absl::MutexLock lock(&mu_);
    DropExpiredLocked(now);
    if (!expiry_.empty() && static_cast<int>(expiry_.size()) >= max_) {
      auto first =
          std::min_element(expiry_.begin(), expiry_.end(),
                           [](const auto& a, const auto& b) { return a.second < b.second; });
      expiry_.erase(first);
    }
    expiry_.emplace_back(secret, now + lifetime_);
    return secret;
  }

  // Whether `secret` is a live session's, compared in constant time.
  bool Live(absl::string_view secret, absl::Time now) {
    absl::MutexLock lock(&mu_);
    DropExpiredLocked(now);
    bool found = false;
    for (const auto& [kept, expiry] : expiry_) found |= SameSecret(kept, secret);
    return found;
  }

 private:
  static bool SameSecret(absl::string_view a, absl::string_view b) {
    if (a.size() != b.size()) return false;
    unsigned char differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ |= static_cast<unsigned char>(a[i] ^ b[i]);
    return differ == 0;
  }
  void DropExpiredLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    expiry_.erase(std::remove_if(expiry_.begin(), expiry_.end(),
                                 [now](const auto& s) { return s.second <= now; }),
                  expiry_.end());
  }

  const absl::Duration lifetime_;
  const int max_;
  absl::Mutex mu_;
  std::vector<std::pair<std::string, absl::Time>> expiry_ ABSL_GUARDED_BY(mu_);
};

// The value of cookie `name` in a Cookie header ("a=1; b=2"); empty if absent.
std::string CookieValue(const std::string& header, absl::string_view name) {
  for (absl::string_view part : absl::StrSplit(header, ';')) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::ConsumePrefix(&part, name) && absl::ConsumePrefix(&part, "=")) {
      return std::string(part);
    }
  }
  return "";
}

// Answers /login (Note [Browser login]).
void Login(const httplib::Request& req, httplib::Response& res, const TokenAuthorizer* auth,
           Sessions& sessions, absl::Duration lifetime) {
  res.set_header("Cache-Control", "no-store");
  res.set_header("Referrer-Policy", "no-referrer");
  std::optional<std::string> bearer;
  if (req.has_param("token")) bearer = absl::StrCat("Bearer ", req.get_param_value("token"));
  absl::Status allowed = auth->CheckAuthorization(bearer, Role::kAdmin);
  if (!allowed.ok()) {
    Answer(res, allowed.code() == absl::StatusCode::kPermissionDenied ? 403 : 401,
           absl::StrCat("login: ", allowed.message(),
                        " (open /login?token=ADMIN_TOKEN with an admin token of the "
                        "coordinator's --token_file)\n"));
    return;
  }
  absl::StatusOr<std::string> secret = sessions.Open(absl::Now());
  if (!secret.ok()) {
    Answer(res, 500, absl::StrCat("login: ", secret.status().message(), "\n"));
    return;
  }
  res.set_header("Set-Cookie", absl::StrCat(kSessionCookie, "=", *secret,
                                            "; Path=/; HttpOnly; SameSite=Strict; Max-Age=",
                                            absl::ToInt64Seconds(lifetime)));
  res.set_redirect("/", 303);
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

// Before any route: only GET and HEAD, /login, and the admin token (or a
// session's cookie) when required.
void GuardRequests(httplib::Server& server, const HttpServer::Options& options) {
  const bool require_token = options.require_token;
  const TokenAuthorizer* auth = options.auth;
  const absl::Duration lifetime = options.session_lifetime;
  auto sessions = std::make_shared<Sessions>(lifetime, options.max_sessions);
  server.set_pre_routing_handler([require_token, auth, lifetime, sessions](
                                     const httplib::Request& req, httplib::Response& res) {
    if (req.method != "GET" && req.method != "HEAD") {
      res.set_header("Allow", "GET, HEAD");
      Answer(res, 405, "only GET and HEAD are served here\n");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!require_token) return httplib::Server::HandlerResponse::Unhandled;
    if (req.path == "/login") {
      Login(req, res, auth, *sessions, lifetime);
      return httplib::Server::HandlerResponse::Handled;
    }
    std::optional<std::string> header;
    if (req.has_header("Authorization")) {
      header = req.get_header_value("Authorization");
    } else if (req.has_header("Cookie")) {
      const std::string secret = CookieValue(req.get_header_value("Cookie"), kSessionCookie);
      if (!secret.empty() && sessions->Live(secret, absl::Now())) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
    }
    absl::Status allowed = auth->CheckAuthorization(header, Role::kAdmin);
    if (allowed.ok()) return httplib::Server::HandlerResponse::Unhandled;
    if (allowed.code() == absl::StatusCode::kPermissionDenied) {
      Answer(res, 403, absl::StrCat(allowed.message(), "\n"));
    } else {
      res.set_header("WWW-Authenticate", "Bearer");
      Answer(res, 401,
             absl::StrCat(allowed.message(),
                          " (send \"Authorization: Bearer ADMIN_TOKEN\" with each request, or "
                          "open /login?token=ADMIN_TOKEN once in a browser)\n"));
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
