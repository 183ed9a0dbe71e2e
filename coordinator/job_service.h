// JobService: chorus.v1.JobService over a JobManager (callback API; every
// handler answers at once). WatchJob and ListCheckpoints answer UNIMPLEMENTED
// until job events stream and checkpoints exist.
//
// Thread-safety: safe for concurrent calls; `jobs` and `scheduler` must
// outlive the service.
#ifndef CHORUS_COORDINATOR_JOB_SERVICE_H_
#define CHORUS_COORDINATOR_JOB_SERVICE_H_

#include "chorus/v1/coordinator.grpc.pb.h"
#include "coordinator/job_manager.h"
#include "coordinator/scheduler.h"

namespace chorus {

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  JobServiceImpl(JobManager& jobs, Scheduler& scheduler) : jobs_(jobs), scheduler_(scheduler) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::CancelJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJobStatus(grpc::CallbackServerContext* context,
                                         const v1::GetJobStatusRequest* request,
                                         v1::JobStatus* response) override;

 private:
  JobManager& jobs_;
  Scheduler& scheduler_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_JOB_SERVICE_H_
