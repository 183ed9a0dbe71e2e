#include "chorus/session.h"

#include <ATen/ATen.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/rank_storage.h"
#include "checkpoint/storage.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/auth.h"
#include "common/grpc_util.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/grpc_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/store.h"
#include "worker/runtime/join_generation.h"
#include "worker/runtime/master_address.h"
#include "worker/runtime/progress_channel.h"
#include "worker/runtime/report_queue.h"

namespace chorus {
namespace {

// SIGUSR1 arrives on any thread at any time: a lock-free counter is all a
// handler may touch. Process-wide because a signal is.
std::atomic<int64_t> g_checkpoint_signals{0};

void OnCheckpointSignal(int) { g_checkpoint_signals.fetch_add(1); }

// How long the session's end waits to send the last report ReportMetrics
// left pending (after a send in flight, which ends by its own deadline).
constexpr absl::Duration kLastReportWait = absl::Seconds(2);

void InstallCheckpointSignalHandler() {
  struct sigaction action = {};
  action.sa_handler = OnCheckpointSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &action, nullptr);
}

// Where `env`'s rank stores checkpoints: the spec's shared directory, or
// the coordinator.
// The Join of `generation` this program's rank sends itself (it names its
// agent's slot and its supervisor's pid, as chorus-rank's did).
v1::JoinRequest JoinRequestOf(const SessionEnvironment& env, int64_t generation) {
  v1::JoinRequest request;
  request.set_job_id(env.job_id);
  request.set_generation(generation);
  request.set_agent_id(env.agent_id);
  request.set_slot(env.slot);
  request.set_pid(env.rank_pid > 0 ? env.rank_pid : ::getppid());
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  request.set_host(host);
  return request;
}

// `env` as a member of the generation `joined` answers for.
SessionEnvironment Rejoined(SessionEnvironment env, const v1::JoinResponse& joined) {
  env.rank = joined.rank();
  env.world_size = joined.world_size();
  env.local_rank = joined.local_rank();
  env.local_world_size = joined.local_world_size();
  env.generation = joined.generation();
  env.store_namespace = joined.store_namespace();
  env.joined = joined;
  return env;
}

// Note [Staged growth] in coordinator/scheduling/staged_growth.h: a newcomer's
// program started before its generation formed joins it now; the
// coordinator has the members re-form at their next step boundary once it
// asks, and answers when the generation is complete. The join goes through
// the supervisor to the node agent when they take joins (`progress`, may be
// null; Note [The first join through the agent] in worker/rank_main.cc).
absl::StatusOr<SessionEnvironment> JoinStagedGeneration(
    const SessionEnvironment& env, const std::shared_ptr<grpc::Channel>& channel,
    const std::shared_ptr<ProgressSender>& progress) {
  if (env.agent_id.empty() || env.slot < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", env.rank, " of ", env.job_id, ": CHORUS_JOIN_FILE holds a staged membership of "
        "generation ", env.generation, " but CHORUS_AGENT_ID and CHORUS_SLOT are not set; only a "
        "program started by chorus-rank can join it"));
  }
  auto ranks = v1::RankService::NewStub(channel);
  const absl::Time deadline =
      absl::Now() + absl::Seconds(env.joined.spec().elastic().wait_seconds()) + absl::Minutes(1);
  absl::StatusOr<v1::JoinResponse> joined =
      GenerationJoiner(*ranks, AgentJoinChannel(progress))
          .Join(JoinRequestOf(env, env.generation), deadline, /*until_formed=*/true);
  if (!joined.ok()) {
    return absl::Status(joined.status().code(), absl::StrCat("rank ", env.rank, " of ", env.job_id,
                                                             " (staged newcomer): ",
                                                             joined.status().message()));
  }
  LOG(INFO) << "chorus: " << env.job_id << ": a staged newcomer joined generation "
            << joined->generation() << " as rank " << joined->rank() << " of "
            << joined->world_size();
  return Rejoined(env, *joined);
}

