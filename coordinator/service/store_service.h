// StoreService: chorus.v1.StoreService over a KeyValueStore, on gRPC's
// callback API. Get with wait_seconds > 0 and Wait park a reactor in the
// store and hold no thread; a client that goes away cancels its wait.
//
// Thread-safety: safe for concurrent calls. `store` must outlive the service
// and the server it is registered with.
#ifndef CHORUS_COORDINATOR_SERVICE_STORE_SERVICE_H_
#define CHORUS_COORDINATOR_SERVICE_STORE_SERVICE_H_

#include "chorus/v1/coordinator.grpc.pb.h"
#include "coordinator/service/auth_guard.h"
#include "coordinator/state/key_value_store.h"

namespace chorus {

class StoreServiceImpl final : public v1::StoreService::CallbackService {
 public:
  // Longest wait a client may ask for.
  static constexpr double kMaxWaitSeconds = 3600;

  // Calls need a worker or admin token, or the credential of the job whose
  // namespace they name (KeyValueStore::JobOfNamespace), when `auth` is
  // enabled.
  explicit StoreServiceImpl(KeyValueStore& store, const TokenAuthorizer& auth = AllowAll())
      : store_(store), auth_(auth) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const v1::StoreSetRequest* request,
                                v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const v1::StoreGetRequest* request,
                                v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const v1::StoreWaitRequest* request,
                                 v1::StoreWaitResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const v1::StoreAddRequest* request,
                                v1::StoreAddResponse* response) override;

 private:
  // OK if the call may use namespace `ns`.
  absl::Status CheckCaller(const grpc::CallbackServerContext& context, const std::string& ns) const;

  KeyValueStore& store_;
  const TokenAuthorizer& auth_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SERVICE_STORE_SERVICE_H_
