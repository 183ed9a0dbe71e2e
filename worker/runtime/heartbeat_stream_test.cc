#include "worker/runtime/heartbeat_stream.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/runtime/progress_channel.h"

namespace chorus {
namespace {

// The coordinator's side of the stream: records every heartbeat and every
// stream that ended.
class RecordingRankService : public v1::RankService::Service {
 public:
  grpc::Status Heartbeat(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::Directive, v1::RankHeartbeat>* stream) override {
    v1::RankHeartbeat hb;
    while (stream->Read(&hb)) {
      absl::MutexLock lock(&mu_);
      received_.push_back(hb);
    }
    absl::MutexLock lock(&mu_);
    ++streams_ended_;
    return grpc::Status::OK;
  }

  // Waits up to 10 s until `n` heartbeats have arrived.
  bool AwaitReceived(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return received_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }
  bool AwaitStreamsEnded(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return streams_ended_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }
  std::vector<v1::RankHeartbeat> received() {
    absl::MutexLock lock(&mu_);
    return received_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::RankHeartbeat> received_ ABSL_GUARDED_BY(mu_);
  int streams_ended_ ABSL_GUARDED_BY(mu_) = 0;
};

// `service` on 127.0.0.1:`port` (0 = a free port, written back).
std::unique_ptr<grpc::Server> Serve(RecordingRankService& service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:" + std::to_string(*port), grpc::InsecureServerCredentials(),
                           port);
  builder.RegisterService(&service);
  return builder.BuildAndStart();
}

// A channel that retries connecting quickly (gRPC's default first backoff
// is a second).
std::shared_ptr<grpc::Channel> FastReconnectingChannel(int port) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials(), args);
}

HeartbeatStream::Options Fast() {
  HeartbeatStream::Options options;
  options.interval = absl::Milliseconds(10);
  options.reconnect_delay = absl::Milliseconds(20);
  return options;
}

TEST(HeartbeatStreamTest, SendsWhatComposeReturnsEveryInterval) {
  RecordingRankService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(service, &port);
  ASSERT_NE(server, nullptr);
  auto stub = v1::RankService::NewStub(FastReconnectingChannel(port));
  std::atomic<int64_t> step{0};
  {
    HeartbeatStream heartbeats(
        *stub,
        [&step] {
          v1::RankHeartbeat hb;
          hb.set_job_id("job-000001");
          hb.set_rank(1);
          hb.set_step(step.fetch_add(1));
          return hb;
        },
        Fast());
    ASSERT_TRUE(service.AwaitReceived(5));
    // The server may read the fifth heartbeat before the stream's thread,
    // back from Write, has counted it.
    for (int i = 0; i < 1000 && heartbeats.sent() < 5; ++i) absl::SleepFor(absl::Milliseconds(5));
    EXPECT_GE(heartbeats.sent(), 5);
    EXPECT_EQ(heartbeats.streams_opened(), 1);
  }
  ASSERT_TRUE(service.AwaitStreamsEnded(1)) << "the stream is closed when the object goes";
  const std::vector<v1::RankHeartbeat> got = service.received();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].job_id(), "job-000001");
    EXPECT_EQ(got[i].rank(), 1);
    EXPECT_EQ(got[i].step(), static_cast<int64_t>(i)) << "in order, none lost";
  }
  server->Shutdown();
}