// Joins the generation `request` asks for: through the supervisor to the
// node agent when they take joins (Note [Joins gathered by the agent] in
// worker/agent/agent.cc), else directly.
absl::StatusOr<v1::JoinResponse> JoinNext(const std::shared_ptr<grpc::Channel>& channel,
                                          const std::shared_ptr<ProgressSender>& progress,
                                          const v1::JoinRequest& request, absl::Time deadline) {
  auto ranks = v1::RankService::NewStub(channel);
  return GenerationJoiner(*ranks, AgentJoinChannel(progress))
      .Join(request, deadline, /*until_formed=*/true);
}

}  // namespace

int64_t CheckpointSignalsReceived() { return g_checkpoint_signals.load(); }

int JobGpu(const SessionEnvironment& env) { return env.slot >= 0 ? env.slot : env.local_rank; }

absl::StatusOr<std::shared_ptr<Communicator>> CreateJobCommunicator(
    const SessionEnvironment& env, Store& store, absl::Duration connect_timeout) {
  const std::string who = absl::StrCat("rank ", env.rank, " of ", env.job_id);
  absl::StatusOr<std::shared_ptr<Communicator>> comm;
  if (env.joined.spec().resources().device() == v1::ResourceSpec::CUDA) {
    if (!NcclAvailable()) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, ": the job's resources.device is CUDA, but this build of the Chorus SDK has no "
               "NCCL; build it with `bazel build --config=cuda` or CMake's "
               "-DCHORUS_WITH_CUDA=ON (and a CUDA LibTorch), or run the job with "
               "resources.device CPU"));
    }
    NcclOptions nccl;
    nccl.rank = env.rank;
    nccl.size = env.world_size;
    nccl.device = JobGpu(env);
    nccl.connect_timeout = connect_timeout;
    comm = CreateNcclCommunicator(nccl, store);
  } else {
    GlooOptions gloo;
    gloo.rank = env.rank;
    gloo.size = env.world_size;
    gloo.hostname = env.rank_host;
    gloo.connect_timeout = connect_timeout;
    comm = CreateGlooCommunicator(gloo, store);
  }
  if (!comm.ok()) {
    return absl::Status(comm.status().code(), absl::StrCat(who, ": connecting to the other ranks: ",
                                                           comm.status().message()));
  }
  return comm;
}

absl::StatusOr<std::unique_ptr<Session>> Session::FromEnvironment(SessionOptions options) {
  // Before anything slow: a request that comes during setup is kept.
  if (options.handle_checkpoint_signal) InstallCheckpointSignalHandler();
  // Gloo writes to its peers' sockets with plain writes: a peer that died
  // must fail the collective (EPIPE), not kill this process with SIGPIPE.
  if (options.ignore_sigpipe) signal(SIGPIPE, SIG_IGN);
  Parts parts;
  ASSIGN_OR_RETURN(parts.env, ReadSessionEnvironment(ProcessEnvironment()));
  const SessionEnvironment& env = parts.env;
  // The token and TLS files come through the environment as for chorus-rank
  // (CHORUS_TOKEN, CHORUS_TLS_CA, CHORUS_TLS_CERT, CHORUS_TLS_KEY).
  ASSIGN_OR_RETURN(ClientSecurity security, LoadClientSecurity("", "", "", ""));
  ConfigureClient(std::move(security));
  parts.channel = MakeCoordinatorChannel(env.coordinator);
  std::shared_ptr<ProgressSender> sender;
  if (env.progress_fd >= 0) {
    sender = std::make_shared<ProgressSender>(env.progress_fd);
    parts.progress_sink = [sender](const v1::RankHeartbeat& hb) { return sender->Send(hb); };
    parts.directives = sender;
  } else {
    LOG(WARNING) << "chorus: CHORUS_PROGRESS_FD is not set; progress is not reported (the hang "
                    "detector sees only this rank's exit and silence)";
  }
  if (env.joined.staged()) {
    ASSIGN_OR_RETURN(parts.env, JoinStagedGeneration(env, parts.channel, sender));
  }

  auto store = std::make_unique<GrpcStore>(parts.channel, env.store_namespace);
  ASSIGN_OR_RETURN(parts.comm, CreateJobCommunicator(env, *store, options.connect_timeout));
  parts.store = std::move(store);

  ASSIGN_OR_RETURN(
      parts.checkpoint_storage,
      MakeRankCheckpointStorage(parts.channel, env.joined.spec().checkpoint(), env.coordinator,
                                env.job_id, env.generation, env.rank));
  parts.metrics =
      std::make_unique<MetricsReporter>(parts.channel, env.job_id, env.generation, env.rank);
  return FromParts(std::move(parts), options);
}

