// Turning a failed authorization into a finished call, for every kind of
// callback handler: unary handlers return Reject(...); streaming handlers
// return a reactor that finishes at once with the error.
//
// Example:
//   if (absl::Status s = auth_.Check(context->client_metadata(), Role::kAdmin); !s.ok()) {
//     return Reject(context, s);
//   }
#ifndef CHORUS_COORDINATOR_SERVICE_AUTH_GUARD_H_
#define CHORUS_COORDINATOR_SERVICE_AUTH_GUARD_H_

#include "absl/status/status.h"
#include "common/auth.h"
#include "common/grpc_util.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"

namespace chorus {

// The authorizer that lets every call through (no --token_file).
inline const TokenAuthorizer& AllowAll() {
  static const TokenAuthorizer* allow_all = new TokenAuthorizer();
  return *allow_all;
}

inline grpc::ServerUnaryReactor* Reject(grpc::CallbackServerContext* context,
                                        const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

template <typename Request, typename Response>
class RejectedStream : public grpc::ServerBidiReactor<Request, Response> {
 public:
  explicit RejectedStream(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

template <typename Request>
class RejectedReader : public grpc::ServerReadReactor<Request> {
 public:
  explicit RejectedReader(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

template <typename Response>
class RejectedWriter : public grpc::ServerWriteReactor<Response> {
 public:
  explicit RejectedWriter(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SERVICE_AUTH_GUARD_H_
