// JobService: chorus.v1.JobService over a JobManager and the Scheduler
// (callback API), checking who may see and act on which job (Note [Roles
// and owners] in common/auth.h). Unary handlers answer at once; WatchJob streams a job's
// events as they are recorded and ends after its final state. ListCheckpoints
// lists the committed checkpoints of a job.
//
// Thread-safety: safe for concurrent calls; `jobs` and `scheduler` must
// outlive the service.
#ifndef CHORUS_COORDINATOR_SERVICE_JOB_SERVICE_H_
#define CHORUS_COORDINATOR_SERVICE_JOB_SERVICE_H_

#include <functional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "coordinator/checkpoint/checkpoint_store.h"
#include "coordinator/scheduling/scheduler.h"
#include "coordinator/service/auth_guard.h"
#include "coordinator/state/job_manager.h"

namespace chorus {

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  // The most jobs one ListJobs reply holds (a full spec each): 1000 jobs
  // of the largest specs stay well inside a reply's limit, and a listing of
  // a long history costs the coordinator one page, not the whole history.
  static constexpr int kListJobsPage = 1000;
  static constexpr size_t kListJobsPageBytes = size_t{4} << 20;

  // When `auth` is enabled, calls need a user or admin token and act only
  // on jobs the caller may read (Note [Roles and owners] in common/auth.h);
  // DrainAgent needs an admin token.
  // `checkpoints` may be null (ListCheckpoints then answers UNIMPLEMENTED).
  JobServiceImpl(JobManager& jobs, Scheduler& scheduler, const TokenAuthorizer& auth = AllowAll(),
                 CheckpointStore* checkpoints = nullptr)
      : jobs_(jobs), scheduler_(scheduler), auth_(auth), checkpoints_(checkpoints) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetQueue(grpc::CallbackServerContext* context,
                                     const v1::GetQueueRequest* request,
                                     v1::GetQueueResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::CancelJobResponse* response) override;
  grpc::ServerUnaryReactor* CheckpointJob(grpc::CallbackServerContext* context,
                                          const v1::CheckpointJobRequest* request,
                                          v1::CheckpointJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJobStatus(grpc::CallbackServerContext* context,
                                         const v1::GetJobStatusRequest* request,
                                         v1::JobStatus* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                   const v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* context,
                                            const v1::ListCheckpointsRequest* request,
                                            v1::ListCheckpointsResponse* response) override;
  grpc::ServerUnaryReactor* GetLogs(grpc::CallbackServerContext* context,
                                    const v1::GetLogsRequest* request,
                                    v1::GetLogsResponse* response) override;
  grpc::ServerUnaryReactor* DrainAgent(grpc::CallbackServerContext* context,
                                       const v1::DrainAgentRequest* request,
                                       v1::DrainAgentResponse* response) override;
  grpc::ServerUnaryReactor* ListAgents(grpc::CallbackServerContext* context,
                                       const v1::ListAgentsRequest* request,
                                       v1::ListAgentsResponse* response) override;
  grpc::ServerUnaryReactor* WhoAmI(grpc::CallbackServerContext* context,
                                   const v1::WhoAmIRequest* request,
                                   v1::WhoAmIResponse* response) override;

  grpc::ServerUnaryReactor* GetLeader(grpc::CallbackServerContext* context,
                                      const v1::GetLeaderRequest* request,
                                      v1::CoordinatorLeader* response) override;

  // http://HOST:PORT of the status page; GetJobStatus then names the job's
  // page (page_url). Empty: no page.
  void set_status_page_base(std::string base);
  // What GetLeader answers (this coordinator, which leads while it serves
  // the JobService); UNIMPLEMENTED until set.
  void set_leader(std::function<v1::CoordinatorLeader()> leader);

 private:
  // The caller, if its token is a user's or an admin's.
  absl::StatusOr<Caller> UserCaller(grpc::CallbackServerContext* context) const;
  // The caller, if it may `action` (e.g. "cancel") job `job_id`: a user or
  // admin token and, for a user, its own job. NOT_FOUND for an unknown job.
  // Fills `job` (may be null) with the job's record.
  absl::StatusOr<Caller> Authorize(grpc::CallbackServerContext* context, const std::string& job_id,
                                   absl::string_view action, v1::Job* job = nullptr) const;

  JobManager& jobs_;
  Scheduler& scheduler_;
  const TokenAuthorizer& auth_;
  CheckpointStore* checkpoints_;
  absl::Mutex page_mu_;
  std::string page_base_ ABSL_GUARDED_BY(page_mu_);
  std::function<v1::CoordinatorLeader()> leader_ ABSL_GUARDED_BY(page_mu_);
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SERVICE_JOB_SERVICE_H_
