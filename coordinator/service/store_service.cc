#include "coordinator/service/store_service.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"

namespace chorus {
namespace {

// A unary call that waits in the KeyValueStore. `on_ready` fills the response
// once the keys are there. Deletes itself when gRPC is done with it; nothing
// touches it after Finish, which may lead to OnDone on another thread.
class WaitReactor : public grpc::ServerUnaryReactor {
 public:
  WaitReactor(KeyValueStore& store, std::function<absl::Status()> on_ready)
      : store_(store), on_ready_(std::move(on_ready)) {}

  void Start(const std::string& ns, std::vector<std::string> keys, absl::Time deadline) {
    const uint64_t id = store_.WaitFor(ns, std::move(keys), deadline,
                                       [this](absl::Status s) { Complete(std::move(s)); });
    std::optional<absl::Status> early;
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      starting_ = false;
      id_ = id;
      early.swap(early_);
      cancel = cancelled_ && id != 0 && !early;
    }
    if (early) {
      Finish(ToGrpcStatus(*early));
    } else if (cancel) {
      store_.Cancel(id);  // completes through Complete()
    }
  }

  void OnCancel() override {
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      id = starting_ ? 0 : id_;
    }
    if (id != 0) store_.Cancel(id);
  }

  void OnDone() override { delete this; }

 private:
  // The store's callback: runs once.
  void Complete(absl::Status s) {
    if (s.ok()) s = on_ready_();
    {
      absl::MutexLock lock(&mu_);
      if (starting_) {  // finished inside WaitFor: Start() calls Finish
        early_ = std::move(s);
        return;
      }
    }
    Finish(ToGrpcStatus(s));
  }

  KeyValueStore& store_;
  std::function<absl::Status()> on_ready_;
  absl::Mutex mu_;
  bool starting_ ABSL_GUARDED_BY(mu_) = true;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t id_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::Status> early_ ABSL_GUARDED_BY(mu_);
};

absl::Status CheckNames(const std::string& ns, const std::string& key) {
  if (ns.empty()) return absl::InvalidArgumentError("store: ns must not be empty");
  if (key.empty()) return absl::InvalidArgumentError("store: key must not be empty");
  return absl::OkStatus();
}

absl::StatusOr<absl::Time> WaitDeadline(double seconds) {
  if (!(seconds >= 0) || seconds > StoreServiceImpl::kMaxWaitSeconds) {
    return absl::InvalidArgumentError(absl::StrCat("store: wait_seconds must be in [0, ",
                                                   StoreServiceImpl::kMaxWaitSeconds, "], got ",
                                                   seconds));
  }
  return absl::Now() + absl::Seconds(seconds);
}

}  // namespace

absl::Status StoreServiceImpl::CheckCaller(const grpc::CallbackServerContext& context,
                                           const std::string& ns) const {
  return auth_.CheckJob(context.client_metadata(), KeyValueStore::JobOfNamespace(ns),
                        "use the key-value store");
}

grpc::ServerUnaryReactor* StoreServiceImpl::Set(grpc::CallbackServerContext* context,
                                                const v1::StoreSetRequest* request,
                                                v1::StoreSetResponse* /*response*/) {
  if (absl::Status s = CheckCaller(*context, request->ns()); !s.ok()) return Reject(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status s = CheckNames(request->ns(), request->key());
  if (s.ok()) s = store_.Set(request->ns(), request->key(), request->value());
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* StoreServiceImpl::Add(grpc::CallbackServerContext* context,
                                                const v1::StoreAddRequest* request,
                                                v1::StoreAddResponse* response) {
  if (absl::Status s = CheckCaller(*context, request->ns()); !s.ok()) return Reject(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status s = CheckNames(request->ns(), request->key());
  if (s.ok()) {
    absl::StatusOr<int64_t> value = store_.Add(request->ns(), request->key(), request->delta());
    if (value.ok()) response->set_value(*value);
    s = value.status();
  }
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* StoreServiceImpl::Get(grpc::CallbackServerContext* context,
                                                const v1::StoreGetRequest* request,
                                                v1::StoreGetResponse* response) {
  if (absl::Status s = CheckCaller(*context, request->ns()); !s.ok()) return Reject(context, s);
  absl::Status s = CheckNames(request->ns(), request->key());
  absl::StatusOr<absl::Time> deadline = WaitDeadline(request->wait_seconds());
  if (s.ok()) s = deadline.status();
  if (!s.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  const std::string ns = request->ns();
  const std::string key = request->key();
  auto* reactor = new WaitReactor(store_, [this, ns, key, response]() -> absl::Status {
    std::optional<std::string> value = store_.Get(ns, key);
    if (!value) return absl::NotFoundError(absl::StrCat("store: key \"", key, "\" not set"));
    response->set_value(std::move(*value));
    return absl::OkStatus();
  });
  if (request->wait_seconds() == 0 && !store_.Get(ns, key)) {
    reactor->Finish(ToGrpcStatus(absl::NotFoundError(
        absl::StrCat("store: namespace \"", ns, "\" has no key \"", key, "\""))));
    return reactor;
  }
  reactor->Start(ns, {key}, *deadline);
  return reactor;
}

grpc::ServerUnaryReactor* StoreServiceImpl::Wait(grpc::CallbackServerContext* context,
                                                 const v1::StoreWaitRequest* request,
                                                 v1::StoreWaitResponse* /*response*/) {
  if (absl::Status s = CheckCaller(*context, request->ns()); !s.ok()) return Reject(context, s);
  absl::Status s = request->ns().empty() ? absl::InvalidArgumentError("store: ns must not be empty")
                                         : absl::OkStatus();
  absl::StatusOr<absl::Time> deadline = WaitDeadline(request->wait_seconds());
  if (s.ok()) s = deadline.status();
  if (!s.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  auto* reactor = new WaitReactor(store_, [] { return absl::OkStatus(); });
  reactor->Start(request->ns(), {request->keys().begin(), request->keys().end()}, *deadline);
  return reactor;
}

}  // namespace chorus
