#include "coordinator/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAdmin[] = "admin-0123456789abcdef";
constexpr char kWorker[] = "worker-0123456789abcdef";

std::vector<HttpRoute> Routes() {
  std::vector<HttpRoute> routes;
  routes.push_back({"/hello", false, [](const HttpRequest& request) {
                      auto it = request.params.find("name");
                      return HttpResponse{
                          200, kPlainText,
                          "hello " + (it != request.params.end() ? it->second : "there")};
                    }});
  routes.push_back({"/jobs/", true, [](const HttpRequest& request) {
                      return HttpResponse{200, kJson, "{\"path\":\"" + request.path + "\"}"};
                    }});
  routes.push_back({"/throws", false, [](const HttpRequest&) -> HttpResponse {
                      throw std::runtime_error("handler bug");
                    }});
  return routes;
}

// Sends `bytes` on a new connection to 127.0.0.1:port and returns what comes
// back before the server closes it (at most 5 s).
std::string RawExchange(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "socket failed";
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string got;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    char buffer[4096];
    for (int reads = 0; reads < 64; ++reads) {
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      got.append(buffer, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return got;
}

httplib::Client Client(const HttpServer& server) {
  httplib::Client client("127.0.0.1", server.port());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  return client;
}

TEST(HttpServerTest, RoutesExactAndPrefixPathsAndAnswers404Otherwise) {
  auto server = HttpServer::Start({}, Routes());
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  httplib::Client client = Client(**server);

  auto hello = client.Get("/hello?name=ranks");
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->status, 200);
  EXPECT_EQ(hello->body, "hello ranks");
  EXPECT_EQ(hello->get_header_value("Cache-Control"), "no-store");

  auto job = client.Get("/jobs/job-000001");
  ASSERT_TRUE(job);
  EXPECT_EQ(job->status, 200);
  EXPECT_EQ(job->body, "{\"path\":\"/jobs/job-000001\"}");
  EXPECT_EQ(job->get_header_value("Content-Type"), "application/json");

  auto missing = client.Get("/nothing/here");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->body, "no page at /nothing/here\n");
  EXPECT_EQ(client.Get("/hello/more")->status, 404) << "an exact route is not a prefix";
}

TEST(HttpServerTest, ServesOnlyReadsAndSurvivesBadRequestsAndThrowingHandlers) {
  HttpServer::Options options;
  options.max_request_bytes = 1024;
  auto server = HttpServer::Start(options, Routes());
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client = Client(**server);

  auto post = client.Post("/hello", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->get_header_value("Allow"), "GET, HEAD");

  // Not HTTP at all, and a request line past the library's 8 KB limit.
  EXPECT_THAT(RawExchange((*server)->port(), "GARBAGE\r\n\r\n"), HasSubstr("400"));
  EXPECT_THAT(
      RawExchange((*server)->port(), "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n"),
      Not(HasSubstr("200 OK")));

  auto thrown = client.Get("/throws");
  ASSERT_TRUE(thrown);
  EXPECT_EQ(thrown->status, 500);
  EXPECT_THAT(thrown->body, HasSubstr("internal error"));

  httplib::Headers long_header = {{"X-Junk", std::string(16 << 10, 'y')}};
  auto junk = client.Get("/hello", long_header);
  EXPECT_TRUE(!junk || junk->status == 400) << "an oversized header is refused or dropped";

  // Still serving after all of that.
  auto hello = Client(**server).Get("/hello");
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->status, 200);
}