TEST(HeartbeatStreamTest, SendsNothingWhilePausedAndResumesAfter) {
  RecordingRankService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(service, &port);
  ASSERT_NE(server, nullptr);
  auto stub = v1::RankService::NewStub(FastReconnectingChannel(port));
  std::atomic<bool> paused{false};
  std::atomic<int64_t> composed{0};
  HeartbeatStream::Options options = Fast();
  options.paused = [&paused] { return paused.load(); };
  {
    HeartbeatStream heartbeats(
        *stub,
        [&composed] {
          v1::RankHeartbeat hb;
          hb.set_step(composed.fetch_add(1));
          return hb;
        },
        options);
    ASSERT_TRUE(service.AwaitReceived(2));
    paused = true;
    absl::SleepFor(absl::Milliseconds(50));  // a heartbeat in flight lands
    const size_t before = service.received().size();
    const int64_t composed_before = composed.load();
    absl::SleepFor(absl::Milliseconds(200));  // 20 intervals
    EXPECT_EQ(service.received().size(), before) << "a paused stream sends nothing";
    EXPECT_EQ(composed.load(), composed_before) << "nor composes";
    EXPECT_EQ(heartbeats.streams_opened(), 1) << "the stream stays open while paused";
    paused = false;
    ASSERT_TRUE(service.AwaitReceived(before + 2)) << "heartbeats resume";
  }
  server->Shutdown();
}

TEST(HeartbeatStreamTest, ReconnectsAfterTheCoordinatorGoesAwayAndComesBack) {
  RecordingRankService first;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(first, &port);
  ASSERT_NE(server, nullptr);
  auto stub = v1::RankService::NewStub(FastReconnectingChannel(port));
  std::atomic<int64_t> composed{0};
  HeartbeatStream heartbeats(
      *stub,
      [&composed] {
        v1::RankHeartbeat hb;
        hb.set_step(composed.fetch_add(1));
        return hb;
      },
      Fast());
  ASSERT_TRUE(first.AwaitReceived(3));
  // The coordinator goes away (its open streams are cancelled) ...
  server->Shutdown(std::chrono::system_clock::now());
  server->Wait();
  server.reset();
  absl::SleepFor(absl::Milliseconds(100));  // some heartbeats fail meanwhile
  // ... and comes back on the same address.
  RecordingRankService second;
  int same_port = port;
  server = Serve(second, &same_port);
  ASSERT_NE(server, nullptr);
  ASSERT_EQ(same_port, port);
  ASSERT_TRUE(second.AwaitReceived(3)) << "no heartbeat reached the restarted coordinator";
  EXPECT_GE(heartbeats.streams_opened(), 2);
  const std::vector<v1::RankHeartbeat> after = second.received();
  EXPECT_GT(after.front().step(), first.received().back().step())
      << "fresh heartbeats, not a replay";
  server->Shutdown(std::chrono::system_clock::now());
}

TEST(HeartbeatStreamTest, StopsPromptlyBetweenHeartbeats) {
  RecordingRankService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(service, &port);
  ASSERT_NE(server, nullptr);
  auto stub = v1::RankService::NewStub(FastReconnectingChannel(port));
  HeartbeatStream::Options slow;
  slow.interval = absl::Hours(1);
  std::atomic<v1::Phase> phase{v1::FORWARD};
  auto heartbeats = std::make_unique<HeartbeatStream>(
      *stub,
      [&] {
        v1::RankHeartbeat hb;
        hb.set_phase(phase.load());
        return hb;
      },
      slow);
  ASSERT_TRUE(service.AwaitReceived(1));
  phase.store(v1::FINISHED);  // training ends, then the stream
  const absl::Time start = absl::Now();
  heartbeats.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5))
      << "the destructor waited for the next heartbeat";
  EXPECT_TRUE(service.AwaitStreamsEnded(1));
  // Note [The last heartbeat]: composed as the stream ends.
  const std::vector<v1::RankHeartbeat> received = service.received();
  ASSERT_EQ(received.size(), 2u);
  EXPECT_EQ(received[0].phase(), v1::FORWARD);
  EXPECT_EQ(received[1].phase(), v1::FINISHED);
  server->Shutdown();
}

