#include "common/grpc_util.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace chorus {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

// Adds "authorization: Bearer TOKEN" to every call on the channel.
class BearerTokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(std::string header) : header_(std::move(header)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", header_});
    }
    methods->Proceed();
  }

 private:
  std::string header_;
};

class BearerTokenFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(std::string token) : header_("Bearer " + std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(header_);
  }

 private:
  std::string header_;
};

}  // namespace

std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(const std::string& address) {
  const ClientSecurity& security = ClientSecurityConfig();
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!security.tls_ca_pem.empty()) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = security.tls_ca_pem;
    tls.pem_cert_chain = security.tls_cert_pem;
    tls.pem_private_key = security.tls_key_pem;
    credentials = grpc::SslCredentials(tls);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxCoordinatorMessageBytes);
  args.SetMaxSendMessageSize(kMaxCoordinatorMessageBytes);
  // A restarted coordinator must be found again within its recovery grace
  // period (default 30 s, seconds in tests): reconnect attempts every 0.2 s
  // at first and never more than 2 s apart, instead of gRPC's 1 s growing to
  // 120 s.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!security.token.empty())
    interceptors.push_back(std::make_unique<BearerTokenFactory>(security.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args,
                                                                 std::move(interceptors));
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& address,
    absl::Duration timeout) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  // Wait for the connection within the deadline instead of failing at once
  // while the channel is still connecting.
  context.set_wait_for_ready(true);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    absl::Status s = FromGrpcStatus(status);
    if (s.code() == absl::StatusCode::kDeadlineExceeded ||
        s.code() == absl::StatusCode::kUnavailable) {
      return absl::Status(s.code(), absl::StrCat("no coordinator answered at ", address, " within ",
                                                 absl::FormatDuration(timeout)));
    }
    return absl::Status(s.code(),
                        absl::StrCat("health check of ", address, " failed: ", s.message()));
  }
  return response.status();
}

}  // namespace chorus
