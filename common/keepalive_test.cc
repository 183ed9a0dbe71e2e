// Coordinator channels notice a frozen coordinator within their keepalive,
// and servers that accept their pings keep idle streams open (Note
// [Noticing a frozen coordinator] in grpc_util.cc). The server is a real
// gRPC server on 127.0.0.1 (the grpc.health.v1 service); between it and the
// client sits a TCP relay that can be frozen as a SIGSTOPped process is.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
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
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// How often the relay's threads look at their flags.
constexpr int kPollMs = 20;

// Writes all of `data` to `fd`; false when the peer is gone (or a write
// timed out: the sockets have a 1 s send timeout).
bool WriteAll(int fd, const char* data, ssize_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0) return false;
    data += n;
    size -= n;
  }
  return true;
}

// A TCP relay from 127.0.0.1:port() to 127.0.0.1:`backend_port`. Freeze()
// makes it what a SIGSTOPped server is to its clients: it reads and writes
// nothing more in either direction and accepts no connection, but keeps
// every socket open, so the kernel still acknowledges what clients send.
// Its threads are joined by the destructor.
class FreezableRelay {
 public:
  explicit FreezableRelay(int backend_port) : backend_port_(backend_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), length) == 0 &&
        ::listen(listen_fd_, 16) == 0 &&
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      port_ = ntohs(address.sin_port);
    }
    acceptor_ = std::thread([this] { AcceptConnections(); });
  }
  ~FreezableRelay() {
    stop_.store(true);
    acceptor_.join();
    absl::MutexLock lock(&mu_);
    for (std::thread& pump : pumps_) pump.join();
    ::close(listen_fd_);
  }
  FreezableRelay(const FreezableRelay&) = delete;
  FreezableRelay& operator=(const FreezableRelay&) = delete;

  int port() const { return port_; }  // 0: could not listen
  void Freeze() { frozen_.store(true); }

 private:
  void AcceptConnections() {
    while (!stop_.load()) {
      if (frozen_.load()) {
        absl::SleepFor(absl::Milliseconds(kPollMs));
        continue;
      }
      pollfd listening{listen_fd_, POLLIN, 0};
      if (::poll(&listening, 1, kPollMs) <= 0) continue;
      const int client = ::accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      const int backend = ConnectToBackend();
      if (backend < 0) {
        ::close(client);
        continue;
      }
      absl::MutexLock lock(&mu_);
      pumps_.emplace_back([this, client, backend] { Pump(client, backend); });
    }
  }

  int ConnectToBackend() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(backend_port_);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }

  // Copies bytes both ways until either side closes or the relay stops;
  // while frozen, touches neither socket.
  void Pump(int client, int backend) {
    const timeval send_timeout{1, 0};
    for (int fd : {client, backend}) {
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    }
    char buffer[16384];
    bool open = true;
    while (open && !stop_.load()) {
      if (frozen_.load()) {
        absl::SleepFor(absl::Milliseconds(kPollMs));
        continue;
      }
      pollfd fds[2] = {{client, POLLIN, 0}, {backend, POLLIN, 0}};
      if (::poll(fds, 2, kPollMs) <= 0) continue;
      for (int i = 0; i < 2 && open; ++i) {
        if (fds[i].revents == 0) continue;
        const ssize_t n = ::recv(fds[i].fd, buffer, sizeof(buffer), 0);
        open = n > 0 && WriteAll(fds[1 - i].fd, buffer, n);
      }
    }
    ::close(client);
    ::close(backend);
  }

  const int backend_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> frozen_{false};
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;  // last: starts after everything above is set
};

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
  explicit WatchThroughRelay(const FreezableRelay& relay)
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
  FreezableRelay relay(server.port());
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
  FreezableRelay relay(server.port());
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
