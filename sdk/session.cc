#include "chorus/session.h"

#include <signal.h>

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/coordinator_storage.h"
#include "checkpoint/shared_dir_storage.h"
#include "common/auth.h"
#include "common/grpc_util.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/grpc_store.h"
#include "worker/comm/store.h"
#include "worker/runtime/progress_channel.h"

namespace chorus {
namespace {

// SIGUSR1 arrives on any thread at any time: a lock-free counter is all a
// handler may touch. Process-wide because a signal is.
std::atomic<int64_t> g_checkpoint_signals{0};

void OnCheckpointSignal(int) { g_checkpoint_signals.fetch_add(1); }

void InstallCheckpointSignalHandler() {
  struct sigaction action = {};
  action.sa_handler = OnCheckpointSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &action, nullptr);
}

}  // namespace

int64_t CheckpointSignalsReceived() { return g_checkpoint_signals.load(); }

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
    nccl.device = env.local_rank;
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
  Parts parts;
  ASSIGN_OR_RETURN(parts.env, ReadSessionEnvironment(ProcessEnvironment()));
  const SessionEnvironment& env = parts.env;
  // The token and TLS files come through the environment as for chorus-rank
  // (CHORUS_TOKEN, CHORUS_TLS_CA, CHORUS_TLS_CERT, CHORUS_TLS_KEY).
  ASSIGN_OR_RETURN(ClientSecurity security, LoadClientSecurity("", "", "", ""));
  ConfigureClient(std::move(security));
  parts.channel = MakeCoordinatorChannel(env.coordinator);

  if (env.progress_fd >= 0) {
    std::shared_ptr<ProgressSender> sender = std::make_shared<ProgressSender>(env.progress_fd);
    parts.progress_sink = [sender](const v1::RankHeartbeat& hb) { return sender->Send(hb); };
  } else {
    LOG(WARNING) << "chorus: CHORUS_PROGRESS_FD is not set; progress is not reported (the hang "
                    "detector sees only this rank's exit and silence)";
  }

  auto store = std::make_unique<GrpcStore>(parts.channel, env.store_namespace);
  ASSIGN_OR_RETURN(parts.comm, CreateJobCommunicator(env, *store, options.connect_timeout));
  parts.store = std::move(store);

  const v1::CheckpointSpec& checkpoint = env.joined.spec().checkpoint();
  if (checkpoint.storage() == v1::CheckpointSpec::SHARED_DIR) {
    ASSIGN_OR_RETURN(parts.checkpoint_storage,
                     SharedDirCheckpointStorage::Create(parts.channel, checkpoint.shared_dir(),
                                                        env.job_id, env.generation, env.rank));
  } else {
    // The data port is on the coordinator's host; a target that is not
    // HOST:PORT gets none and uploads over gRPC.
    absl::StatusOr<HostPort> address = ParseHostPort(env.coordinator);
    parts.checkpoint_storage = std::make_unique<CoordinatorCheckpointStorage>(
        parts.channel, env.job_id, env.generation, env.rank, address.ok() ? address->host : "");
  }
  parts.metrics =
      std::make_unique<MetricsReporter>(parts.channel, env.job_id, env.generation, env.rank);
  return FromParts(std::move(parts), options);
}

std::unique_ptr<Session> Session::FromParts(Parts parts, SessionOptions options) {
  return std::unique_ptr<Session>(new Session(std::move(parts), options));
}

Session::Session(Parts parts, SessionOptions options)
    : env_(std::move(parts.env)),
      channel_(std::move(parts.channel)),
      store_(std::move(parts.store)),
      comm_(std::move(parts.comm)),
      checkpoint_storage_(std::move(parts.checkpoint_storage)),
      metrics_(std::move(parts.metrics)) {
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
}

Session::~Session() {
  progress_->EnterPhase(v1::FINISHED);
  if (!send_on_every_change_) progress_->Flush();
  progress_.reset();  // its thread reads the communicator's flight recorder
  comm_.reset();
}

c10::Device Session::device() const {
  return comm_ != nullptr ? comm_->device() : c10::Device(c10::kCPU);
}

Communicator& Session::communicator() {
  CHECK(comm_ != nullptr) << "this session was made without a communicator";
  return *comm_;
}

absl::Status Session::ReportMetrics(const v1::Metrics& metrics) {
  if (metrics_ == nullptr) return absl::OkStatus();
  return metrics_->Report(metrics);
}

bool Session::CheckpointRequested() {
  const int64_t received = CheckpointSignalsReceived();
  if (received <= checkpoint_requests_seen_) return false;
  checkpoint_requests_seen_ = received;
  return true;
}

absl::Status Session::SaveCheckpoint(int64_t step, const std::vector<NamedTensor>& tensors) {
  if (checkpoints_ == nullptr) {
    return absl::FailedPreconditionError("this session has no checkpoint storage");
  }
  PhaseScope phase(*progress_, v1::CHECKPOINT);
  return checkpoints_->Save(step, tensors);
}

absl::StatusOr<int64_t> Session::RestoreCheckpoint(const std::vector<NamedTensor>& into) {
  if (checkpoints_ == nullptr) {
    return absl::FailedPreconditionError("this session has no checkpoint storage");
  }
  PhaseScope phase(*progress_, v1::CHECKPOINT);
  return checkpoints_->Restore(env_.joined.resume(), into);
}

}  // namespace chorus
