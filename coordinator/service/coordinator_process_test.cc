// A coordinator process between leading and following (LeaderLoop with the
// full CoordinatorServer and the FollowerServer), driven by a Leadership
// the test makes win and lose.
#include "coordinator/service/coordinator_process.h"

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/grpc_util.h"
#include "coordinator/service/follower_server.h"
#include "coordinator/state/fake_leadership.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
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

// One ListJobs call on a fresh channel to 127.0.0.1:port; `leader_metadata`
// and `no_leader_metadata` (if set) get the trailing metadata of those keys.
grpc::Status ListJobs(int port, std::string* leader_metadata = nullptr,
                      std::string* no_leader_metadata = nullptr) {
  auto stub = v1::JobService::NewStub(MakeCoordinatorChannel(absl::StrCat("127.0.0.1:", port)));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
  context.set_wait_for_ready(true);
  v1::ListJobsRequest request;
  v1::ListJobsResponse response;
  grpc::Status status = stub->ListJobs(&context, request, &response);
  const auto& trailers = context.GetServerTrailingMetadata();
  auto value_of = [&trailers](const char* key) {
    auto found = trailers.find(key);
    return found == trailers.end() ? std::string()
                                   : std::string(found->second.data(), found->second.size());
  };
  if (leader_metadata != nullptr) *leader_metadata = value_of(kLeaderMetadataKey);
  if (no_leader_metadata != nullptr) *no_leader_metadata = value_of(kNoLeaderMetadataKey);
  return status;
}

// The health service's status of `service` at 127.0.0.1:port.
grpc::health::v1::HealthCheckResponse::ServingStatus Health(int port,
                                                            const std::string& service = "") {
  auto stub =
      grpc::health::v1::Health::NewStub(MakeCoordinatorChannel(absl::StrCat("127.0.0.1:", port)));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  if (!stub->Check(&context, request, &response).ok()) {
    return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  }
  return response.status();
}

// Waits (bounded) until `done`.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 100; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

