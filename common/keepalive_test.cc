// Coordinator channels notice a frozen coordinator within their keepalive,
// and servers that accept their pings keep idle streams open (Note
// [Noticing a frozen coordinator] in grpc_util.cc). The server is a real
// gRPC server on 127.0.0.1 (the grpc.health.v1 service); between it and the
// client sits a TCP relay that can be frozen as a SIGSTOPped process is.

#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/tcp_relay_for_test.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// The grpc.health.v1 service as a coordinator's streams behave between
// events: Watch answers SERVING once, then says nothing until the call ends.
class SilentHealth : public Health::CallbackService {
 public:
  grpc::ServerWriteReactor<HealthCheckResponse>* Watch(grpc::CallbackServerContext*,
                                                       const HealthCheckRequest*) override {
    // gRPC's callback API: the reactor deletes itself when the call is done.
    return new ServingOnce();
  }

 private:
  class ServingOnce : public grpc::ServerWriteReactor<HealthCheckResponse> {
   public:
    ServingOnce() {
      response_.set_status(HealthCheckResponse::SERVING);
      StartWrite(&response_);
    }
    void OnWriteDone(bool) override {}
    void OnCancel() override { Finish(grpc::Status::CANCELLED); }
    void OnDone() override { delete this; }

   private:
    HealthCheckResponse response_;
  };
};

// SilentHealth on 127.0.0.1, accepting coordinator channels' pings as the
// coordinator does.
class HealthServer {
 public:
  HealthServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&health_);
    AcceptCoordinatorKeepalive(builder);
    server_ = builder.BuildAndStart();
  }
  ~HealthServer() {
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now()));
  }
  int port() const { return server_ != nullptr ? port_ : 0; }

 private:
  SilentHealth health_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// The client's end: a Watch stream (server streaming, silent after its
// first answer, as a coordinator's streams are between events) opened
// through `relay` on a coordinator channel.
class WatchThroughRelay {
 public:
  explicit WatchThroughRelay(const TcpRelay& relay)
      : channel_(MakeCoordinatorChannel(absl::StrCat("127.0.0.1:", relay.port()))),
        stub_(Health::NewStub(channel_)) {
    // Bounds every wait below, whatever the keepalive does.
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    stream_ = stub_->Watch(&context_, HealthCheckRequest());
  }

  // Whether the first answer says SERVING.
  bool Serving() {
    HealthCheckResponse response;
    return stream_->Read(&response) && response.status() == HealthCheckResponse::SERVING;
  }
  // Reads until the stream ends; its status.
  grpc::Status AwaitEnd() {
    HealthCheckResponse response;
    while (stream_->Read(&response)) {
    }
    return stream_->Finish();
  }
  void Cancel() { context_.TryCancel(); }
  grpc_connectivity_state state() { return channel_->GetState(/*try_to_connect=*/false); }
  // Whether the channel's state is other than READY by `deadline`.
  bool LeavesReadyBy(absl::Time deadline) {
    grpc_connectivity_state now = state();
    while (now == GRPC_CHANNEL_READY) {
      if (!channel_->WaitForStateChange(now, absl::ToChronoTime(deadline))) return false;
      now = state();
    }
    return true;
  }

 private:
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<Health::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> stream_;
};

TEST(KeepaliveTest, AStreamToAFrozenServerEndsUnavailableWithinTheKeepalive) {
  HealthServer server;
  ASSERT_NE(server.port(), 0);
  TcpRelay relay(server.port());
  ASSERT_NE(relay.port(), 0);
  WatchThroughRelay watch(relay);
  ASSERT_TRUE(watch.Serving());

  relay.Freeze();
  const absl::Time frozen = absl::Now();
  const grpc::Status status = watch.AwaitEnd();
  const absl::Duration noticed = absl::Now() - frozen;
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  // 4 s on a quiet machine; the rest is room for a busy one (a sanitizer
  // build beside other work): without keepalive the stream lasts until its
  // 60 s deadline.
  EXPECT_LE(noticed, kCoordinatorKeepaliveTime + kCoordinatorKeepaliveTimeout + absl::Seconds(6));
  // The channel learns it asynchronously, at about the same time.
  EXPECT_TRUE(watch.LeavesReadyBy(absl::Now() + absl::Seconds(3)));
  std::cout << "a frozen server was noticed after " << noticed << std::endl;
}

TEST(KeepaliveTest, AnIdleStreamStaysOpenWhileTheServerAnswersPings) {
  HealthServer server;
  ASSERT_NE(server.port(), 0);
  TcpRelay relay(server.port());
  ASSERT_NE(relay.port(), 0);
  WatchThroughRelay watch(relay);
  ASSERT_TRUE(watch.Serving());

  absl::Notification ended;
  grpc::Status status;
  std::thread reader([&] {
    status = watch.AwaitEnd();
    ended.Notify();
  });
  // Five keepalive intervals of silence: under gRPC's default server policy
  // the third ping (about 6 s in) gets GOAWAY "too_many_pings", which ends
  // the stream UNAVAILABLE.
  EXPECT_FALSE(ended.WaitForNotificationWithTimeout(5 * kCoordinatorKeepaliveTime));
  EXPECT_EQ(watch.state(), GRPC_CHANNEL_READY);
  watch.Cancel();
  reader.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
}

}  // namespace
}  // namespace chorus