TEST(HttpServerTest, WithTokensRequiredOnlyAnAdminTokenGetsIn) {
  auto auth = TokenAuthorizer::FromText(
      std::string("admin ") + kAdmin + "\nworker " + kWorker + "\n", "tokens");
  ASSERT_TRUE(auth.ok()) << auth.status();
  HttpServer::Options options;
  options.require_token = true;
  options.auth = &*auth;
  auto server = HttpServer::Start(options, Routes());
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client = Client(**server);

  auto none = client.Get("/hello");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_THAT(none->body, HasSubstr("Authorization: Bearer ADMIN_TOKEN"));
  EXPECT_EQ(none->get_header_value("WWW-Authenticate"), "Bearer");

  auto wrong = client.Get("/hello", {{"Authorization", "Bearer not-a-token-of-this-one"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  EXPECT_THAT(wrong->body, Not(HasSubstr("not-a-token"))) << "tokens are never echoed";

  auto worker = client.Get("/hello", {{"Authorization", std::string("Bearer ") + kWorker}});
  ASSERT_TRUE(worker);
  EXPECT_EQ(worker->status, 403);

  auto admin = client.Get("/hello", {{"Authorization", std::string("Bearer ") + kAdmin}});
  ASSERT_TRUE(admin);
  EXPECT_EQ(admin->status, 200);
  EXPECT_EQ(admin->body, "hello there");

  auto missing = client.Get("/nothing", {{"Authorization", std::string("Bearer ") + kAdmin}});
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  auto probe = client.Get("/nothing");
  ASSERT_TRUE(probe);
  EXPECT_EQ(probe->status, 401) << "without a token not even which pages exist is told";
}

// The "chorus_session=..." part of a login answer's Set-Cookie, or "".
std::string SessionCookie(const httplib::Result& login) {
  const std::string set = login->get_header_value("Set-Cookie");
  return set.substr(0, set.find(';'));
}

TEST(HttpServerTest, ABrowserLogsInOnceAndItsSessionCookieLetsItIn) {
  auto auth = TokenAuthorizer::FromText(
      std::string("admin ") + kAdmin + "\nworker " + kWorker + "\n", "tokens");
  ASSERT_TRUE(auth.ok()) << auth.status();
  HttpServer::Options options;
  options.require_token = true;
  options.auth = &*auth;
  auto server = HttpServer::Start(options, Routes());
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client = Client(**server);

  auto login = client.Get(std::string("/login?token=") + kAdmin);
  ASSERT_TRUE(login);
  EXPECT_EQ(login->status, 303);
  EXPECT_EQ(login->get_header_value("Location"), "/");
  EXPECT_EQ(login->get_header_value("Referrer-Policy"), "no-referrer");
  const std::string set = login->get_header_value("Set-Cookie");
  EXPECT_THAT(set, HasSubstr("; HttpOnly"));
  EXPECT_THAT(set, HasSubstr("; SameSite=Strict"));
  EXPECT_THAT(set, HasSubstr("; Path=/"));
  const std::string cookie = SessionCookie(login);
  ASSERT_THAT(cookie, testing::StartsWith("chorus_session="));
  EXPECT_EQ(cookie.size(), std::string("chorus_session=").size() + 64);
  EXPECT_THAT(set, Not(HasSubstr(kAdmin))) << "the cookie is not the token";

  auto with_cookie = client.Get("/hello", {{"Cookie", "theme=dark; " + cookie}});
  ASSERT_TRUE(with_cookie);
  EXPECT_EQ(with_cookie->status, 200);
  EXPECT_EQ(with_cookie->body, "hello there");

  auto without = client.Get("/hello");
  ASSERT_TRUE(without);
  EXPECT_EQ(without->status, 401);
  EXPECT_THAT(without->body, HasSubstr("/login?token=ADMIN_TOKEN"));
  auto made_up = client.Get("/hello", {{"Cookie", std::string("chorus_session=") + kAdmin}});
  ASSERT_TRUE(made_up);
  EXPECT_EQ(made_up->status, 401) << "the token itself is not a session";

  auto wrong = client.Get("/login?token=not-a-token-of-this-one");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  EXPECT_FALSE(wrong->has_header("Set-Cookie"));
  EXPECT_THAT(wrong->body, Not(HasSubstr("not-a-token"))) << "tokens are never echoed";
  auto no_token = client.Get("/login");
  ASSERT_TRUE(no_token);
  EXPECT_EQ(no_token->status, 401);
  auto worker = client.Get(std::string("/login?token=") + kWorker);
  ASSERT_TRUE(worker);
  EXPECT_EQ(worker->status, 403);
  EXPECT_FALSE(worker->has_header("Set-Cookie"));
}

TEST(HttpServerTest, SessionsBeyondTheLimitEndTheOldest) {
  auto auth = TokenAuthorizer::FromText(std::string("admin ") + kAdmin + "\n", "tokens");
  ASSERT_TRUE(auth.ok()) << auth.status();
  HttpServer::Options options;
  options.require_token = true;
  options.auth = &*auth;
  options.max_sessions = 1;
  auto server = HttpServer::Start(options, Routes());
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client = Client(**server);
  auto first = client.Get(std::string("/login?token=") + kAdmin);
  auto second = client.Get(std::string("/login?token=") + kAdmin);
  ASSERT_TRUE(first && second);
  ASSERT_NE(SessionCookie(first), SessionCookie(second)) << "each login opens its own session";
  auto old = client.Get("/hello", {{"Cookie", SessionCookie(first)}});
  auto current = client.Get("/hello", {{"Cookie", SessionCookie(second)}});
  ASSERT_TRUE(old && current);
  EXPECT_EQ(old->status, 401);
  EXPECT_EQ(current->status, 200);
}

TEST(HttpServerTest, RefusesTokensRequiredWithoutTokensAndAPortInUse) {
  HttpServer::Options options;
  options.require_token = true;
  TokenAuthorizer none;
  options.auth = &none;
  auto refused = HttpServer::Start(options, Routes());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("--token_file"));

  auto first = HttpServer::Start({}, Routes());
  ASSERT_TRUE(first.ok()) << first.status();
  HttpServer::Options same;
  same.port = (*first)->port();
  auto second = HttpServer::Start(same, Routes());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("in use"));
}

TEST(HttpServerTest, ShutdownRightAfterStartEndsPromptlyAndTwiceIsFine) {
  for (int i = 0; i < 20; ++i) {
    auto server = HttpServer::Start({}, Routes());
    ASSERT_TRUE(server.ok()) << server.status();
    (*server)->Shutdown();
    (*server)->Shutdown();
  }
}

}  // namespace
}  // namespace chorus
