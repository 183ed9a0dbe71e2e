// MakeCoordinatorChannel over a list of coordinators (Note [Following the
// leader] in common/grpc_util.cc): two in-process servers with the
// coordinator's health service; calls go only to the one whose health
// service says SERVING for kLeaderHealthService, and follow it when it moves.
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "coordinator/service/health_service.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// A server whose health service also reports SERVING for its own `name`, so
// a Check of that name tells which server answered.
struct NamedServer {
  // On `listen_port`, by default a free one.
  explicit NamedServer(const std::string& server_name, int listen_port = 0) : name(server_name) {
    health.SetStatus("", HealthCheckResponse::SERVING);
    health.SetStatus(name, HealthCheckResponse::SERVING);
    health.SetStatus(kLeaderHealthService, HealthCheckResponse::NOT_SERVING);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", listen_port),
                             grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&health);
    server = builder.BuildAndStart();
  }
  ~NamedServer() { Stop(); }
  // As a coordinator's server stops: health first, then the server.
  void Stop() {
    if (server == nullptr) return;
    health.Shutdown();
    server->Shutdown(absl::ToChronoTime(absl::Now()));
    server->Wait();
    server.reset();
  }
  void Lead(bool leads) {
    health.SetStatus(kLeaderHealthService,
                     leads ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING);
  }

  std::string name;
  HealthService health;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

// Which of `a` and `b` answered one call on `channel` ("" if the call failed).
std::string WhoAnswers(grpc::health::v1::Health::Stub& stub, const NamedServer& a,
                       const NamedServer& b, absl::Duration deadline, bool wait_for_ready,
                       grpc::Status* status = nullptr) {
  for (const NamedServer* s : {&a, &b}) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    context.set_wait_for_ready(wait_for_ready);
    HealthCheckRequest request;
    request.set_service(s->name);
    HealthCheckResponse response;
    grpc::Status result = stub.Check(&context, request, &response);
    if (status != nullptr) *status = result;
    if (!result.ok() && result.error_code() != grpc::StatusCode::NOT_FOUND) return "";
    if (result.ok()) return s->name;
  }
  return "";
}

// Waits up to `limit` for calls to land on `name`; how long that took.
// `wait_for_ready` false retries as the agent does: calls that fail at once
// while no coordinator is ready, 0.2 s apart.
absl::Duration TimeUntilAnswering(grpc::health::v1::Health::Stub& stub, const NamedServer& a,
                                  const NamedServer& b, const std::string& name,
                                  absl::Duration limit, bool wait_for_ready = true) {
  const absl::Time start = absl::Now();
  for (int i = 0; i < 200 && absl::Now() - start < limit; ++i) {
    if (WhoAnswers(stub, a, b, absl::Milliseconds(500), wait_for_ready) == name) {
      return absl::Now() - start;
    }
    absl::SleepFor(absl::Milliseconds(wait_for_ready ? 20 : 200));
  }
  return absl::InfiniteDuration();
}

TEST(LeaderChannelTest, CallsGoOnlyToTheLeaderAndFollowItWhenItMoves) {
  NamedServer a("server-a");
  NamedServer b("server-b");
  ASSERT_NE(a.port, 0);
  ASSERT_NE(b.port, 0);
  a.Lead(true);
  const std::string list = absl::StrCat("127.0.0.1:", a.port, ",localhost:", b.port);
  auto stub = grpc::health::v1::Health::NewStub(MakeCoordinatorChannel(list));

  ASSERT_LT(TimeUntilAnswering(*stub, a, b, "server-a", absl::Seconds(5)), absl::Seconds(5));
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(WhoAnswers(*stub, a, b, absl::Seconds(2), true), "server-a") << "call " << i;
  }

  // Leadership moves: calls follow within ~1-2 s and stay.
  a.Lead(false);
  b.Lead(true);
  const absl::Duration moved = TimeUntilAnswering(*stub, a, b, "server-b", absl::Seconds(5));
  EXPECT_LT(moved, absl::Seconds(2));
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(WhoAnswers(*stub, a, b, absl::Seconds(2), true), "server-b") << "call " << i;
  }
}

// A failover as chorus-coordinator does it: the leader dies; the follower
// stops its follower server and starts the full one on the same port. A
// channel that was connected to the follower finds the new server.
TEST(LeaderChannelTest, AFollowerThatRestartsAsLeaderOnItsPortIsFound) {
  auto a = std::make_unique<NamedServer>("server-a");
  auto b = std::make_unique<NamedServer>("server-b");
  a->Lead(true);
  const int b_port = b->port;
  const std::string list = absl::StrCat("127.0.0.1:", a->port, ",127.0.0.1:", b_port);
  auto stub = grpc::health::v1::Health::NewStub(MakeCoordinatorChannel(list));
  ASSERT_LT(TimeUntilAnswering(*stub, *a, *b, "server-a", absl::Seconds(5)), absl::Seconds(5));

  a->Stop();
  b->Stop();
  absl::SleepFor(absl::Milliseconds(300));
  NamedServer b_leader("server-b", b_port);
  ASSERT_EQ(b_leader.port, b_port);
  b_leader.Lead(true);
  // Calls that fail at once and are retried, as the agent's are. (In this
  // process the servers' own threads poll the connections too, so this does
  // not show Note [Driving a list channel] in common/grpc_util.cc:
  // tests/failover_e2e_test.sh's agent does.)
  const absl::Duration moved =
      TimeUntilAnswering(*stub, *a, b_leader, "server-b", absl::Seconds(10), false);
  EXPECT_LT(moved, absl::Seconds(4));
}

TEST(LeaderChannelTest, WithoutALeaderCallsFailOrWaitUntilOneIsElected) {
  NamedServer a("server-a");
  NamedServer b("server-b");
  const std::string list = absl::StrCat("127.0.0.1:", a.port, ",127.0.0.1:", b.port);
  auto stub = grpc::health::v1::Health::NewStub(MakeCoordinatorChannel(list));

  // No coordinator leads: a wait_for_ready call waits out its deadline
  // instead of landing on a follower.
  grpc::Status status;
  EXPECT_EQ(WhoAnswers(*stub, a, b, absl::Milliseconds(500), true, &status), "");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();

  // A leader elected while a call waits: the call lands on it.
  std::thread elect([&] {
    absl::SleepFor(absl::Milliseconds(300));
    b.Lead(true);
  });
  EXPECT_EQ(WhoAnswers(*stub, a, b, absl::Seconds(5), true), "server-b");
  elect.join();
}

TEST(LeaderChannelTest, ListTargetsResolveNamesOnceAndNameBadEntries) {
  absl::StatusOr<std::string> target = CoordinatorListTarget("127.0.0.1:1,localhost:2");
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(*target, "ipv4:127.0.0.1:1,127.0.0.1:2");
  absl::StatusOr<std::string> v6 = CoordinatorListTarget("[::1]:1,[::1]:2");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(*v6, "ipv6:[::1]:1,[::1]:2");
  absl::StatusOr<std::string> mixed = CoordinatorListTarget("127.0.0.1:1,[::1]:2");
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kUnavailable);
  absl::StatusOr<std::string> bad = CoordinatorListTarget("127.0.0.1:1,:2");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("entry 2"), std::string::npos) << bad.status();
  absl::StatusOr<std::string> unknown = CoordinatorListTarget("127.0.0.1:1,no-such-host.invalid:2");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(unknown.status().message().find("no-such-host.invalid"), std::string::npos);
}

}  // namespace
}  // namespace chorus
