#include "client/fake_coordinator.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/sha256.h"

namespace chorus::client {
namespace {

// Download chunks are small so that a test file spans several of them.
constexpr size_t kChunkBytes = 64 << 10;

}  // namespace

class FakeCoordinator::Jobs final : public v1::JobService::Service {
 public:
  explicit Jobs(FakeCoordinator& owner) : owner_(owner) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override {
    absl::MutexLock lock(&owner_.mu_);
    ++owner_.calls_;
    owner_.submits_.push_back(*request);
    v1::Job job;
    job.set_job_id(absl::StrFormat("job-%06d", owner_.jobs_.size() + 1));
    *job.mutable_spec() = request->spec();
    job.set_state(v1::Job::PENDING);
    owner_.jobs_.push_back(job);
    response->set_job_id(job.job_id());
    return grpc::Status::OK;
  }

  grpc::Status WhoAmI(grpc::ServerContext*, const v1::WhoAmIRequest*,
                      v1::WhoAmIResponse* response) override {
    absl::MutexLock lock(&owner_.mu_);
    ++owner_.calls_;
    *response = owner_.whoami_;
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::Job* response) override {
    absl::MutexLock lock(&owner_.mu_);
    ++owner_.calls_;
    v1::Job* job = Find(request->job_id());
    if (job == nullptr) return ToGrpcStatus(owner_.NotFound(request->job_id()));
    *response = *job;
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override {
    absl::MutexLock lock(&owner_.mu_);
    ++owner_.calls_;
    if (!owner_.no_leader_.empty()) {
      context->AddTrailingMetadata("chorus-no-leader", owner_.no_leader_);
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, owner_.no_leader_);
    }
    owner_.list_jobs_requests_.push_back(*request);
    // Pages as the coordinator's do, three jobs at most (the coordinator's
    // page is larger); the token here is an index into jobs_.
    constexpr int kPage = 3;
    const int page = request->limit() == 0 ? kPage : std::min(request->limit(), kPage);
    size_t from = 0;
    if (!request->page_token().empty() && !absl::SimpleAtoi(request->page_token(), &from)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad page_token");
    }
    for (size_t i = from; i < owner_.jobs_.size(); ++i) {
      const v1::Job& job = owner_.jobs_[i];
      const bool wanted =
          request->states().empty() || std::find(request->states().begin(), request->states().end(),
                                                 job.state()) != request->states().end();
      if (!wanted) continue;
      if (response->jobs_size() == page) {
        response->set_next_page_token(std::to_string(i));
        break;
      }
      *response->add_jobs() = job;
    }
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                         v1::CancelJobResponse* response) override {
    absl::MutexLock lock(&owner_.mu_);
    ++owner_.calls_;
    owner_.cancels_.push_back(*request);
    v1::Job* job = Find(request->job_id());
    if (job == nullptr) return ToGrpcStatus(owner_.NotFound(request->job_id()));
    if (job->state() == v1::Job::SUCCEEDED || job->state() == v1::Job::FAILED ||
        job->state() == v1::Job::CANCELLED) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("job ", job->job_id(),
                                       " already ended: ", v1::Job::State_Name(job->state())));
    }
    job->set_state(v1::Job::CANCELLED);
    job->set_reason(request->reason());
    *response->mutable_job() = *job;
    return grpc::Status::OK;
  }

  grpc::Status GetJobStatus(grpc::ServerContext*, const v1::GetJobStatusRequest* request,
                            v1::JobStatus* response) override {
    absl::MutexLock lock(&owner_.mu_);
    ++owner_.calls_;
    owner_.status_requests_.push_back(*request);
    auto it = owner_.statuses_.find(request->job_id());
    if (it != owner_.statuses_.end()) {
      *response = it->second;
      return grpc::Status::OK;
    }
    v1::Job* job = Find(request->job_id());
    if (job == nullptr) return ToGrpcStatus(owner_.NotFound(request->job_id()));
    *response->mutable_job() = *job;
    return grpc::Status::OK;
  }

  // An agent drains at once if it has no busy slot (DRAINED), else it stays
  // DRAINING.
  grpc::Status DrainAgent(grpc::ServerContext*, const v1::DrainAgentRequest* request,
                          v1::DrainAgentResponse* response) override {
    absl::MutexLock lock(&owner_.mu_);
    ++owner_.calls_;
    owner_.drains_.push_back(*request);
    for (v1::AgentInfo& agent : owner_.agents_) {
      if (agent.agent_id() != request->agent() && agent.host() != request->agent()) continue;
      agent.set_state(agent.busy_slots() > 0 ? v1::AgentInfo::DRAINING : v1::AgentInfo::DRAINED);
      *response->mutable_agent() = agent;
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no agent \"", request->agent(), "\""));
  }

  grpc::Status GetLeader(grpc::ServerContext* context, const v1::GetLeaderRequest*,
                         v1::CoordinatorLeader* response) override {
    absl::MutexLock lock(&owner_.mu_);
    ++owner_.calls_;
    if (!owner_.no_leader_.empty()) {
      context->AddTrailingMetadata("chorus-no-leader", owner_.no_leader_);
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, owner_.no_leader_);
    }
    if (!owner_.follower_of_.empty()) {
      context->AddTrailingMetadata("chorus-leader", owner_.follower_of_);
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "this coordinator is a follower; the leader is " + owner_.follower_of_);
    }
    *response = owner_.leader_;
    return grpc::Status::OK;
  }

  grpc::Status GetQueue(grpc::ServerContext*, const v1::GetQueueRequest*,
                        v1::GetQueueResponse* response) override {
    absl::MutexLock lock(&owner_.mu_);
    ++owner_.calls_;
    *response = owner_.queue_;
    return grpc::Status::OK;
  }

  grpc::Status ListAgents(grpc::ServerContext*, const v1::ListAgentsRequest*,
                          v1::ListAgentsResponse* response) override {
    absl::MutexLock lock(&owner_.mu_);
    ++owner_.calls_;
    for (const v1::AgentInfo& agent : owner_.agents_) *response->add_agents() = agent;
    return grpc::Status::OK;
  }

  grpc::Status ListCheckpoints(grpc::ServerContext*, const v1::ListCheckpointsRequest* request,
                               v1::ListCheckpointsResponse* response) override {
    absl::MutexLock lock(&owner_.mu_);
    ++owner_.calls_;
    owner_.list_checkpoints_requests_.push_back(*request);
    if (Find(request->job_id()) == nullptr) return ToGrpcStatus(owner_.NotFound(request->job_id()));
    auto it = owner_.checkpoints_.find(request->job_id());
    if (it != owner_.checkpoints_.end()) {
      for (const v1::CheckpointManifest& m : it->second) *response->add_checkpoints() = m;
    }
    return grpc::Status::OK;
  }

 private:
  v1::Job* Find(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_.mu_) {
    for (v1::Job& job : owner_.jobs_) {
      if (job.job_id() == job_id) return &job;
    }
    return nullptr;
  }

  FakeCoordinator& owner_;
};