TEST(CoordinatorProcessTest, FollowsLeadsLosesAndLeadsAgainOnTheSamePorts) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = TempDir("follow_lead_lose");
  options.checkpoint_data_port = -1;
  FakeLeadership leadership;
  leadership.SetOtherLeader(LeaderInfo{"b", "10.0.0.2:29650", "http://10.0.0.2:29651", {}});
  absl::Mutex mu;
  std::optional<LeaderLoop::Ports> ports;
  CoordinatorProcess process(options, leadership, /*follow=*/true,
                             [&](const LeaderLoop::Ports& bound) {
                               absl::MutexLock lock(&mu);
                               ports = bound;
                             });
  absl::Status ran = absl::UnknownError("not run");
  std::thread loop([&] { ran = process.Run(); });
  auto bound = [&] {
    absl::MutexLock lock(&mu);
    return ports;
  };
  ASSERT_TRUE(Eventually([&] { return bound().has_value(); }));
  const int port = bound()->grpc;
  const int http_port = bound()->http;
  ASSERT_NE(port, 0);
  ASSERT_NE(http_port, 0);

  // Follower: every call names the leader, in the message and the metadata.
  std::string metadata;
  grpc::Status follower = ListJobs(port, &metadata);
  EXPECT_EQ(follower.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(follower.error_message(), HasSubstr("follower; the leader is 10.0.0.2:29650"));
  EXPECT_THAT(follower.error_message(), HasSubstr("--coordinator a:29650,b:29650"));
  EXPECT_EQ(metadata, "10.0.0.2:29650");
  httplib::Client http("127.0.0.1", http_port);
  auto page = http.Get("/jobs/j1");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 307);
  EXPECT_EQ(page->get_header_value("Location"), "http://10.0.0.2:29651/jobs/j1");
  auto more = http.Get("/jobs/j1?rank_offset=10&rank_limit=5");
  ASSERT_TRUE(more);
  EXPECT_EQ(more->get_header_value("Location"),
            "http://10.0.0.2:29651/jobs/j1?rank_limit=5&rank_offset=10");
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body, HasSubstr("chorus_leader 0\n"));
  EXPECT_FALSE(process.loop().leading());

  // No coordinator can lead (etcd without quorum): every call says why, in
  // the message and the metadata, and names no leader.
  leadership.SetElectionError(absl::UnavailableError(
      "etcd at 127.0.0.1:1: range: unreachable or no quorum (Deadline Exceeded)"));
  std::string no_leader;
  grpc::Status no_quorum = ListJobs(port, &metadata, &no_leader);
  EXPECT_EQ(no_quorum.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(no_quorum.error_message(),
              HasSubstr("no coordinator can lead: etcd at 127.0.0.1:1: range: unreachable or no "
                        "quorum"));
  EXPECT_THAT(no_quorum.error_message(), HasSubstr("submissions and every other change are "
                                                   "refused"));
  EXPECT_EQ(no_leader, no_quorum.error_message());
  EXPECT_EQ(metadata, "");
  // Note [A follower that cannot elect]: `chorus ping` sees it.
  using Serving = grpc::health::v1::HealthCheckResponse;
  EXPECT_TRUE(Eventually([&] { return Health(port) == Serving::NOT_SERVING; }));
  leadership.SetElectionError(absl::OkStatus());
  ASSERT_THAT(ListJobs(port, &metadata, &no_leader).error_message(), HasSubstr("the leader is"));
  EXPECT_EQ(no_leader, "");
  EXPECT_TRUE(Eventually([&] { return Health(port) == Serving::SERVING; }));
  EXPECT_EQ(Health(port, kLeaderHealthService), Serving::NOT_SERVING);

  // Elected: the full coordinator answers on the same port.
  leadership.Win();
  ASSERT_TRUE(Eventually([&] { return ListJobs(port).ok(); }));
  EXPECT_TRUE(process.loop().leading());
  auto leader_metrics = http.Get("/metrics");
  ASSERT_TRUE(leader_metrics);
  EXPECT_THAT(leader_metrics->body, HasSubstr("chorus_leader 1\n"));
  EXPECT_THAT(leader_metrics->body, HasSubstr("chorus_leader_changes_total 1\n"));

  // Lost: the full coordinator is gone and the follower answers again.
  leadership.Lose();
  ASSERT_TRUE(Eventually([&] {
    return ListJobs(port).error_code() == grpc::StatusCode::UNAVAILABLE &&
           leadership.campaigns() == 2;
  }));
  EXPECT_THAT(ListJobs(port).error_message(), HasSubstr("follower"));
  EXPECT_FALSE(process.loop().leading());

  // Elected again.
  leadership.Win();
  ASSERT_TRUE(Eventually([&] { return ListJobs(port).ok(); }));
  EXPECT_EQ(process.loop().leader_changes(), 3);

  process.Stop();
  loop.join();
  EXPECT_TRUE(ran.ok()) << ran;
}

TEST(CoordinatorProcessTest, AFollowerWithoutALeaderSaysNoneIsElected) {
  const grpc::Status none = FollowerStatus(std::nullopt);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(none.error_message(), HasSubstr("no leader is elected yet"));
}

