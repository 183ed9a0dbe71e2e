#include "coordinator/service/server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "chorus/v1/coordinator.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return std::string(base ? base : "/tmp") + "/" + name;
}

// A token file as an operator writes one: readable by its owner only.
std::string TokenFile(const std::string& name) {
  const std::string path = TempDir(name);
  std::ofstream(path) << "admin admin-token-0123456789\nworker worker-token-0123456789\n";
  EXPECT_EQ(::chmod(path.c_str(), 0600), 0);
  return path;
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

grpc::health::v1::HealthCheckResponse::ServingStatus Ping(const std::string& address,
                                                          grpc::Status* status) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  *status = stub->Check(&context, request, &response);
  return response.status();
}

// A node agent without a coordinator stops its ranks after its reconnect
// window (AgentOptions::reconnect_window in worker/agent/agent.h, 60 s).
// An agent cut off for good must be noticed (its connection's keepalive)
// and its reconnect grace be over well before that, so that its jobs end
// as the grace says ("lost contact with the agent ...") and not by the
// agent stopping ranks; tests/netns_agent_cut_e2e_test.sh cuts one.
TEST(CoordinatorServerTest, ASilentAgentIsLostAndItsGraceOverWellWithinItsReconnectWindow) {
  constexpr absl::Duration kAgentReconnectWindow = absl::Seconds(60);
  EXPECT_LE(kKeepaliveTime + kKeepaliveTimeout + ServerOptions().agent_reconnect_grace,
            kAgentReconnectWindow / 2);
}

TEST(CoordinatorServerTest, ServesHealthOnAnEphemeralPort) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = TempDir("health");
  auto server = CoordinatorServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string((*server)->port()));

  grpc::Status status;
  EXPECT_EQ(Ping((*server)->address(), &status), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_TRUE(status.ok()) << status.error_message();

  (*server)->Shutdown(absl::Seconds(1));
  (*server)->Wait();
  Ping((*server)->address(), &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(CoordinatorServerTest, StateDirIsExclusive) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = TempDir("exclusive");
  auto first = CoordinatorServer::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = CoordinatorServer::Start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("in use by another coordinator (pid "));
  first->reset();  // releases the lock
  auto third = CoordinatorServer::Start(options);
  EXPECT_TRUE(third.ok()) << third.status();
}

TEST(CoordinatorServerTest, RefusesNonLoopbackAndBadAddresses) {
  ServerOptions options;
  options.state_dir = TempDir("refuse");
  options.listen = "0.0.0.0:0";
  auto open = CoordinatorServer::Start(options);
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(open.status().message(), HasSubstr("Pass --token_file FILE"));

  // With tokens, listening on every interface is allowed (only loopback
  // traffic is sent here).
  options.token_file = TokenFile("tokens");
  options.state_dir = TempDir("open_with_tokens");
  auto guarded = CoordinatorServer::Start(options);
  ASSERT_TRUE(guarded.ok()) << guarded.status();
  EXPECT_GT((*guarded)->port(), 0);
  grpc::Status status;
  EXPECT_EQ(Ping("127.0.0.1:" + std::to_string((*guarded)->port()), &status),
            grpc::health::v1::HealthCheckResponse::SERVING)
      << "the health service needs no token";
  (*guarded)->Shutdown(absl::ZeroDuration());
  (*guarded)->Wait();
  options.token_file = "/nonexistent/tokens";
  EXPECT_EQ(CoordinatorServer::Start(options).status().code(), absl::StatusCode::kNotFound);
  options.token_file.clear();
  options.state_dir = TempDir("refuse");

  options.listen = "127.0.0.1";
  auto no_port = CoordinatorServer::Start(options);
  ASSERT_FALSE(no_port.ok());
  EXPECT_THAT(no_port.status().message(), HasSubstr("expected HOST:PORT"));

  options.listen = "127.0.0.1:99999";
  auto big_port = CoordinatorServer::Start(options);
  ASSERT_FALSE(big_port.ok());
  EXPECT_THAT(big_port.status().message(), HasSubstr("[0, 65535]"));
}

TEST(CoordinatorServerTest, ANegativeAgentReconnectGraceIsRefusedNamingTheFlag) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.agent_reconnect_grace = absl::Seconds(-1);
  const absl::Status refused = ValidateServerOptions(options);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("--agent_reconnect_grace_seconds must be >= 0"));
  EXPECT_THAT(refused.message(), HasSubstr("got -1"));
  options.agent_reconnect_grace = absl::ZeroDuration();  // fail at once: allowed
  EXPECT_TRUE(ValidateServerOptions(options).ok());
}

