#include "worker/comm/grpc_store.h"

#include <algorithm>

#include "common/backoff.h"
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

// Note [Store after a takeover]
// The rendezvous store lives in the coordinator's memory (docs/ha.md): a new
// leader, or a coordinator restarted on the same address, starts with an
// empty one, and a call in flight when the old one died fails UNAVAILABLE
// ("Socket closed"). Ranks in a rendezvous then would fail their generation.
// Instead each client remembers the keys it set and, on UNAVAILABLE, sets
// them again (the new coordinator now has them) and retries the call with
// wait_for_ready until the call's own deadline: every rank still waiting
// re-publishes its keys, so the rendezvous completes on the new coordinator.
// Values are the same on every retry, so setting one again is harmless.
absl::Status GrpcStore::Retrying(absl::Time deadline,
                                 const std::function<absl::Status()>& attempt) {
  // Every rank of the job retries at once after a takeover: Note [Backoff]
  // in common/backoff.cc.
  BackoffOptions delays;
  delays.initial = absl::Milliseconds(50);
  delays.max = absl::Milliseconds(200);
  Backoff backoff(delays);
  for (;;) {
    absl::Status s = attempt();
    if (s.code() != absl::StatusCode::kUnavailable || absl::Now() >= deadline) return s;
    absl::SleepFor(backoff.NextWithin(deadline));
    std::map<std::string, std::string> mine;
    {
      absl::MutexLock lock(&mu_);
      mine = mine_;
    }
    // A failed one is set again before the next retry.
    for (const auto& [key, value] : mine) (void)SetOnce(key, value, deadline);
  }
}

absl::Status GrpcStore::SetOnce(const std::string& key, const std::string& value,
                                absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  v1::StoreSetRequest request;
  request.set_ns(ns_);
  request.set_key(key);
  request.set_value(value);
  v1::StoreSetResponse response;
  return FromGrpcStatus(stub_->Set(&context, request, &response));
}

absl::Status GrpcStore::Set(absl::string_view key, absl::string_view value) {
  {
    absl::MutexLock lock(&mu_);
    mine_[std::string(key)] = std::string(value);
  }
  const absl::Time deadline = absl::Now() + rpc_timeout_;
  return Retrying(deadline, [&] { return SetOnce(std::string(key), std::string(value), deadline); });
}

absl::StatusOr<std::string> GrpcStore::Get(absl::string_view key, absl::Time deadline) {
  v1::StoreGetResponse response;
  absl::Status s = Retrying(deadline + kNetworkGrace, [&] {
    grpc::ClientContext context;
    SetDeadline(context, deadline + kNetworkGrace);
    v1::StoreGetRequest request;
    request.set_ns(ns_);
    request.set_key(std::string(key));
    // Never 0 ("do not wait"): an expired deadline still gets one look.
    request.set_wait_seconds(std::max(1e-3, SecondsUntil(deadline)));
    return FromGrpcStatus(stub_->Get(&context, request, &response));
  });
  if (!s.ok()) return s;
  return std::move(*response.mutable_value());
}

absl::Status GrpcStore::Wait(absl::Span<const std::string> keys, absl::Time deadline) {
  return Retrying(deadline + kNetworkGrace, [&] {
    grpc::ClientContext context;
    SetDeadline(context, deadline + kNetworkGrace);
    v1::StoreWaitRequest request;
    request.set_ns(ns_);
    for (const std::string& k : keys) request.add_keys(k);
    request.set_wait_seconds(std::max(1e-3, SecondsUntil(deadline)));
    v1::StoreWaitResponse response;
    return FromGrpcStatus(stub_->Wait(&context, request, &response));
  });
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