std::unique_ptr<Session> Session::FromParts(Parts parts, SessionOptions options) {
  return std::unique_ptr<Session>(new Session(std::move(parts), options));
}

Session::Session(Parts parts, SessionOptions options)
    : options_(options),
      env_(std::move(parts.env)),
      channel_(std::move(parts.channel)),
      store_(std::move(parts.store)),
      comm_(std::move(parts.comm)),
      checkpoint_storage_(std::move(parts.checkpoint_storage)),
      metrics_(std::move(parts.metrics)),
      reports_(std::make_unique<ReportQueue>(
          [this](const v1::ReportRequest& request, absl::Time deadline) {
            return SendReport(request, deadline);
          })) {
  if (checkpoint_storage_ != nullptr) {
    checkpoints_ =
        std::make_unique<TensorCheckpoints>(*checkpoint_storage_, env_.rank, env_.world_size);
  }
  ProgressSink sink = std::move(parts.progress_sink);
  if (!sink) sink = [](const v1::RankHeartbeat&) { return absl::OkStatus(); };
  ProgressOptions progress;
  progress.interval = options.progress_interval;
  send_on_every_change_ = options.progress_interval <= absl::ZeroDuration();
  progress_ = std::make_unique<ProgressReporter>(
      std::move(sink), comm_ != nullptr ? &comm_->flight_recorder() : nullptr, progress);
  if (options.handle_checkpoint_signal) InstallCheckpointSignalHandler();
  directives_ = std::move(parts.directives);
  if (directives_ != nullptr) directive_thread_ = std::thread([this] { ReadDirectives(); });
}

Session::~Session() {
  reports_->Flush(absl::Now() + kLastReportWait);
  stop_directives_.store(true);
  if (directive_thread_.joinable()) directive_thread_.join();
  progress_->EnterPhase(v1::FINISHED);
  if (!send_on_every_change_) progress_->Flush();
  progress_.reset();  // its thread reads the communicator's flight recorder
  comm_.reset();
  retired_.clear();
}

void Session::ReadDirectives() {
  while (!stop_directives_.load()) {
    absl::StatusOr<v1::Directive> directive =
        directives_->ReceiveDirective(absl::Now() + absl::Milliseconds(200));
    if (absl::IsOutOfRange(directive.status())) return;  // the supervisor is gone
    if (!directive.ok()) continue;
    if (directive->kind() == v1::Directive::REFORM_AT_STEP_BOUNDARY) {
      // Acted on at the step boundary the ranks agree on (ReformRequested).
      int64_t now = reform_request_.load();
      while (now < directive->generation() &&
             !reform_request_.compare_exchange_weak(now, directive->generation())) {
      }
    } else if (directive->kind() == v1::Directive::RE_RENDEZVOUS) {
      // A generation this rank is not in yet formed: whatever the program
      // waits for on the current communicator fails, and it joins.
      std::shared_ptr<Communicator> comm;
      {
        absl::MutexLock lock(&comm_mu_);
        if (env_.generation >= directive->generation() || comm_ == nullptr) continue;
        comm = comm_;
      }
      LOG(WARNING) << "chorus: the coordinator formed generation " << directive->generation()
                   << " (" << directive->reason() << ")";
      comm->Abort(absl::StrCat("the coordinator formed generation ", directive->generation(), ": ",
                               directive->reason()));
    }
  }
}

