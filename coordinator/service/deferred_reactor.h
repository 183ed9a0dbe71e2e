// DeferredReactor: a unary call answered later by a callback — possibly
// before the handler has even returned, possibly after the client left.
//
// The callback (Completion) may be called from any thread, any number of
// times; only the first call finishes the RPC, and a completion that arrives
// after the client cancelled does nothing. The reactor deletes itself when
// gRPC is done with it, and completions never touch it after that.
//
// Example (inside a CallbackService handler):
//   auto* reactor = new DeferredReactor<v1::JoinResponse>(response);
//   scheduler.Join(*request, deadline, reactor->Completion());
//   return reactor;
#ifndef CHORUS_COORDINATOR_SERVICE_DEFERRED_REACTOR_H_
#define CHORUS_COORDINATOR_SERVICE_DEFERRED_REACTOR_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "grpcpp/support/server_callback.h"

namespace chorus {

template <typename Response>
class DeferredReactor : public grpc::ServerUnaryReactor {
 public:
  // `response` is the call's response message, owned by gRPC.
  explicit DeferredReactor(Response* response) : shared_(std::make_shared<Shared>()) {
    shared_->reactor = this;
    shared_->response = response;
  }

  // Finishes the call with the value (copied into the response) or error.
  std::function<void(absl::StatusOr<Response>)> Completion() {
    std::shared_ptr<Shared> shared = shared_;
    return [shared](absl::StatusOr<Response> result) { shared->Complete(std::move(result)); };
  }

  void OnCancel() override {
    shared_->Complete(absl::CancelledError("the client cancelled the call"));
  }
  void OnDone() override { delete this; }

 private:
  struct Shared {
    absl::Mutex mu;
    bool finished ABSL_GUARDED_BY(mu) = false;
    DeferredReactor* reactor = nullptr;
    Response* response = nullptr;

    void Complete(absl::StatusOr<Response> result) {
      {
        absl::MutexLock lock(&mu);
        if (finished) return;
        finished = true;
        if (result.ok()) *response = std::move(*result);
      }
      // OnDone (and so deletion) only follows Finish, which only this call makes.
      reactor->Finish(ToGrpcStatus(result.status()));
    }
  };
  std::shared_ptr<Shared> shared_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SERVICE_DEFERRED_REACTOR_H_
