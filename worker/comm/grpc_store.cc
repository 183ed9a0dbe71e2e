#include "worker/comm/grpc_store.h"

#include <algorithm>

#include "common/grpc_util.h"
#include "grpcpp/client_context.h"

namespace chorus {
namespace {

// Time on top of a wait's own deadline for the answer to travel back.
constexpr absl::Duration kNetworkGrace = absl::Seconds(5);

void SetDeadline(grpc::ClientContext& context, absl::Time deadline) {
  context.set_deadline(absl::ToChronoTime(deadline));
  // Waiting for a connection that is still being set up is part of the call.
  context.set_wait_for_ready(true);
}

double SecondsUntil(absl::Time deadline) {
  return std::max(0.0, absl::ToDoubleSeconds(deadline - absl::Now()));
}

}  // namespace

GrpcStore::GrpcStore(std::shared_ptr<grpc::Channel> channel, std::string ns,
                     absl::Duration rpc_timeout)
    : stub_(v1::StoreService::NewStub(std::move(channel))),
      ns_(std::move(ns)),
      rpc_timeout_(rpc_timeout) {}

absl::Status GrpcStore::Set(absl::string_view key, absl::string_view value) {
  grpc::ClientContext context;
  SetDeadline(context, absl::Now() + rpc_timeout_);
  v1::StoreSetRequest request;
  request.set_ns(ns_);
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::StoreSetResponse response;
  return FromGrpcStatus(stub_->Set(&context, request, &response));
}

absl::StatusOr<std::string> GrpcStore::Get(absl::string_view key, absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline + kNetworkGrace);
  v1::StoreGetRequest request;
  request.set_ns(ns_);
  request.set_key(std::string(key));
  // Never 0 ("do not wait"): an expired deadline still gets one look.
  request.set_wait_seconds(std::max(1e-3, SecondsUntil(deadline)));
  v1::StoreGetResponse response;
  absl::Status s = FromGrpcStatus(stub_->Get(&context, request, &response));
  if (!s.ok()) return s;
  return std::move(*response.mutable_value());
}

absl::Status GrpcStore::Wait(absl::Span<const std::string> keys, absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline + kNetworkGrace);
  v1::StoreWaitRequest request;
  request.set_ns(ns_);
  for (const std::string& k : keys) request.add_keys(k);
  request.set_wait_seconds(std::max(1e-3, SecondsUntil(deadline)));
  v1::StoreWaitResponse response;
  return FromGrpcStatus(stub_->Wait(&context, request, &response));
}

absl::StatusOr<int64_t> GrpcStore::Add(absl::string_view key, int64_t delta) {
  grpc::ClientContext context;
  SetDeadline(context, absl::Now() + rpc_timeout_);
  v1::StoreAddRequest request;
  request.set_ns(ns_);
  request.set_key(std::string(key));
  request.set_delta(delta);
  v1::StoreAddResponse response;
  absl::Status s = FromGrpcStatus(stub_->Add(&context, request, &response));
  if (!s.ok()) return s;
  return response.value();
}

}  // namespace chorus