// The shipped configuration once put the checkpoint data port on 29651, the
// HTTP port's default; the HTTP port then moved to a random one unannounced.
TEST(CoordinatorServerTest, CollidingPortsAreRefusedBeforeTheStateDirIsTouched) {
  ServerOptions options;
  options.listen = "0.0.0.0:29650";
  options.checkpoint_data_port = 29651;
  absl::Status refused = ValidateServerOptions(options);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              HasSubstr("--checkpoint_data_port 29651 is also the HTTP port (--http_listen's "
                        "default, the port after --listen's)"));
  options.http_listen = "127.0.0.1:29700";
  options.checkpoint_data_port = 29700;
  EXPECT_THAT(ValidateServerOptions(options).message(),
              HasSubstr("is also the HTTP port (--http_listen 127.0.0.1:29700)"));
  options.checkpoint_data_port = 29650;
  EXPECT_THAT(ValidateServerOptions(options).message(),
              HasSubstr("--checkpoint_data_port 29650 is also --listen's port"));
  // Free ports (0) never collide, nor does a data port beside "off".
  options.checkpoint_data_port = 29652;
  EXPECT_TRUE(ValidateServerOptions(options).ok());
  options.listen = "127.0.0.1:0";
  options.http_listen = "";
  options.checkpoint_data_port = 0;
  EXPECT_TRUE(ValidateServerOptions(options).ok());
  options.listen = "127.0.0.1:29650";
  options.http_listen = "off";
  options.checkpoint_data_port = 29651;
  EXPECT_TRUE(ValidateServerOptions(options).ok());

  // Start refuses before it creates, locks or recovers the state directory.
  options.http_listen = "";
  options.state_dir = TempDir("never_created");
  auto server = CoordinatorServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("is also the HTTP port"));
  EXPECT_NE(access(options.state_dir.c_str(), F_OK), 0) << options.state_dir << " was created";
}

TEST(CoordinatorServerTest, PortInUseIsUnavailable) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = TempDir("busy1");
  auto first = CoordinatorServer::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  options.listen = (*first)->address();
  options.state_dir = TempDir("busy2");
  auto second = CoordinatorServer::Start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("cannot listen"));
}

TEST(CoordinatorServerTest, UnwritableStateDirIsAClearError) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = "/proc/chorus-cannot-exist";
  auto server = CoordinatorServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(server.status().message(), HasSubstr("--state_dir /proc/chorus-cannot-exist"));
}

TEST(CoordinatorServerTest, ServesMetricsOnItsHttpPortByDefault) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = TempDir("metrics");
  auto server = CoordinatorServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->http_port(), 0);
  EXPECT_NE((*server)->http_port(), (*server)->port());
  EXPECT_EQ((*server)->http_url(), "http://127.0.0.1:" + std::to_string((*server)->http_port()));
  grpc::Status status;
  Ping((*server)->address(), &status);
  ASSERT_TRUE(status.ok()) << status.error_message();

  httplib::Client client("127.0.0.1", (*server)->http_port());
  client.set_read_timeout(5);
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->get_header_value("Content-Type"), HasSubstr("version=0.0.4"));
  EXPECT_THAT(metrics->body, HasSubstr("chorus_agents_connected 0\n"));
  EXPECT_THAT(metrics->body, HasSubstr("chorus_jobs{state=\"RUNNING\"} 0\n"));
  EXPECT_THAT(
      metrics->body,
      HasSubstr("chorus_rpcs_total{code=\"OK\",method=\"/grpc.health.v1.Health/Check\"} 1\n"))
      << "every gRPC call is counted by method and code";

  options.http_listen = "off";
  options.state_dir = TempDir("metrics_off");
  auto quiet = CoordinatorServer::Start(options);
  ASSERT_TRUE(quiet.ok()) << quiet.status();
  EXPECT_EQ((*quiet)->http_port(), 0);
  EXPECT_EQ((*quiet)->http_url(), "");
}

TEST(CoordinatorServerTest, ATakenDefaultHttpPortFallsBackToAFreeOneButAnAskedForOneFails) {
  // Something holds a port P+1; a coordinator on P (as after a restart on
  // its old port) still starts, with HTTP elsewhere.
  ServerOptions probe;
  probe.listen = "127.0.0.1:0";
  probe.state_dir = TempDir("http_probe");
  probe.http_listen = "off";
  auto first = CoordinatorServer::Start(probe);
  ASSERT_TRUE(first.ok()) << first.status();
  const int grpc_port = (*first)->port();
  // The holder starts while the probe still holds grpc_port, so that its
  // own ports (drawn from 0) cannot be the one freed next.
  ServerOptions holder;
  holder.listen = "127.0.0.1:0";
  holder.state_dir = TempDir("http_holder");
  holder.http_listen = "127.0.0.1:" + std::to_string(grpc_port + 1);
  auto holding = CoordinatorServer::Start(holder);
  if (!holding.ok()) GTEST_SKIP() << "port " << grpc_port + 1 << " is busy: " << holding.status();
  first->reset();

  ServerOptions options;
  options.listen = "127.0.0.1:" + std::to_string(grpc_port);
  options.state_dir = TempDir("http_fallback");
  auto server = CoordinatorServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->http_port(), 0);
  EXPECT_NE((*server)->http_port(), grpc_port + 1);

  options.state_dir = TempDir("http_taken");
  options.listen = "127.0.0.1:0";
  options.http_listen = "127.0.0.1:" + std::to_string(grpc_port + 1);
  auto refused = CoordinatorServer::Start(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("--http_listen"));
}

