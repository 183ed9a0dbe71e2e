// HealthService: grpc.health.v1.Health for the coordinator, on gRPC's
// callback API (no thread is held per call or per watcher).
//
// The empty service name "" is the whole server. Check answers at once; Watch
// sends the current status and then every change until the client leaves or
// the server shuts down.
//
// Thread-safety: SetStatus/Shutdown may be called from any thread.
//
// Example:
//   HealthService health;
//   builder.RegisterService(&health);
//   health.SetStatus("", HealthCheckResponse::SERVING);
#ifndef CHORUS_COORDINATOR_SERVICE_HEALTH_SERVICE_H_
#define CHORUS_COORDINATOR_SERVICE_HEALTH_SERVICE_H_

#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace chorus {

// Note [A Watch stream finishes once]
// A callback reactor must call Finish exactly once, or grpc::Server::Shutdown
// waits for it forever: a follower that was elected hung there, never
// serving as the leader, when a client opened a Watch just before (its first
// write was in flight when Shutdown ended the stream, and the write's
// failed completion finished nothing). So what a Watch stream does next is
// decided here, apart from gRPC, for every order in which a status change,
// its end (the server shutting down, the client cancelling) and write
// completions come: at most one write in flight, the newest status not yet
// sent waiting, and one Finish after the last write has completed.
class HealthWatchStream {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;
  // What the reactor does now: start a write of `write`, then (or instead)
  // finish the call with `finish`.
  struct Step {
    std::optional<ServingStatus> write;
    std::optional<grpc::Status> finish;
  };

  // The service's status is `status`: sent unless the client has it.
  Step Notify(ServingStatus status);
  // The stream is to end with `why` (shutdown, cancellation): at once, or
  // once the write in flight completes.
  Step End(grpc::Status why);
  // The write in flight completed; `ok` false: the call is gone.
  Step WriteDone(bool ok);
  bool finished() const { return finished_; }

 private:
  Step MaybeWrite();
  Step Finish(grpc::Status status);

  bool writing_ = false;
  bool ended_ = false;
  bool finished_ = false;
  grpc::Status end_status_;
  bool has_pending_ = false;
  bool has_sent_ = false;
  ServingStatus pending_ = grpc::health::v1::HealthCheckResponse::UNKNOWN;
  ServingStatus last_sent_ = grpc::health::v1::HealthCheckResponse::UNKNOWN;
};

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  HealthService() = default;
  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;
  ~HealthService() override;

  // Sets the status of `service` ("" for the server) and notifies watchers.
  void SetStatus(const std::string& service, ServingStatus status);
  // Marks everything NOT_SERVING and finishes every Watch stream; later
  // watchers are refused. Call before grpc::Server::Shutdown.
  void Shutdown();

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  class Watcher;
  friend class Watcher;

  // The status of `service`, SERVICE_UNKNOWN if never set.
  ServingStatus StatusOf(const std::string& service) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remove(Watcher* watcher);

  absl::Mutex mu_;
  std::map<std::string, ServingStatus> statuses_ ABSL_GUARDED_BY(mu_);
  std::set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar watchers_gone_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SERVICE_HEALTH_SERVICE_H_
