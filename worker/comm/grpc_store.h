// GrpcStore: a Store served by the coordinator's StoreService, so ranks on
// different machines rendezvous through the coordinator.
//
// Every call carries a deadline: blocking calls use theirs (plus a short
// grace for the network), the others `rpc_timeout`. Errors come back with
// the server's code and message (DEADLINE_EXCEEDED names the missing keys).
//
// Thread-safety: safe for concurrent use; gRPC channels are shared.
//
// Example:
//   GrpcStore store(MakeCoordinatorChannel("127.0.0.1:29650"), "job-7/gen-0");
//   ASSIGN_OR_RETURN(auto comm, CreateGlooCommunicator(options, store));
#ifndef CHORUS_WORKER_COMM_GRPC_STORE_H_
#define CHORUS_WORKER_COMM_GRPC_STORE_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "grpcpp/channel.h"
#include "worker/comm/store.h"

namespace chorus {

class GrpcStore : public Store {
 public:
  GrpcStore(std::shared_ptr<grpc::Channel> channel, std::string ns,
            absl::Duration rpc_timeout = absl::Seconds(30));

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override;
  absl::Status Wait(absl::Span<const std::string> keys, absl::Time deadline) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;

 private:
  std::unique_ptr<v1::StoreService::Stub> stub_;
  const std::string ns_;
  const absl::Duration rpc_timeout_;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_GRPC_STORE_H_
