#include "common/grpc_util.h"

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace chorus {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> CheckHealth(
    const std::string& address, absl::Duration timeout) {
  auto stub = grpc::health::v1::Health::NewStub(MakeCoordinatorChannel(address));
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
      return absl::Status(s.code(), absl::StrCat("no coordinator answered at ", address,
                                                 " within ", absl::FormatDuration(timeout)));
    }
    return absl::Status(s.code(),
                        absl::StrCat("health check of ", address, " failed: ", s.message()));
  }
  return response.status();
}

}  // namespace chorus
