#include "coordinator/job_service.h"

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

}  // namespace

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const v1::SubmitJobRequest* request,
                                                    v1::SubmitJobResponse* response) {
  absl::StatusOr<v1::Job> job = jobs_.Submit(request->spec(), request->resume_from());
  if (job.ok()) scheduler_.Schedule();
  return Answer(context, job,
                [response](const v1::Job& job) { response->set_job_id(job.job_id()); });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const v1::GetJobRequest* request,
                                                 v1::Job* response) {
  return Answer(context, jobs_.Get(request->job_id()),
                [response](const v1::Job& job) { *response = job; });
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const v1::ListJobsRequest* request,
                                                   v1::ListJobsResponse* response) {
  std::vector<v1::Job::State> states;
  for (int s : request->states()) states.push_back(static_cast<v1::Job::State>(s));
  absl::StatusOr<std::vector<v1::Job>> jobs =
      request->limit() < 0 ? absl::StatusOr<std::vector<v1::Job>>(
                                 absl::InvalidArgumentError("limit must be >= 0"))
                           : jobs_.List(states, request->limit());
  return Answer(context, jobs, [response](const std::vector<v1::Job>& list) {
    for (const v1::Job& job : list) *response->add_jobs() = job;
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const v1::CancelJobRequest* request,
                                                    v1::CancelJobResponse* response) {
  return Answer(context, scheduler_.Cancel(request->job_id(), request->reason()),
                [response](const v1::Job& job) { *response->mutable_job() = job; });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJobStatus(grpc::CallbackServerContext* context,
                                                       const v1::GetJobStatusRequest* request,
                                                       v1::JobStatus* response) {
  absl::StatusOr<v1::JobStatus> status = jobs_.Status(request->job_id());
  if (status.ok()) scheduler_.FillStatus(request->job_id(), *status);
  return Answer(context, status, [response](const v1::JobStatus& s) { *response = s; });
}

}  // namespace chorus
