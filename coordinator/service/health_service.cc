#include "coordinator/service/health_service.h"

#include <utility>

namespace chorus {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch stream. Writes are serialized: at most one in flight, and the
// newest status not yet sent waits in `pending_`. Deletes itself in OnDone.
class HealthService::Watcher : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  Watcher(HealthService* service, std::string name) : service_(service), name_(std::move(name)) {}

  // Queues `status` for sending unless it is what the client already has.
  void Notify(ServingStatus status) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!writing_ && has_sent_ && last_sent_ == status) return;
    pending_ = status;
    has_pending_ = true;
    MaybeWriteLocked();
  }

  // Ends the stream (server shutting down).
  void End() {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    if (!writing_) Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down"));
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      if (!finished_) {
        finished_ = true;
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      }
      return;
    }
    if (finished_) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down"));
      return;
    }
    MaybeWriteLocked();
  }

  void OnCancel() override { End(); }

  void OnDone() override {
    service_->Remove(this);
    delete this;
  }

 private:
  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || !has_pending_) return;
    if (has_sent_ && last_sent_ == pending_) {
      has_pending_ = false;
      return;
    }
    response_.set_status(pending_);
    last_sent_ = pending_;
    has_sent_ = true;
    has_pending_ = false;
    writing_ = true;
    StartWrite(&response_);
  }

  HealthService* const service_;
  const std::string name_;
  absl::Mutex mu_;
  HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool has_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool has_sent_ ABSL_GUARDED_BY(mu_) = false;
  ServingStatus pending_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  ServingStatus last_sent_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;

  friend class HealthService;
  const std::string& name() const { return name_; }
};

HealthService::~HealthService() {
  Shutdown();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::set<Watcher*>* w) { return w->empty(); }, &watchers_));
}

HealthService::ServingStatus HealthService::StatusOf(const std::string& service) {
  auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN : it->second;
}

void HealthService::SetStatus(const std::string& service, ServingStatus status) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  statuses_[service] = status;
  for (Watcher* w : watchers_) {
    if (w->name() == service) w->Notify(status);
  }
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  for (auto& [name, status] : statuses_) status = HealthCheckResponse::NOT_SERVING;
  for (Watcher* w : watchers_) w->End();
}

void HealthService::Remove(Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watcher);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::MutexLock lock(&mu_);
  ServingStatus status = StatusOf(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 "unknown service \"" + request->service() + "\""));
    return reactor;
  }
  response->set_status(status);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* context, const HealthCheckRequest* request) {
  auto* watcher = new Watcher(this, request->service());
  absl::MutexLock lock(&mu_);
  if (shut_down_) {
    watcher->End();
    watchers_.insert(watcher);  // removed again in OnDone
    return watcher;
  }
  watchers_.insert(watcher);
  watcher->Notify(StatusOf(request->service()));
  return watcher;
}

}  // namespace chorus
