#include "coordinator/service/job_service.h"

#include <deque>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"

namespace chorus {
namespace {

// Finishes a unary call with `result`'s status, copying its value on success.
template <typename T, typename Fill>
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                 const absl::StatusOr<T>& result, Fill fill) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (result.ok()) fill(*result);
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

// One WatchJob call: replays the events after after_seq, then writes each new
// one as the JobManager records it, one write at a time; finishes once every
// event is written and the job has ended, or when the client goes away.
class WatchReactor : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  WatchReactor(JobManager& jobs, std::string job_id, int64_t after_seq)
      : jobs_(jobs), job_id_(std::move(job_id)), last_seq_(after_seq) {
    subscription_ = jobs_.Subscribe(job_id_, [this] { Pump(); });
    Pump();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away"));
      return;
    }
    PumpLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    if (!writing_) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    cancelled_ = true;
  }

  void OnDone() override {
    jobs_.Unsubscribe(subscription_);
    delete this;
  }

 private:
  void Pump() {
    absl::MutexLock lock(&mu_);
    PumpLocked();
  }

  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_) return;
    if (cancelled_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      return;
    }
    // The job's state is read before its events: a job's final-state event is
    // stored before the job shows that state, so an ended job's events read
    // afterwards include it.
    absl::StatusOr<v1::Job> job = jobs_.Get(job_id_);
    if (!job.ok()) {
      FinishLocked(ToGrpcStatus(job.status()));
      return;
    }
    absl::StatusOr<std::vector<v1::JobEvent>> events = jobs_.Events(job_id_, last_seq_);
    if (!events.ok()) {
      FinishLocked(ToGrpcStatus(events.status()));
      return;
    }
    if (events->empty()) {
      if (JobManager::IsTerminal(job->state())) FinishLocked(grpc::Status::OK);
      return;
    }
    current_ = std::move(events->front());
    last_seq_ = current_.seq();
    writing_ = true;
    StartWrite(&current_);
  }

  void FinishLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(std::move(status));
  }

  JobManager& jobs_;
  const std::string job_id_;
  int64_t subscription_ = 0;
  absl::Mutex mu_;
  int64_t last_seq_ ABSL_GUARDED_BY(mu_);
  v1::JobEvent current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// What a user sees of another user's job in a listing (Note [Roles and
// owners] in common/auth.h): who, what state, how many ranks, when; not
// what it runs, why it ended, its metrics or where it runs.
v1::Job ListView(const v1::Job& job) {
  v1::Job view;
  view.set_job_id(job.job_id());
  view.set_owner(job.owner());
  view.set_state(job.state());
  view.set_generation(job.generation());
  view.set_world_size(job.world_size());
  view.set_submit_time_us(job.submit_time_us());
  view.set_start_time_us(job.start_time_us());
  view.set_end_time_us(job.end_time_us());
  view.mutable_spec()->set_name(job.spec().name());
  *view.mutable_spec()->mutable_resources() = job.spec().resources();
  return view;
}

}  // namespace

absl::StatusOr<Caller> JobServiceImpl::UserCaller(grpc::CallbackServerContext* context) const {
  absl::StatusOr<Caller> caller = auth_.Identify(context->client_metadata());
  if (!caller.ok()) return caller.status();
  if (absl::Status s = caller->CheckRole(Role::kUser); !s.ok()) return s;
  return caller;
}

absl::StatusOr<Caller> JobServiceImpl::Authorize(grpc::CallbackServerContext* context,
                                                 const std::string& job_id,
                                                 absl::string_view action, v1::Job* job) const {
  absl::StatusOr<Caller> caller = UserCaller(context);
  if (!caller.ok()) return caller.status();
  absl::StatusOr<v1::Job> record = jobs_.Get(job_id);
  if (!record.ok()) return record.status();
  if (absl::Status s = caller->CheckOwner(job_id, record->owner(), action); !s.ok()) return s;
  if (job != nullptr) *job = *std::move(record);
  return caller;
}

grpc::ServerWriteReactor<v1::JobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  if (absl::StatusOr<Caller> caller = Authorize(context, request->job_id(), "watch");
      !caller.ok()) {
    return new RejectedWriter<v1::JobEvent>(caller.status());
  }
  return new WatchReactor(jobs_, request->job_id(), request->after_seq());
}

