// GrpcStore: a Store served by the coordinator's StoreService, so ranks on
// different machines rendezvous through the coordinator.
//
// Every call carries a deadline: blocking calls use theirs (plus a short
// grace for the network), the others `rpc_timeout`. Errors come back with
// the server's code and message (DEADLINE_EXCEEDED names the missing keys).
// Set, Get and Wait outlive the coordinator serving them (Note [Store after a
// takeover]): on UNAVAILABLE they set this client's keys again and retry
// within their deadline; Add does not (a sum cannot be replayed).
//
// Thread-safety: safe for concurrent use; gRPC channels are shared.
//
// Example:
//   GrpcStore store(MakeCoordinatorChannel("127.0.0.1:29650"), "job-7/gen-0");
//   ASSIGN_OR_RETURN(auto comm, CreateGlooCommunicator(options, store));
#ifndef CHORUS_WORKER_COMM_GRPC_STORE_H_
#define CHORUS_WORKER_COMM_GRPC_STORE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
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
  absl::Status SetOnce(const std::string& key, const std::string& value, absl::Time deadline);
  // Runs `attempt` until it returns anything but UNAVAILABLE or `deadline`
  // passes, setting this client's keys again before each retry.
  absl::Status Retrying(absl::Time deadline, const std::function<absl::Status()>& attempt);

  std::unique_ptr<v1::StoreService::Stub> stub_;
  const std::string ns_;
  const absl::Duration rpc_timeout_;
  absl::Mutex mu_;
  // Every key this client set, with its latest value.
  std::map<std::string, std::string> mine_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_GRPC_STORE_H_