// The coordinator's side for an elastic job's survivor of an old generation:
// the first heartbeat gets RE_RENDEZVOUS, then the stream ends.
class ReRendezvousService : public v1::RankService::Service {
 public:
  grpc::Status Heartbeat(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::Directive, v1::RankHeartbeat>* stream) override {
    v1::RankHeartbeat hb;
    if (!stream->Read(&hb)) return grpc::Status::OK;
    v1::Directive directive;
    directive.set_kind(v1::Directive::RE_RENDEZVOUS);
    directive.set_generation(hb.generation() + 1);
    directive.set_reason("rank 3 was lost");
    stream->Write(directive);
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "stale generation");
  }
};

TEST(HeartbeatStreamTest, HandsTheCoordinatorsDirectiveToOnDirective) {
  ReRendezvousService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = v1::RankService::NewStub(FastReconnectingChannel(port));
  absl::Mutex mu;
  std::vector<v1::Directive> got;
  HeartbeatStream::Options options = Fast();
  options.on_directive = [&](const v1::Directive& d) {
    absl::MutexLock lock(&mu);
    got.push_back(d);
  };
  {
    HeartbeatStream heartbeats(
        *stub,
        [] {
          v1::RankHeartbeat hb;
          hb.set_generation(4);
          return hb;
        },
        options);
    absl::MutexLock lock(&mu);
    auto two = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return got.size() >= 2; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&two), absl::Seconds(10)))
        << "one directive per stream, and the stream is opened again";
  }
  EXPECT_EQ(got[0].kind(), v1::Directive::RE_RENDEZVOUS);
  EXPECT_EQ(got[0].generation(), 5);
  EXPECT_EQ(got[0].reason(), "rank 3 was lost");
  server->Shutdown(std::chrono::system_clock::now());
}

// Note [Directives are read at once]: the directive reaches on_directive
// when it arrives, not when a later heartbeat fails to go out (here: an
// hour later).
TEST(HeartbeatStreamTest, HandsADirectiveOverAsSoonAsItArrives) {
  ReRendezvousService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = v1::RankService::NewStub(FastReconnectingChannel(port));
  absl::Mutex mu;
  std::vector<v1::Directive> got;
  HeartbeatStream::Options options;
  options.interval = absl::Hours(1);
  options.reconnect_delay = absl::Milliseconds(20);
  options.on_directive = [&](const v1::Directive& d) {
    absl::MutexLock lock(&mu);
    got.push_back(d);
  };
  {
    HeartbeatStream heartbeats(
        *stub, [] { return v1::RankHeartbeat(); }, options);
    absl::MutexLock lock(&mu);
    auto one = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !got.empty(); };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&one), absl::Seconds(10)))
        << "the directive waited for the next heartbeat";
    // The ended stream is opened again after reconnect_delay, not after
    // the next heartbeat is due.
    auto two = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return got.size() >= 2; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&two), absl::Seconds(10)));
    EXPECT_EQ(heartbeats.streams_opened(), 2);
  }
  EXPECT_EQ(got[0].kind(), v1::Directive::RE_RENDEZVOUS);
  server->Shutdown(std::chrono::system_clock::now());
}

// A coordinator (for a stream the rank might open) and the channel between a
// rank and its agent.
class ThroughAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = Serve(service_, &port_);
    ASSERT_NE(server_, nullptr);
    stub_ = v1::RankService::NewStub(FastReconnectingChannel(port_));
    absl::StatusOr<ProgressChannelPair> pair = CreateProgressChannel();
    ASSERT_TRUE(pair.ok()) << pair.status();
    pair_ = *pair;
  }

  RecordingRankService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::RankService::Stub> stub_;
  ProgressChannelPair pair_;
};

TEST_F(ThroughAgentTest, SendNowDoesNotWaitForTheInterval) {
  ProgressReceiver agent(pair_.supervisor_fd);
  HeartbeatStream::Options options;
  options.interval = absl::Hours(1);
  options.agent = std::make_shared<ProgressSender>(pair_.program_fd);
  std::atomic<int64_t> step{0};
  HeartbeatStream heartbeats(
      *stub_,
      [&step] {
        v1::RankHeartbeat hb;
        hb.set_step(step.fetch_add(1));
        return hb;
      },
      options);
  absl::StatusOr<v1::RankHeartbeat> first = agent.Receive(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      agent.Receive(absl::Now() + absl::Milliseconds(200)).status()))
      << "the next one waits for the interval";
  heartbeats.SendNow();
  absl::StatusOr<v1::RankHeartbeat> now = agent.Receive(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->step(), first->step() + 1);
}

