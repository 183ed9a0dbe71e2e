#include "coordinator/service/health_service.h"

#include <utility>

namespace chorus {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

HealthWatchStream::Step HealthWatchStream::Notify(ServingStatus status) {
  if (ended_) return Step();
  if (!writing_ && has_sent_ && last_sent_ == status) return Step();
  pending_ = status;
  has_pending_ = true;
  return MaybeWrite();
}

HealthWatchStream::Step HealthWatchStream::End(grpc::Status why) {
  if (ended_) return Step();
  ended_ = true;
  end_status_ = std::move(why);
  if (writing_) return Step();  // finished when the write completes
  return Finish(end_status_);
}

HealthWatchStream::Step HealthWatchStream::WriteDone(bool ok) {
  writing_ = false;
  if (!ok && !ended_) {
    ended_ = true;
    end_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  }
  if (ended_) return Finish(end_status_);
  return MaybeWrite();
}

HealthWatchStream::Step HealthWatchStream::MaybeWrite() {
  Step step;
  if (writing_ || !has_pending_) return step;
  has_pending_ = false;
  if (has_sent_ && last_sent_ == pending_) return step;
  last_sent_ = pending_;
  has_sent_ = true;
  writing_ = true;
  step.write = pending_;
  return step;
}

HealthWatchStream::Step HealthWatchStream::Finish(grpc::Status status) {
  Step step;
  if (finished_) return step;
  finished_ = true;
  step.finish = std::move(status);
  return step;
}

// One Watch stream (Note [A Watch stream finishes once] in
// health_service.h): HealthWatchStream decides, this applies. Deletes itself
// in OnDone.
class HealthService::Watcher : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  Watcher(HealthService* service, std::string name) : service_(service), name_(std::move(name)) {}

  // Queues `status` for sending unless it is what the client already has.
  void Notify(ServingStatus status) {
    absl::MutexLock lock(&mu_);
    Apply(stream_.Notify(status));
  }

  // Ends the stream (server shutting down).
  void End() {
    absl::MutexLock lock(&mu_);
    Apply(stream_.End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down")));
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    Apply(stream_.WriteDone(ok));
  }

  void OnCancel() override { End(); }

  void OnDone() override {
    service_->Remove(this);
    delete this;
  }

 private:
  void Apply(HealthWatchStream::Step step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (step.write.has_value()) {
      response_.set_status(*step.write);
      StartWrite(&response_);
    }
    if (step.finish.has_value()) Finish(*step.finish);
  }

  HealthService* const service_;
  const std::string name_;
  absl::Mutex mu_;
  HealthWatchStream stream_ ABSL_GUARDED_BY(mu_);
  HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);

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
