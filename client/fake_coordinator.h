// FakeCoordinator: the coordinator's client-facing services in memory, for
// the chorus commands' tests: JobService (submit, get, list, cancel, status,
// checkpoints, whoami), grpc.health.v1 Check and CheckpointService.Download, served
// on 127.0.0.1 with port 0. It answers from what the test put in, as the
// coordinator would (NOT_FOUND naming an unknown job, ids job-000001, ...),
// and records every request it received.
//
// Thread-safety: the handlers run on gRPC's threads; every method may be
// called from any thread.
//
// Example:
//   FakeCoordinator coordinator;
//   ASSERT_TRUE(coordinator.Start().ok());
//   coordinator.AddJob(job);
//   global.channel = coordinator.channel();
//   ... run `chorus cancel job-000001` ...
//   EXPECT_EQ(coordinator.cancels()[0].job_id(), "job-000001");
#ifndef CHORUS_CLIENT_FAKE_COORDINATOR_H_
#define CHORUS_CLIENT_FAKE_COORDINATOR_H_

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace chorus::client {

class FakeCoordinator {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  FakeCoordinator();
  FakeCoordinator(const FakeCoordinator&) = delete;
  FakeCoordinator& operator=(const FakeCoordinator&) = delete;
  ~FakeCoordinator();  // stops the server

  // Starts serving on 127.0.0.1 at `port`, by default a free one.
  absl::Status Start(int port = 0);
  // "127.0.0.1:PORT"; REQUIRES: Start() succeeded.
  const std::string& address() const { return address_; }
  // An insecure channel to address().
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }

  // What it answers. A job is listed (in the order added), got and
  // cancelled; its status is `job` and no ranks unless SetJobStatus.
  void AddJob(const v1::Job& job);
  void SetJobStatus(const v1::JobStatus& status);
  // A connected agent, listed by ListAgents; DrainAgent (by id or host)
  // makes it DRAINING, or DRAINED when it has no busy slot.
  void AddAgent(const v1::AgentInfo& agent);
  // What GetQueue answers (default: an empty queue).
  void SetQueue(const v1::GetQueueResponse& queue);
  void SetCheckpoints(const std::string& job_id, std::vector<v1::CheckpointManifest> manifests);
  // The file Download serves for (job_id, step, name); step 0 in a request
  // means the newest step stored for the job.
  void SetCheckpointFile(const std::string& job_id, int64_t step, const std::string& name,
                         std::string bytes);
  // Downloads send a chunk whose CRC-32C does not match its data.
  void set_damage_downloads(bool damage);
  void set_health(ServingStatus status);
  // What GetLeader answers; with set_follower_of, UNAVAILABLE and trailing
  // metadata "chorus-leader: ADDRESS", as a follower coordinator does.
  void set_leader(const v1::CoordinatorLeader& leader);
  void set_follower_of(const std::string& leader_address);
  // With a non-empty `why`, GetLeader and ListJobs answer UNAVAILABLE `why`
  // with trailing metadata "chorus-no-leader: WHY", as a follower does to
  // every call while no coordinator can lead (etcd without quorum).
  void set_no_leader(const std::string& why);
  // What WhoAmI answers (default: an anonymous admin, no token file).
  void set_whoami(const v1::WhoAmIResponse& me);

  // Requests as received, oldest first.
  std::vector<v1::SubmitJobRequest> submits() const;
  std::vector<v1::ListJobsRequest> list_jobs_requests() const;
  std::vector<v1::GetJobStatusRequest> status_requests() const;
  std::vector<v1::CancelJobRequest> cancels() const;
  std::vector<v1::DrainAgentRequest> drains() const;
  std::vector<v1::ListCheckpointsRequest> list_checkpoints_requests() const;
  std::vector<v1::DownloadCheckpointRequest> downloads() const;
  int health_checks() const;
  // Every call of every service.
  int calls() const;

 private:
  class Jobs;
  class Health;
  class Checkpoints;

  absl::Status NotFound(const std::string& job_id) const;

  std::unique_ptr<Jobs> jobs_service_;
  std::unique_ptr<Health> health_service_;
  std::unique_ptr<Checkpoints> checkpoint_service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;

  mutable absl::Mutex mu_;
  std::vector<v1::Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, v1::JobStatus> statuses_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<v1::CheckpointManifest>> checkpoints_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, int64_t, std::string>, std::string> files_ ABSL_GUARDED_BY(mu_);
  bool damage_downloads_ ABSL_GUARDED_BY(mu_) = false;
  ServingStatus health_ ABSL_GUARDED_BY(mu_) = grpc::health::v1::HealthCheckResponse::SERVING;
  v1::WhoAmIResponse whoami_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::SubmitJobRequest> submits_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ListJobsRequest> list_jobs_requests_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::GetJobStatusRequest> status_requests_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::CancelJobRequest> cancels_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::AgentInfo> agents_ ABSL_GUARDED_BY(mu_);
  v1::GetQueueResponse queue_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::DrainAgentRequest> drains_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ListCheckpointsRequest> list_checkpoints_requests_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::DownloadCheckpointRequest> downloads_ ABSL_GUARDED_BY(mu_);
  int health_checks_ ABSL_GUARDED_BY(mu_) = 0;
  v1::CoordinatorLeader leader_ ABSL_GUARDED_BY(mu_);
  std::string follower_of_ ABSL_GUARDED_BY(mu_);
  std::string no_leader_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace chorus::client

#endif  // CHORUS_CLIENT_FAKE_COORDINATOR_H_