TEST(CoordinatorProcessTest, AloneItLeadsAtOnceAndStopEndsRun) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = TempDir("alone");
  options.checkpoint_data_port = -1;
  options.http_listen = "off";
  SoleLeadership leadership(LeaderInfo{"me", options.listen, "", {}});
  absl::Mutex mu;
  int port = 0;
  CoordinatorProcess process(options, leadership, /*follow=*/false,
                             [&](const LeaderLoop::Ports& bound) {
                               absl::MutexLock lock(&mu);
                               port = bound.grpc;
                             });
  absl::Status ran = absl::UnknownError("not run");
  std::thread loop([&] { ran = process.Run(); });
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return port != 0;
  }));
  int bound = 0;
  {
    absl::MutexLock lock(&mu);
    bound = port;
  }
  EXPECT_TRUE(ListJobs(bound).ok());
  // It reports itself the leader to clients that follow one.
  auto health =
      grpc::health::v1::Health::NewStub(MakeCoordinatorChannel(absl::StrCat("127.0.0.1:", bound)));
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(kLeaderHealthService);
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(health->Check(&context, request, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  // And names itself, with the bound port, as the leader.
  auto jobs = v1::JobService::NewStub(MakeCoordinatorChannel(absl::StrCat("127.0.0.1:", bound)));
  grpc::ClientContext leader_context;
  v1::CoordinatorLeader leader;
  ASSERT_TRUE(jobs->GetLeader(&leader_context, v1::GetLeaderRequest(), &leader).ok());
  EXPECT_EQ(leader.address(), absl::StrCat("127.0.0.1:", bound));
  EXPECT_EQ(leader.id(), "me");
  EXPECT_GT(leader.since_unix_us(), 0);
  process.Stop();
  loop.join();
  EXPECT_TRUE(ran.ok()) << ran;
  EXPECT_NE(ListJobs(bound).error_code(), grpc::StatusCode::OK);
}

TEST(CoordinatorProcessTest, TheAdvertisedAddressIsTheFlagsOrTheListenAddressWithTheBoundPort) {
  ServerOptions options;
  options.listen = "0.0.0.0:0";
  options.http_listen = "0.0.0.0:0";
  const LeaderLoop::Ports ports{29650, 29651};
  AdvertisedAddress flag = AdvertisedAddressOf(options, "node1.example:39650", ports);
  EXPECT_EQ(flag.grpc, "node1.example:39650");
  EXPECT_EQ(flag.http_url, "http://node1.example:29651");
  EXPECT_EQ(AdvertisedAddressOf(options, "node1.example:0", ports).grpc, "node1.example:29650");
  EXPECT_EQ(AdvertisedAddressOf(options, "[fd00::1]:0", ports).grpc, "[fd00::1]:29650");

  options.listen = "10.0.0.1:0";
  options.http_listen = "127.0.0.1:0";
  AdvertisedAddress listen = AdvertisedAddressOf(options, "", ports);
  EXPECT_EQ(listen.grpc, "10.0.0.1:29650");
  EXPECT_EQ(listen.http_url, "http://127.0.0.1:29651");
}

TEST(CoordinatorProcessTest, AWildcardAddressIsNeverAdvertised) {
  EXPECT_TRUE(ValidateAdvertisedAddress("10.0.0.1:29650", "").ok());
  EXPECT_TRUE(ValidateAdvertisedAddress("0.0.0.0:29650", "node1.example:29650").ok());
  EXPECT_TRUE(ValidateAdvertisedAddress("[::]:29650", "[fd00::1]:0").ok());
  for (const char* listen : {"0.0.0.0:29650", "[::]:29650", "[0:0:0:0:0:0:0:0]:29650"}) {
    absl::Status wildcard = ValidateAdvertisedAddress(listen, "");
    EXPECT_TRUE(absl::IsInvalidArgument(wildcard)) << listen;
    EXPECT_THAT(wildcard.message(), HasSubstr(absl::StrCat("--listen ", listen)));
    EXPECT_THAT(wildcard.message(), HasSubstr("give --advertise_address"));
  }
  for (const char* advertise : {"0.0.0.0:29650", "[::]:0"}) {
    absl::Status wildcard = ValidateAdvertisedAddress("10.0.0.1:29650", advertise);
    EXPECT_TRUE(absl::IsInvalidArgument(wildcard)) << advertise;
    EXPECT_THAT(wildcard.message(),
                HasSubstr(absl::StrCat("--advertise_address ", advertise, ": a wildcard address")));
  }
  absl::Status bad = ValidateAdvertisedAddress("10.0.0.1:29650", "node1.example");
  EXPECT_TRUE(absl::IsInvalidArgument(bad));
  EXPECT_THAT(bad.message(), HasSubstr("--advertise_address: "));
}

}  // namespace
}  // namespace chorus