grpc::ServerUnaryReactor* JobServiceImpl::ListCheckpoints(grpc::CallbackServerContext* context,
                                                          const v1::ListCheckpointsRequest* request,
                                                          v1::ListCheckpointsResponse* response) {
  if (absl::StatusOr<Caller> caller =
          Authorize(context, request->job_id(), "list the checkpoints of");
      !caller.ok()) {
    return Reject(context, caller.status());
  }
  if (checkpoints_ == nullptr) {
    return Reject(context, absl::UnimplementedError("this coordinator keeps no checkpoints"));
  }
  absl::StatusOr<std::vector<v1::CheckpointManifest>> list = checkpoints_->List(request->job_id());
  return Answer(context, list, [response](const std::vector<v1::CheckpointManifest>& all) {
    for (const v1::CheckpointManifest& m : all) *response->add_checkpoints() = m;
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetLogs(grpc::CallbackServerContext* context,
                                                  const v1::GetLogsRequest* request,
                                                  v1::GetLogsResponse* response) {
  if (request->max_lines() < 0) {
    return Reject(context, absl::InvalidArgumentError("max_lines must be >= 0"));
  }
  if (absl::StatusOr<Caller> caller = Authorize(context, request->job_id(), "read the logs of");
      !caller.ok()) {
    return Reject(context, caller.status());
  }
  return Answer(context, scheduler_.reads().GetLogs(*request),
                [response](const v1::GetLogsResponse& r) { *response = r; });
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const v1::SubmitJobRequest* request,
                                                    v1::SubmitJobResponse* response) {
  absl::StatusOr<Caller> caller = UserCaller(context);
  if (!caller.ok()) return Reject(context, caller.status());
  // Resuming reads the source's checkpoints: only from a job the caller may
  // read (an unknown source is Submit's NOT_FOUND).
  const std::string source = request->resume_from().substr(0, request->resume_from().find(':'));
  if (!source.empty()) {
    absl::StatusOr<v1::Job> from = jobs_.Get(source);
    absl::Status s =
        from.ok() ? caller->CheckOwner(source, from->owner(), "resume from") : absl::OkStatus();
    if (!s.ok()) return Reject(context, s);
  }
  // A job no connected agent could hold is refused now rather than queued
  // for ever or started to die allocating.
  if (absl::Status s = scheduler_.reads().CheckAgentsCanHold(request->spec()); !s.ok()) {
    return Reject(context, s);
  }
  // The priority ceiling and queued-job limit of the scheduling policy
  // (two submissions at the same instant may both pass the last free place
  // in a user's queue).
  if (absl::Status s = scheduler_.reads().CheckSubmission(request->spec(), caller->user());
      !s.ok()) {
    return Reject(context, s);
  }
  absl::StatusOr<v1::Job> job =
      jobs_.Submit(request->spec(), request->resume_from(), caller->user());
  if (job.ok()) scheduler_.Schedule();
  return Answer(context, job,
                [response](const v1::Job& job) { response->set_job_id(job.job_id()); });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetQueue(grpc::CallbackServerContext* context,
                                                   const v1::GetQueueRequest* request,
                                                   v1::GetQueueResponse* response) {
  // Every user sees the whole queue (ids, names, owners, priorities and
  // reasons; no specs): where their own jobs stand depends on the others.
  if (absl::StatusOr<Caller> caller = UserCaller(context); !caller.ok()) {
    return Reject(context, caller.status());
  }
  *response = scheduler_.reads().Queue();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const v1::GetJobRequest* request,
                                                 v1::Job* response) {
  v1::Job job;
  if (absl::StatusOr<Caller> caller = Authorize(context, request->job_id(), "read", &job);
      !caller.ok()) {
    return Reject(context, caller.status());
  }
  *response = std::move(job);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const v1::ListJobsRequest* request,
                                                   v1::ListJobsResponse* response) {
  absl::StatusOr<Caller> caller = UserCaller(context);
  if (!caller.ok()) return Reject(context, caller.status());
  std::vector<v1::Job::State> states;
  for (int s : request->states()) states.push_back(static_cast<v1::Job::State>(s));
  if (request->limit() < 0) {
    return Reject(context, absl::InvalidArgumentError("limit must be >= 0"));
  }
  // One more than the page, to tell whether older jobs remain; a page also
  // ends once it holds kListJobsPageBytes (every job has its spec).
  const int page =
      request->limit() == 0 ? kListJobsPage : std::min(request->limit(), kListJobsPage);
  absl::StatusOr<std::vector<v1::Job>> listed = jobs_.List(states, page + 1, request->page_token());
  if (!listed.ok()) return Reject(context, listed.status());
  std::vector<v1::Job>& list = *listed;
  size_t bytes = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    bytes += list[i].ByteSizeLong();
    if (static_cast<int>(i) == page || (i > 0 && bytes > kListJobsPageBytes)) {
      list.resize(i);
      response->set_next_page_token(list.back().job_id());
      break;
    }
  }
  for (v1::Job& job : list) {
    const bool readable = caller->CheckOwner(job.job_id(), job.owner(), "read").ok();
    *response->add_jobs() = readable ? std::move(job) : ListView(job);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const v1::CancelJobRequest* request,
                                                    v1::CancelJobResponse* response) {
  if (absl::StatusOr<Caller> caller = Authorize(context, request->job_id(), "cancel");
      !caller.ok()) {
    return Reject(context, caller.status());
  }
  return Answer(context, scheduler_.Cancel(request->job_id(), request->reason()),
                [response](const v1::Job& job) { *response->mutable_job() = job; });
}

grpc::ServerUnaryReactor* JobServiceImpl::CheckpointJob(grpc::CallbackServerContext* context,
                                                        const v1::CheckpointJobRequest* request,
                                                        v1::CheckpointJobResponse* response) {
  if (absl::StatusOr<Caller> caller = Authorize(context, request->job_id(), "checkpoint");
      !caller.ok()) {
    return Reject(context, caller.status());
  }
  int64_t newest = 0;
  if (checkpoints_ != nullptr) {
    absl::StatusOr<std::vector<v1::CheckpointManifest>> list =
        checkpoints_->List(request->job_id());
    if (list.ok() && !list->empty()) newest = list->back().step();
  }
  absl::StatusOr<int64_t> step = scheduler_.RequestCheckpoint(request->job_id());
  return Answer(context, step, [response, newest](int64_t s) {
    response->set_step(s);
    response->set_newest_checkpoint_step(newest);
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJobStatus(grpc::CallbackServerContext* context,
                                                       const v1::GetJobStatusRequest* request,
                                                       v1::JobStatus* response) {
  if (absl::StatusOr<Caller> caller = Authorize(context, request->job_id(), "read the status of");
      !caller.ok()) {
    return Reject(context, caller.status());
  }
  absl::StatusOr<v1::JobStatus> status = jobs_.Status(request->job_id());
  if (status.ok()) {
    StatusRows rows;
    rows.offset = request->rank_offset();
    rows.limit = request->rank_limit() > 0 ? request->rank_limit() : kDefaultStatusRankRows;
    scheduler_.reads().FillStatus(request->job_id(), *status, rows);
    // A running job's rows say where its ranks run; the recorded placements
    // (one per rank, for a restart) would only make the answer O(ranks).
    if (status->rank_summary().ranks() > 0) status->mutable_job()->clear_placements();
    absl::MutexLock lock(&page_mu_);
    if (!page_base_.empty())
      status->set_page_url(absl::StrCat(page_base_, "/jobs/", request->job_id()));
  }
  return Answer(context, status, [response](const v1::JobStatus& s) { *response = s; });
}

grpc::ServerUnaryReactor* JobServiceImpl::DrainAgent(grpc::CallbackServerContext* context,
                                                     const v1::DrainAgentRequest* request,
                                                     v1::DrainAgentResponse* response) {
  if (absl::Status s = auth_.Check(context->client_metadata(), Role::kAdmin); !s.ok()) {
    return Reject(context, s);
  }
  return Answer(context, scheduler_.DrainAgent(request->agent()),
                [response](const v1::AgentInfo& agent) { *response->mutable_agent() = agent; });
}

grpc::ServerUnaryReactor* JobServiceImpl::ListAgents(grpc::CallbackServerContext* context,
                                                     const v1::ListAgentsRequest* /*request*/,
                                                     v1::ListAgentsResponse* response) {
  if (absl::Status s = auth_.Check(context->client_metadata(), Role::kUser); !s.ok()) {
    return Reject(context, s);
  }
  for (v1::AgentInfo& agent : scheduler_.reads().ListAgents())
    *response->add_agents() = std::move(agent);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::WhoAmI(grpc::CallbackServerContext* context,
                                                 const v1::WhoAmIRequest* /*request*/,
                                                 v1::WhoAmIResponse* response) {
  absl::StatusOr<Caller> caller = auth_.Identify(context->client_metadata());
  if (!caller.ok()) return Reject(context, caller.status());
  response->set_user(caller->user());
  response->set_role(RoleName(caller->role()));
  response->set_tokens_required(auth_.enabled());
  if (caller->role() == Role::kJob) response->set_job_id(caller->job_id());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

void JobServiceImpl::set_status_page_base(std::string base) {
  absl::MutexLock lock(&page_mu_);
  page_base_ = std::move(base);
}

void JobServiceImpl::set_leader(std::function<v1::CoordinatorLeader()> leader) {
  absl::MutexLock lock(&page_mu_);
  leader_ = std::move(leader);
}

grpc::ServerUnaryReactor* JobServiceImpl::GetLeader(grpc::CallbackServerContext* context,
                                                    const v1::GetLeaderRequest* /*request*/,
                                                    v1::CoordinatorLeader* response) {
  if (absl::Status s = auth_.Check(context->client_metadata(), Role::kAdmin); !s.ok()) {
    return Reject(context, s);
  }
  std::function<v1::CoordinatorLeader()> leader;
  {
    absl::MutexLock lock(&page_mu_);
    leader = leader_;
  }
  if (!leader) return Reject(context, absl::UnimplementedError("this coordinator names no leader"));
  *response = leader();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace chorus