// Note [Heartbeats through the agent] (worker/agent/agent.cc): with the
// agent's channel the heartbeats go there, none to the coordinator, and the
// agent's directives reach on_directive.
TEST_F(ThroughAgentTest, GoesThroughTheAgentsChannelWithDirectivesBack) {
  ProgressReceiver agent(pair_.supervisor_fd);
  absl::Mutex mu;
  std::vector<v1::Directive> directives;
  std::atomic<bool> paused{false};
  std::atomic<int64_t> step{0};
  HeartbeatStream::Options options = Fast();
  options.agent = std::make_shared<ProgressSender>(pair_.program_fd);
  options.paused = [&paused] { return paused.load(); };
  options.on_directive = [&](const v1::Directive& directive) {
    absl::MutexLock lock(&mu);
    directives.push_back(directive);
  };
  {
    HeartbeatStream heartbeats(
        *stub_,
        [&step] {
          v1::RankHeartbeat hb;
          hb.set_job_id("job-000001");
          hb.set_rank(3);
          hb.set_step(step.fetch_add(1));
          return hb;
        },
        options);
    absl::StatusOr<v1::RankHeartbeat> first = agent.Receive(absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(first->job_id(), "job-000001");
    EXPECT_EQ(first->rank(), 3);
    absl::StatusOr<v1::RankHeartbeat> later = agent.Receive(absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(later.ok()) << later.status();
    EXPECT_GT(later->step(), first->step()) << "every interval, newer";

    v1::Directive reform;
    reform.set_kind(v1::Directive::REFORM_AT_STEP_BOUNDARY);
    reform.set_generation(4);
    ASSERT_TRUE(agent.SendDirective(reform).ok());
    {
      absl::MutexLock lock(&mu);
      auto arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !directives.empty(); };
      ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&arrived), absl::Seconds(10)));
      EXPECT_EQ(directives[0].kind(), v1::Directive::REFORM_AT_STEP_BOUNDARY);
      EXPECT_EQ(directives[0].generation(), 4);
    }

    // Paused: the agent hears nothing (so the rank ages into DEAD).
    paused = true;
    absl::SleepFor(absl::Milliseconds(50));  // a heartbeat in flight lands
    (void)agent.Receive(absl::InfinitePast());
    absl::SleepFor(absl::Milliseconds(200));  // 20 intervals
    EXPECT_TRUE(absl::IsDeadlineExceeded(agent.Receive(absl::InfinitePast()).status()))
        << "a paused rank sent a heartbeat to its agent";
    EXPECT_EQ(heartbeats.streams_opened(), 0);
  }
  EXPECT_TRUE(service_.received().empty()) << "a heartbeat bypassed the agent";
  server_->Shutdown();
}

TEST_F(ThroughAgentTest, GoesStraightToTheCoordinatorWhenTheAgentsEndCloses) {
  auto agent = std::make_unique<ProgressReceiver>(pair_.supervisor_fd);
  HeartbeatStream::Options options = Fast();
  options.agent = std::make_shared<ProgressSender>(pair_.program_fd);
  HeartbeatStream heartbeats(
      *stub_, [] { return v1::RankHeartbeat(); }, options);
  ASSERT_TRUE(agent->Receive(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_TRUE(service_.received().empty());
  agent.reset();  // the agent went away
  ASSERT_TRUE(service_.AwaitReceived(2)) << "no heartbeat reached the coordinator";
  EXPECT_EQ(heartbeats.streams_opened(), 1);
  server_->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace chorus
