#include "coordinator/service/agent_service.h"

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "coordinator/service/deferred_reactor.h"
#include "glog/logging.h"

namespace chorus {
namespace {

// One agent's stream. Orders from the scheduler are queued and written one at
// a time; after the stream ends, orders are dropped.
class AgentStream : public grpc::ServerBidiReactor<v1::AgentMessage, v1::CoordinatorMessage> {
 public:
  // `credentials` (may be null: none) mint the credential each launch
  // carries for its job's ranks (Note [Job credentials]).
  // `unix_account_of` (may be empty: none) names the Unix account each
  // launch's ranks run as (Note [Rank accounts] in
  // worker/agent/rank_accounts.h).
  AgentStream(Scheduler& scheduler, const JobCredentials* credentials,
              std::function<std::string(const std::string&)> unix_account_of,
              std::shared_ptr<const std::atomic<bool>> coordinator_stopping)
      : scheduler_(scheduler),
        credentials_(credentials),
        unix_account_of_(std::move(unix_account_of)),
        coordinator_stopping_(std::move(coordinator_stopping)),
        outbox_(std::make_shared<Outbox>()) {
    outbox_->stream = this;
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the agent closed the stream, or the call was cancelled
      outbox_->Close(grpc::Status::OK);
      return;
    }
    if (agent_id_.empty()) {
      if (!in_.has_hello()) {
        outbox_->Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    "the first message on AgentService.Connect must be a hello"));
        return;
      }
      std::shared_ptr<Outbox> outbox = outbox_;
      const JobCredentials* credentials = credentials_;
      // Called after the scheduler's lock is released (Scheduler::Outbox).
      absl::StatusOr<std::string> id = scheduler_.AddAgent(
          in_.hello(), [outbox, credentials,
                        unix_account_of = unix_account_of_](const v1::CoordinatorMessage& m) {
            if ((credentials == nullptr && !unix_account_of) || !m.has_launch()) {
              outbox->Send(m);
              return;
            }
            v1::CoordinatorMessage launch = m;
            const std::string& job_id = m.launch().job_id();
            if (credentials != nullptr) {
              launch.mutable_launch()->set_credential(credentials->For(job_id));
            }
            if (unix_account_of) launch.mutable_launch()->set_unix_account(unix_account_of(job_id));
            outbox->Send(launch);
          });
      if (!id.ok()) {
        outbox_->Close(ToGrpcStatus(id.status()));
        return;
      }
      agent_id_ = *id;
    } else {
      // Note [Joins through the agent]: each join in it waits as long as a
      // rank's own Join may.
      scheduler_.OnAgentMessage(agent_id_, in_, absl::Now() + RankServiceImpl::kMaxJoinWait);
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override { outbox_->WriteDone(ok); }

  // Note [A stopping coordinator keeps its agents]
  // A coordinator that stops (SIGTERM, or a leader that lost its lease) ends
  // every agent's stream itself. Taken as the agents' loss, that would fail
  // every job that is not elastic and re-form every elastic one, and write it
  // to the state store, so that the restarted coordinator (or the next leader)
  // finds the jobs ended. The agents keep their ranks and reconnect to
  // whichever coordinator serves next, which takes the jobs back as after a
  // SIGKILL.
  void OnDone() override {
    if (!agent_id_.empty() && !coordinator_stopping_->load()) scheduler_.RemoveAgent(agent_id_);
    outbox_->Detach();
    delete this;
  }

 private:
  struct Outbox {
    absl::Mutex mu;
    AgentStream* stream ABSL_GUARDED_BY(mu) = nullptr;
    std::deque<v1::CoordinatorMessage> queue ABSL_GUARDED_BY(mu);
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool closing ABSL_GUARDED_BY(mu) = false;
    bool finished ABSL_GUARDED_BY(mu) = false;
    grpc::Status final_status ABSL_GUARDED_BY(mu);
    v1::CoordinatorMessage current ABSL_GUARDED_BY(mu);

    void Send(const v1::CoordinatorMessage& m) {
      absl::MutexLock lock(&mu);
      if (stream == nullptr || closing) return;
      queue.push_back(m);
      PumpLocked();
    }
    void WriteDone(bool ok) {
      absl::MutexLock lock(&mu);
      writing = false;
      if (!ok) closing = true;
      PumpLocked();
    }
    void Close(grpc::Status status) {
      absl::MutexLock lock(&mu);
      if (closing) return;
      closing = true;
      final_status = std::move(status);
      PumpLocked();
    }
    void Detach() {
      absl::MutexLock lock(&mu);
      stream = nullptr;
    }
    // Starts the next write, or finishes once closing and idle.
    void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (stream == nullptr || writing || finished) return;
      if (!closing && !queue.empty()) {
        current = std::move(queue.front());
        queue.pop_front();
        writing = true;
        stream->StartWrite(&current);
      } else if (closing) {
        finished = true;
        stream->Finish(final_status);
      }
    }
  };