TEST(CoordinatorServerTest, AnHttpPortOffLoopbackNeedsTokensAndChecksThem) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = TempDir("http_open");
  options.http_listen = "0.0.0.0:0";
  auto refused = CoordinatorServer::Start(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("--http_listen 0.0.0.0:0"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--token_file"));

  options.http_listen = "nonsense";
  EXPECT_THAT(CoordinatorServer::Start(options).status().message(), HasSubstr("--http_listen"));

  options.token_file = TokenFile("http_tokens");
  options.http_listen = "0.0.0.0:0";
  auto guarded = CoordinatorServer::Start(options);
  ASSERT_TRUE(guarded.ok()) << guarded.status();
  // Only loopback traffic is sent; the port is bound on every interface.
  httplib::Client client("127.0.0.1", (*guarded)->http_port());
  client.set_read_timeout(5);
  auto anonymous = client.Get("/metrics");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);
  auto worker = client.Get("/metrics", {{"Authorization", "Bearer worker-token-0123456789"}});
  ASSERT_TRUE(worker);
  EXPECT_EQ(worker->status, 403);
  auto admin = client.Get("/metrics", {{"Authorization", "Bearer admin-token-0123456789"}});
  ASSERT_TRUE(admin);
  EXPECT_EQ(admin->status, 200);
  EXPECT_THAT(admin->body, HasSubstr("chorus_agents_connected 0\n"));
}

// A coordinator with a token file trusts no address: tokenless calls from
// loopback are refused on gRPC and on the HTTP port alike.
TEST(CoordinatorServerTest, ATokenFileRequiresTokensOnLoopbackToo) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = TempDir("loopback_tokens");
  options.token_file = TokenFile("loopback.tokens");
  auto server = CoordinatorServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto jobs = v1::JobService::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  const auto call = [&](const std::string& token, v1::WhoAmIResponse* me) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    return jobs->WhoAmI(&context, v1::WhoAmIRequest(), me);
  };
  v1::WhoAmIResponse me;
  grpc::Status anonymous = call("", &me);
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(anonymous.error_message(), HasSubstr("requires a token"));
  ASSERT_TRUE(call("admin-token-0123456789", &me).ok());
  EXPECT_EQ(me.user(), "admin") << "an old \"admin TOKEN\" line names its role";
  EXPECT_EQ(me.role(), "admin");
  EXPECT_TRUE(me.tokens_required());

  httplib::Client client("127.0.0.1", (*server)->http_port());
  client.set_read_timeout(5);
  for (const char* path : {"/metrics", "/api/jobs", "/"}) {
    auto page = client.Get(path);
    ASSERT_TRUE(page) << path;
    EXPECT_EQ(page->status, 401) << path << " on loopback without a token";
  }
  auto admin = client.Get("/api/jobs", {{"Authorization", "Bearer admin-token-0123456789"}});
  ASSERT_TRUE(admin);
  EXPECT_EQ(admin->status, 200);
}

// Without a token file (one person on a laptop) loopback stays open, and
// the caller is an anonymous admin.
TEST(CoordinatorServerTest, WithoutATokenFileLoopbackCallersAreAnonymousAdmins) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = TempDir("loopback_open");
  auto server = CoordinatorServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto jobs = v1::JobService::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::WhoAmIResponse me;
  ASSERT_TRUE(jobs->WhoAmI(&context, v1::WhoAmIRequest(), &me).ok());
  EXPECT_EQ(me.user(), "");
  EXPECT_EQ(me.role(), "admin");
  EXPECT_FALSE(me.tokens_required());
  httplib::Client client("127.0.0.1", (*server)->http_port());
  client.set_read_timeout(5);
  auto page = client.Get("/api/jobs");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
}