c10::Device Session::device() const {
  return comm_ != nullptr ? comm_->device() : c10::Device(c10::kCPU);
}

Communicator& Session::communicator() {
  CHECK(comm_ != nullptr) << "this session was made without a communicator";
  return *comm_;
}

absl::Status Session::ReportMetrics(const v1::Metrics& metrics) {
  v1::ReportRequest request;
  {
    absl::MutexLock lock(&comm_mu_);
    if (metrics_ == nullptr) return absl::OkStatus();
    request = metrics_->Request(metrics);
  }
  reports_->Offer(std::move(request));
  return absl::OkStatus();
}

absl::Status Session::SendReport(const v1::ReportRequest& request, absl::Time deadline) {
  // The request names its own generation and rank: any generation's
  // reporter sends it as it is.
  std::shared_ptr<MetricsReporter> reporter;
  {
    absl::MutexLock lock(&comm_mu_);
    reporter = metrics_;
  }
  return reporter->Send(request, deadline);
}

bool Session::CheckpointRequested() {
  const int64_t received = CheckpointSignalsReceived();
  if (received <= checkpoint_requests_seen_) return false;
  checkpoint_requests_seen_ = received;
  return true;
}

absl::Status Session::SaveCheckpoint(int64_t step, const std::vector<NamedTensor>& tensors) {
  PhaseScope phase(*progress_, v1::CHECKPOINT);
  return StoreCheckpointCopy(step, tensors);
}

absl::Status Session::StoreCheckpointCopy(int64_t step, const std::vector<NamedTensor>& copies) {
  if (checkpoints_ == nullptr) {
    return absl::FailedPreconditionError("this session has no checkpoint storage");
  }
  return checkpoints_->Save(step, copies);
}

absl::Time Session::StateDeadline() const {
  return absl::Now() +
         absl::Seconds(std::max<int64_t>(env_.joined.spec().elastic().wait_seconds(), 60));
}

void Session::DeclareReformsInProcess() {
  // Sent at once: the coordinator picks restart-all for a program job that
  // has not said so by the time a rank is lost.
  if (elastic() && progress_->MarkReformsInProcess()) progress_->Flush();
}

absl::StatusOr<bool> Session::ReformRequested() {
  if (!elastic()) return false;
  DeclareReformsInProcess();
  at::Tensor asked = at::full({1}, reform_request_.load(), at::kLong);
  RETURN_IF_ERROR(communicator()
                      .AllReduce(asked, ReduceOp::kMax, "elastic/step_boundary")
                      ->Wait(StateDeadline()));
  return asked.item<int64_t>() > env_.generation;
}

