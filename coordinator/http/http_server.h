// HttpServer: the coordinator's HTTP port (--http_listen) — Prometheus
// metrics, the status page and its JSON — on cpp-httplib.
//
// Bounded by construction: a fixed pool of worker threads serves
// connections; a request line and headers are limited by the library
// (8 KB each), a body by Options::max_request_bytes; every read and write
// of a connection times out after Options::io_timeout; a keep-alive
// connection serves at most Options::max_requests_per_connection requests.
// Only GET (and HEAD) is served: the port changes nothing. A handler that
// throws answers 500 and the server goes on.
//
// Authorization: when Options::require_token is set every request must
// carry "Authorization: Bearer TOKEN" with an admin token of Options::auth
// (the coordinator sets it whenever it has a token file, and requires one
// for a non-loopback address, as on gRPC), or the session cookie a browser
// got from /login (Note [Browser login] in http_server.cc); otherwise 401
// (no or unknown token or session) or 403 (a worker token).
//
// Thread-safety: handlers run on the pool's threads, several at once; they
// must be thread-safe. Shutdown() may be called from any thread, more than
// once; the destructor calls it and joins every thread.
//
// Example:
//   HttpServer::Options options;
//   options.host = "127.0.0.1";
//   ASSIGN_OR_RETURN(auto http, HttpServer::Start(options, {
//       {"/metrics", false, [&](const HttpRequest&) { return HttpResponse{200, kText, text}; }}}));
//   LOG(INFO) << "http port " << http->port();
#ifndef CHORUS_COORDINATOR_HTTP_HTTP_SERVER_H_
#define CHORUS_COORDINATOR_HTTP_HTTP_SERVER_H_

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"

namespace httplib {
class Server;
}

namespace chorus {

inline constexpr char kPlainText[] = "text/plain; charset=utf-8";
inline constexpr char kJson[] = "application/json";
inline constexpr char kHtml[] = "text/html; charset=utf-8";
// The cookie of a browser session (Note [Browser login] in http_server.cc).
inline constexpr char kSessionCookie[] = "chorus_session";

struct HttpRequest {
  std::string path;
  // Query parameters (the last value of a repeated one).
  std::map<std::string, std::string> params;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = kPlainText;
  std::string body;
  // Sent as the Location header when not empty (redirects).
  std::string location;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpRoute {
  // An exact path ("/metrics"), or a prefix when `prefix` ("/jobs/": the
  // handler gets every path under it).
  std::string path;
  bool prefix = false;
  HttpHandler handler;
};

class HttpServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    // 0 picks a free port.
    int port = 0;
    // Every request needs an admin bearer token of `auth`.
    // REQUIRES: auth != nullptr && auth->enabled() when set.
    bool require_token = false;
    const TokenAuthorizer* auth = nullptr;
    // Worker threads serving connections.
    int threads = 4;
    // Each read or write of a connection.
    absl::Duration io_timeout = absl::Seconds(5);
    // Largest request body (GET requests carry none).
    size_t max_request_bytes = 64 << 10;
    // Requests one keep-alive connection may make before it is closed.
    int max_requests_per_connection = 100;
    // Browser sessions opened by /login: how long each lasts, and how many
    // are kept (a new one beyond that ends the one that expires first).
    absl::Duration session_lifetime = absl::Hours(12);
    int max_sessions = 64;
  };

  // Binds host:port and starts serving `routes` (a path not routed is 404).
  // INVALID_ARGUMENT for bad options, UNAVAILABLE if the port cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const Options& options,
                                                           std::vector<HttpRoute> routes);

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  ~HttpServer();

  int port() const { return port_; }
  // Stops accepting and waits for the listening thread; connections being
  // served finish (each bounded by io_timeout).
  void Shutdown();

 private:
  HttpServer(std::unique_ptr<httplib::Server> server, int port);

  std::unique_ptr<httplib::Server> server_;
  int port_;
  std::thread listener_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_HTTP_HTTP_SERVER_H_