class FakeCoordinator::Health final : public grpc::health::v1::Health::Service {
 public:
  explicit Health(FakeCoordinator& owner) : owner_(owner) {}

  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest*,
                     grpc::health::v1::HealthCheckResponse* response) override {
    absl::MutexLock lock(&owner_.mu_);
    ++owner_.calls_;
    ++owner_.health_checks_;
    response->set_status(owner_.health_);
    return grpc::Status::OK;
  }

 private:
  FakeCoordinator& owner_;
};

class FakeCoordinator::Checkpoints final : public v1::CheckpointService::Service {
 public:
  explicit Checkpoints(FakeCoordinator& owner) : owner_(owner) {}

  grpc::Status Download(grpc::ServerContext*, const v1::DownloadCheckpointRequest* request,
                        grpc::ServerWriter<v1::CheckpointChunk>* writer) override {
    std::string bytes;
    bool damage = false;
    {
      absl::MutexLock lock(&owner_.mu_);
      ++owner_.calls_;
      owner_.downloads_.push_back(*request);
      int64_t step = request->step();
      if (step == 0) {
        for (const auto& [key, unused] : owner_.files_) {
          if (std::get<0>(key) == request->job_id()) step = std::max(step, std::get<1>(key));
        }
      }
      auto it = owner_.files_.find({request->job_id(), step, request->file_name()});
      if (it == owner_.files_.end()) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND,
                            absl::StrCat("job ", request->job_id(), " has no checkpoint file ",
                                         request->file_name(), " at step ", request->step()));
      }
      bytes = it->second;
      damage = owner_.damage_downloads_;
    }
    size_t offset = 0;
    do {
      const size_t n = std::min(kChunkBytes, bytes.size() - offset);
      v1::CheckpointChunk chunk;
      chunk.set_offset(static_cast<int64_t>(offset));
      chunk.set_data(bytes.substr(offset, n));
      chunk.set_chunk_crc32c(Crc32c(chunk.data()) ^ (damage ? 1u : 0u));
      offset += n;
      if (offset == bytes.size()) {
        chunk.set_last(true);
        chunk.set_file_size(static_cast<int64_t>(bytes.size()));
        chunk.set_file_crc32c(Crc32c(bytes));
        chunk.set_file_sha256(Sha256Hex(bytes));
      }
      if (!writer->Write(chunk)) break;
    } while (offset < bytes.size());
    return grpc::Status::OK;
  }

 private:
  FakeCoordinator& owner_;
};