// Note [Private files]: under a login shell's umask the state would be
// readable by every user of the machine.
TEST(CoordinatorServerTest, StateIsPrivateWhateverTheUmaskAndOpenTokenFilesAreRefused) {
  const mode_t old_umask = ::umask(022);
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = TempDir("private_state");
  std::filesystem::remove_all(options.state_dir);
  options.token_file = TokenFile("private_tokens");
  {
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ(ModeOf(options.state_dir), 0700u);
    for (const char* file :
         {"chorus.db", "chorus.db-wal", "chorus.db-shm", "LOCK", "job_credentials.key"}) {
      const std::string path = options.state_dir + "/" + file;
      if (std::string(file).find("db-") != std::string::npos && !std::filesystem::exists(path)) {
        continue;  // SQLite makes these when it needs them
      }
      EXPECT_EQ(ModeOf(path), 0600u) << file;
    }
    EXPECT_TRUE(std::filesystem::exists(options.state_dir + "/chorus.db-wal"));
    (*server)->Shutdown(absl::ZeroDuration());
    (*server)->Wait();
  }
  // A state directory an older coordinator left open is tightened.
  ASSERT_EQ(::chmod(options.state_dir.c_str(), 0755), 0);
  ASSERT_EQ(::chmod((options.state_dir + "/chorus.db").c_str(), 0644), 0);
  {
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ(ModeOf(options.state_dir), 0700u);
    EXPECT_EQ(ModeOf(options.state_dir + "/chorus.db"), 0600u);
    (*server)->Shutdown(absl::ZeroDuration());
    (*server)->Wait();
  }
  ASSERT_EQ(::chmod(options.token_file.c_str(), 0644), 0);
  auto open_tokens = CoordinatorServer::Start(options);
  EXPECT_EQ(open_tokens.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(open_tokens.status().message(), "--token_file " + options.token_file +
                                                " is readable by others (mode 0644); chmod 600 " +
                                                options.token_file);
  ::umask(old_umask);
}

TEST(IsLoopbackHostTest, KnowsLoopbackAddresses) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.2"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
}

}  // namespace
}  // namespace chorus

namespace chorus {
namespace {

TEST(CoordinatorServerTest, HealthWatchStreamsUntilShutdown) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = TempDir("watch");
  auto server = CoordinatorServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();

  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckRequest request;
  auto reader = stub->Watch(&context, request);
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  absl::Time start = absl::Now();
  (*server)->Shutdown(absl::Seconds(5));
  // The stream ends promptly instead of holding shutdown for the whole grace period.
  while (reader->Read(&response)) {
  }
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

TEST(CoordinatorServerTest, UnknownHealthServiceIsNotFound) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = TempDir("unknown");
  auto server = CoordinatorServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("chorus.v1.NoSuchService");
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
}

// Asks the server-reflection service to list services, with raw protobuf
// bytes (ServerReflectionRequest.list_services is field 7). Returns the raw
// response, or the call's status when it fails.
absl::StatusOr<std::string> ListServicesByReflection(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto wait = [&cq](intptr_t want) {
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
      if (reinterpret_cast<intptr_t>(tag) == want) return ok;
    }
    return false;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  bool ok = wait(1);
  const char request[] = {0x3a, 0x00};
  grpc::Slice slice(request, sizeof(request));
  grpc::ByteBuffer out(&slice, 1);
  if (ok) {
    call->Write(out, reinterpret_cast<void*>(2));
    ok = wait(2);
  }
  grpc::ByteBuffer in;
  std::string response;
  if (ok) {
    call->Read(&in, reinterpret_cast<void*>(3));
    if (wait(3)) {
      std::vector<grpc::Slice> slices;
      (void)in.Dump(&slices);
      for (const grpc::Slice& piece : slices)
        response.append(reinterpret_cast<const char*>(piece.begin()), piece.size());
    }
  }
  call->WritesDone(reinterpret_cast<void*>(4));
  wait(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  wait(5);
  cq.Shutdown();
  void* tag;
  bool drained;
  while (cq.Next(&tag, &drained)) {
  }
  if (!response.empty()) return response;
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

TEST(CoordinatorServerTest, ReflectionOnlyWhenAskedFor) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = TempDir("no_reflection");
  auto plain = CoordinatorServer::Start(options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<std::string> off = ListServicesByReflection((*plain)->address());
  EXPECT_EQ(off.status().code(), absl::StatusCode::kUnimplemented)
      << "reflection is off by default";
  (*plain)->Shutdown(absl::ZeroDuration());
  (*plain)->Wait();

  options.state_dir = TempDir("reflection");
  options.enable_reflection = true;
  auto reflective = CoordinatorServer::Start(options);
  ASSERT_TRUE(reflective.ok()) << reflective.status();
  absl::StatusOr<std::string> on = ListServicesByReflection((*reflective)->address());
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_THAT(*on, HasSubstr("chorus.v1.JobService"));
  EXPECT_THAT(*on, HasSubstr("chorus.v1.CheckpointService"));
  (*reflective)->Shutdown(absl::ZeroDuration());
  (*reflective)->Wait();
}

}  // namespace
}  // namespace chorus
