// AgentService and RankService: gRPC adapters over the Scheduler.
//
// AgentService.Connect is one bidirectional stream per node agent: the first
// message must be a hello; the coordinator answers with a welcome (the agent
// id) and later sends launch and stop orders; the agent reports rank exits.
// When the stream ends, the agent is gone (Scheduler::RemoveAgent), unless
// the coordinator itself is stopping (Note [A stopping coordinator keeps its
// agents]).
//
// RankService.Join parks until the generation completes (DeferredReactor).
// Heartbeat streams each rank's progress, phase and flight-recorder summary
// into the scheduler (shown by `chorus status`); Report records rank 0's
// metrics on the job.
//
// Authorization: AgentService needs a worker (or admin) token. RankService
// also takes a job's credential, for that job only (Note [Job credentials]
// in common/job_credentials.h); when `auth` accepts job credentials, every
// LaunchRanks sent to an agent carries its job's, and the Unix account its
// owner maps to when the token file maps any.
//
// Thread-safety: safe for concurrent calls; `scheduler` must outlive them.
#ifndef CHORUS_COORDINATOR_SERVICE_AGENT_SERVICE_H_
#define CHORUS_COORDINATOR_SERVICE_AGENT_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "chorus/v1/coordinator.grpc.pb.h"
#include "coordinator/scheduling/scheduler.h"
#include "coordinator/service/auth_guard.h"

namespace chorus {

class AgentServiceImpl final : public v1::AgentService::CallbackService {
 public:
  // The owner of a job (Job.owner).
  using OwnerOf = std::function<absl::StatusOr<std::string>(const std::string& job_id)>;

  // Calls need a worker (or admin) token when `auth` is enabled. When
  // `auth`'s token file maps users to Unix accounts, each LaunchRanks
  // names the account of its job's owner (`owner_of`; Note [Rank accounts]
  // in worker/agent/rank_accounts.h).
  explicit AgentServiceImpl(Scheduler& scheduler, const TokenAuthorizer& auth = AllowAll(),
                            OwnerOf owner_of = nullptr)
      : scheduler_(scheduler), auth_(auth), owner_of_(std::move(owner_of)) {}
  grpc::ServerBidiReactor<v1::AgentMessage, v1::CoordinatorMessage>* Connect(
      grpc::CallbackServerContext* context) override;

  // Called before the server shuts down: from then on a stream that ends is
  // the coordinator stopping, not its agent going, and changes no job.
  void Stop() { stopping_->store(true); }

 private:
  Scheduler& scheduler_;
  const TokenAuthorizer& auth_;
  const OwnerOf owner_of_;
  // Shared with the streams, which may end after this service is gone.
  std::shared_ptr<std::atomic<bool>> stopping_ = std::make_shared<std::atomic<bool>>(false);
};

class RankServiceImpl final : public v1::RankService::CallbackService {
 public:
  // Longest a Join may wait for its generation.
  static constexpr absl::Duration kMaxJoinWait = absl::Minutes(30);

  // Calls need a worker or admin token, or the credential of the job they
  // name, when `auth` is enabled.
  explicit RankServiceImpl(Scheduler& scheduler, const TokenAuthorizer& auth = AllowAll())
      : scheduler_(scheduler), auth_(auth) {}
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const v1::JoinRequest* request,
                                 v1::JoinResponse* response) override;
  grpc::ServerBidiReactor<v1::RankHeartbeat, v1::Directive>* Heartbeat(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext* context,
                                   const v1::ReportRequest* request,
                                   v1::ReportResponse* response) override;

 private:
  Scheduler& scheduler_;
  const TokenAuthorizer& auth_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SERVICE_AGENT_SERVICE_H_