FakeCoordinator::FakeCoordinator()
    : jobs_service_(std::make_unique<Jobs>(*this)),
      health_service_(std::make_unique<Health>(*this)),
      checkpoint_service_(std::make_unique<Checkpoints>(*this)) {
  whoami_.set_role("admin");  // no token file: an anonymous admin
}

FakeCoordinator::~FakeCoordinator() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }
}

absl::Status FakeCoordinator::Start(int listen_port) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", listen_port),
                           grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(jobs_service_.get());
  builder.RegisterService(health_service_.get());
  builder.RegisterService(checkpoint_service_.get());
  // The commands reach it through MakeCoordinatorChannel, which pings.
  AcceptCoordinatorKeepalive(builder);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError("fake coordinator: cannot listen on 127.0.0.1");
  }
  address_ = absl::StrCat("127.0.0.1:", port);
  channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  return absl::OkStatus();
}

absl::Status FakeCoordinator::NotFound(const std::string& job_id) const {
  return absl::NotFoundError(
      absl::StrCat("no job \"", job_id, "\"; `chorus jobs` lists the jobs this coordinator knows"));
}

void FakeCoordinator::AddJob(const v1::Job& job) {
  absl::MutexLock lock(&mu_);
  jobs_.push_back(job);
}

void FakeCoordinator::AddAgent(const v1::AgentInfo& agent) {
  absl::MutexLock lock(&mu_);
  agents_.push_back(agent);
}

std::vector<v1::DrainAgentRequest> FakeCoordinator::drains() const {
  absl::MutexLock lock(&mu_);
  return drains_;
}

void FakeCoordinator::SetJobStatus(const v1::JobStatus& status) {
  absl::MutexLock lock(&mu_);
  statuses_[status.job().job_id()] = status;
}

void FakeCoordinator::SetCheckpoints(const std::string& job_id,
                                     std::vector<v1::CheckpointManifest> manifests) {
  absl::MutexLock lock(&mu_);
  checkpoints_[job_id] = std::move(manifests);
}

void FakeCoordinator::SetCheckpointFile(const std::string& job_id, int64_t step,
                                        const std::string& name, std::string bytes) {
  absl::MutexLock lock(&mu_);
  files_[{job_id, step, name}] = std::move(bytes);
}

void FakeCoordinator::set_damage_downloads(bool damage) {
  absl::MutexLock lock(&mu_);
  damage_downloads_ = damage;
}

void FakeCoordinator::set_leader(const v1::CoordinatorLeader& leader) {
  absl::MutexLock lock(&mu_);
  leader_ = leader;
}

void FakeCoordinator::set_follower_of(const std::string& leader_address) {
  absl::MutexLock lock(&mu_);
  follower_of_ = leader_address;
}

void FakeCoordinator::set_no_leader(const std::string& why) {
  absl::MutexLock lock(&mu_);
  no_leader_ = why;
}

void FakeCoordinator::set_whoami(const v1::WhoAmIResponse& me) {
  absl::MutexLock lock(&mu_);
  whoami_ = me;
}

void FakeCoordinator::set_health(ServingStatus status) {
  absl::MutexLock lock(&mu_);
  health_ = status;
}

std::vector<v1::SubmitJobRequest> FakeCoordinator::submits() const {
  absl::MutexLock lock(&mu_);
  return submits_;
}

void FakeCoordinator::SetQueue(const v1::GetQueueResponse& queue) {
  absl::MutexLock lock(&mu_);
  queue_ = queue;
}

std::vector<v1::ListJobsRequest> FakeCoordinator::list_jobs_requests() const {
  absl::MutexLock lock(&mu_);
  return list_jobs_requests_;
}

std::vector<v1::GetJobStatusRequest> FakeCoordinator::status_requests() const {
  absl::MutexLock lock(&mu_);
  return status_requests_;
}

std::vector<v1::CancelJobRequest> FakeCoordinator::cancels() const {
  absl::MutexLock lock(&mu_);
  return cancels_;
}

std::vector<v1::ListCheckpointsRequest> FakeCoordinator::list_checkpoints_requests() const {
  absl::MutexLock lock(&mu_);
  return list_checkpoints_requests_;
}

std::vector<v1::DownloadCheckpointRequest> FakeCoordinator::downloads() const {
  absl::MutexLock lock(&mu_);
  return downloads_;
}

int FakeCoordinator::health_checks() const {
  absl::MutexLock lock(&mu_);
  return health_checks_;
}

int FakeCoordinator::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

}  // namespace chorus::client