  Scheduler& scheduler_;
  const JobCredentials* const credentials_;
  const std::function<std::string(const std::string&)> unix_account_of_;
  const std::shared_ptr<const std::atomic<bool>> coordinator_stopping_;
  std::shared_ptr<Outbox> outbox_;
  v1::AgentMessage in_;
  std::string agent_id_;  // touched only by read callbacks and OnDone, which gRPC serializes
};

// One rank's heartbeat stream: every message updates the scheduler; the
// stream ends when the rank closes it or stops being part of a running job.
class HeartbeatStream : public grpc::ServerBidiReactor<v1::RankHeartbeat, v1::Directive> {
 public:
  // Every heartbeat must be for a job `caller` may act for.
  HeartbeatStream(Scheduler& scheduler, Caller caller)
      : scheduler_(scheduler), caller_(std::move(caller)) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    if (absl::Status s = caller_.CheckJob(in_.job_id(), "send heartbeats"); !s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    directive_.Clear();
    live_ = scheduler_.Heartbeat(in_, &directive_);
    if (directive_.kind() != v1::Directive::KIND_UNSPECIFIED) {
      // A directive goes out just before the stream ends (the rank reads
      // it as it arrives, Note [Directives are read at once] in
      // worker/runtime/heartbeat_stream.cc): RE_RENDEZVOUS ends it as
      // stale, REFORM_AT_STEP_BOUNDARY (a planned change) with OK, and the
      // rank opens a new one.
      StartWrite(&directive_);
    } else if (!live_) {
      FinishStale();
    } else {
      StartRead(&in_);
    }
  }
  void OnWriteDone(bool /*ok*/) override {
    if (live_) {
      Finish(grpc::Status::OK);
    } else {
      FinishStale();
    }
  }
  void OnDone() override { delete this; }

 private:
  void FinishStale() {
    Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "rank " + std::to_string(in_.rank()) + " of generation " +
                            std::to_string(in_.generation()) + " is not part of running job " +
                            in_.job_id()));
  }

  Scheduler& scheduler_;
  const Caller caller_;
  v1::RankHeartbeat in_;
  v1::Directive directive_;
  bool live_ = true;  // touched only by callbacks, which gRPC serializes
};

}  // namespace

grpc::ServerBidiReactor<v1::RankHeartbeat, v1::Directive>* RankServiceImpl::Heartbeat(
    grpc::CallbackServerContext* context) {
  absl::StatusOr<Caller> caller = auth_.Identify(context->client_metadata());
  if (!caller.ok()) return new RejectedStream<v1::RankHeartbeat, v1::Directive>(caller.status());
  return new HeartbeatStream(scheduler_, *std::move(caller));
}

grpc::ServerBidiReactor<v1::AgentMessage, v1::CoordinatorMessage>* AgentServiceImpl::Connect(
    grpc::CallbackServerContext* context) {
  if (absl::Status s = auth_.Check(context->client_metadata(), Role::kAgent); !s.ok()) {
    return new RejectedStream<v1::AgentMessage, v1::CoordinatorMessage>(s);
  }
  std::function<std::string(const std::string&)> unix_account_of;
  if (auth_.maps_unix_accounts() && owner_of_) {
    unix_account_of = [auth = &auth_, owner_of = owner_of_](const std::string& job_id) {
      absl::StatusOr<std::string> owner = owner_of(job_id);
      return owner.ok() ? auth->UnixAccountOf(*owner) : std::string();
    };
  }
  return new AgentStream(scheduler_, auth_.enabled() ? auth_.job_credentials() : nullptr,
                         std::move(unix_account_of), stopping_);
}

grpc::ServerUnaryReactor* RankServiceImpl::Join(grpc::CallbackServerContext* context,
                                                const v1::JoinRequest* request,
                                                v1::JoinResponse* response) {
  if (absl::Status s = auth_.CheckJob(context->client_metadata(), request->job_id(), "join");
      !s.ok()) {
    return Reject(context, s);
  }
  auto* reactor = new DeferredReactor<v1::JoinResponse>(response);
  const absl::Time client_deadline = absl::FromChrono(context->deadline());
  const absl::Time deadline = std::min(client_deadline, absl::Now() + kMaxJoinWait);
  scheduler_.Join(*request, deadline, reactor->Completion());
  return reactor;
}

grpc::ServerUnaryReactor* RankServiceImpl::Report(grpc::CallbackServerContext* context,
                                                  const v1::ReportRequest* request,
                                                  v1::ReportResponse* /*response*/) {
  if (absl::Status s = auth_.CheckJob(context->client_metadata(), request->job_id(), "report");
      !s.ok()) {
    return Reject(context, s);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(scheduler_.Report(*request)));
  return reactor;
}

}  // namespace chorus
