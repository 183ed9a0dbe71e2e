// RPC metrics: a gRPC server interceptor that counts every call the
// coordinator serves by method and status code, and times it, into
// CoordinatorMetrics (chorus_rpcs_total, chorus_rpc_seconds).
//
// A call is timed from the interceptor's creation (the call arrived) to the
// status being sent; for a stream that is how long the stream lasted. A
// call the server cancels before sending a status (shutdown, a client that
// went away) is counted with code CANCELLED.
//
// Thread-safety: the factory is shared by every call; each call gets its
// own interceptor, which gRPC drives from one thread at a time.
//
// Example:
//   std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> f;
//   f.push_back(std::make_unique<RpcMetricsFactory>(metrics));
//   builder.experimental().SetInterceptorCreators(std::move(f));
#ifndef CHORUS_COORDINATOR_SERVICE_RPC_METRICS_H_
#define CHORUS_COORDINATOR_SERVICE_RPC_METRICS_H_

#include "coordinator/http/coordinator_metrics.h"
#include "grpcpp/support/server_interceptor.h"

namespace chorus {

class RpcMetricsFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `metrics` must outlive the server.
  explicit RpcMetricsFactory(CoordinatorMetrics& metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  CoordinatorMetrics& metrics_;
};

// "OK", "NOT_FOUND", ... for a gRPC status code.
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SERVICE_RPC_METRICS_H_