absl::StatusOr<bool> Session::JoinNextGeneration(const absl::Status& why) {
  const std::string who = absl::StrCat("rank ", env_.rank, " of ", env_.job_id);
  if (!elastic()) {
    return absl::FailedPreconditionError(absl::StrCat(
        who,
        ": the job has no elastic block, so a lost rank fails it; add elastic { } to the "
        "spec to re-form instead (docs/elastic.md)"));
  }
  if (channel_ == nullptr || env_.agent_id.empty() || env_.slot < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        who,
        ": CHORUS_AGENT_ID and CHORUS_SLOT are not set (or this session has no coordinator "
        "channel); only a program started by chorus-rank can join the next generation"));
  }
  DeclareReformsInProcess();
  const int64_t was = env_.generation;
  const std::string cause = why.ok() ? "a planned change (drain or growth) at a step boundary"
                                     : std::string(why.message());
  LOG(WARNING) << "chorus: " << who << ": generation " << was << " ended (" << cause
               << "); joining the next one";
  comm_->Abort(absl::StrCat("generation ", was, " ended: ", cause));

  const v1::JoinRequest request = JoinRequestOf(env_, was + 1);
  const absl::Time deadline =
      absl::Now() + absl::Seconds(env_.joined.spec().elastic().wait_seconds()) + absl::Minutes(1);
  absl::StatusOr<v1::JoinResponse> next_joined =
      JoinNext(channel_, directives_, request, deadline);
  if (!next_joined.ok()) {
    return absl::Status(next_joined.status().code(),
                        absl::StrCat(who, ": ", next_joined.status().message()));
  }
  const v1::JoinResponse& joined = *next_joined;
  if (joined.leave()) {
    LOG(INFO) << "chorus: " << who << " leaves the job after generation " << was
              << " (its agent is draining)";
    progress_->MarkLeft();
    progress_->Flush();
    return false;
  }

  SessionEnvironment next = env_;
  next.rank = joined.rank();
  next.world_size = joined.world_size();
  next.generation = joined.generation();
  next.store_namespace = joined.store_namespace();
  next.joined = joined;
  auto store = std::make_unique<GrpcStore>(channel_, next.store_namespace);
  if (next.rank == 0) {
    // Rank 0 of each generation publishes MASTER_ADDR:MASTER_PORT; the
    // supervisors of newcomers wait for it before they start their program.
    absl::StatusOr<HostPort> master =
        AgreeMasterAddress(*store, 0, next.rank_host, absl::Now() + absl::Minutes(1));
    if (!master.ok()) return master.status();
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Communicator> comm,
                   CreateJobCommunicator(next, *store, options_.connect_timeout));
  ASSIGN_OR_RETURN(
      std::unique_ptr<CheckpointStorage> storage,
      MakeRankCheckpointStorage(channel_, next.joined.spec().checkpoint(), next.coordinator,
                                next.job_id, next.generation, next.rank));
  checkpoints_.reset();
  checkpoint_storage_ = std::move(storage);
  checkpoints_ =
      std::make_unique<TensorCheckpoints>(*checkpoint_storage_, next.rank, next.world_size);
  {
    absl::MutexLock lock(&comm_mu_);
    metrics_ = std::make_shared<MetricsReporter>(channel_, next.job_id, next.generation, next.rank);
    retired_.emplace_back(std::move(comm_), std::move(store_));
    comm_ = std::move(comm);
    store_ = std::move(store);
    env_ = std::move(next);
  }
  progress_->SetFlightRecorder(&comm_->flight_recorder());
  progress_->SetMembership(env_.generation, env_.rank);
  progress_->Flush();  // the supervisor's heartbeats follow at once
  LOG(INFO) << "chorus: " << env_.job_id << ": rank " << env_.rank << " of " << env_.world_size
            << " in generation " << env_.generation;
  return true;
}

absl::StatusOr<SharedTensors> Session::ShareNewestState(int64_t held_step,
                                                        const std::vector<NamedTensor>& tensors) {
  DeclareReformsInProcess();
  return ShareNewestTensors(communicator(), held_step, tensors, StateDeadline());
}

absl::StatusOr<int> Session::AverageHeldState(bool held, const std::vector<NamedTensor>& tensors) {
  DeclareReformsInProcess();
  return AverageHeldTensors(communicator(), held, tensors, StateDeadline());
}

absl::StatusOr<int64_t> Session::RestoreCheckpoint(const std::vector<NamedTensor>& into) {
  if (checkpoints_ == nullptr) {
    return absl::FailedPreconditionError("this session has no checkpoint storage");
  }
  PhaseScope phase(*progress_, v1::CHECKPOINT);
  return checkpoints_->Restore(env_.joined.resume(), into);
}

absl::StatusOr<TensorCheckpoints::Loaded> Session::LoadCheckpoint() {
  if (checkpoints_ == nullptr) {
    return absl::FailedPreconditionError("this session has no checkpoint storage");
  }
  PhaseScope phase(*progress_, v1::CHECKPOINT);
  return checkpoints_->Load(env_.joined.resume());
}

}  // namespace chorus
