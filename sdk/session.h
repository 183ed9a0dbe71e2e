// Session: a user's training program's membership in a Chorus job. A
// program started by Chorus as a `program` job (docs/sdk.md) makes one at
// the start, from the environment its supervising chorus-rank set, and gets:
// who it is (rank, world size, local rank, generation, job id), the job spec
// and the checkpoint to resume from; the job's communicator (Gloo, its
// rendezvous through the coordinator's store, as chorus-rank builds it);
// progress reporting that the hang detector and `chorus status` read;
// metrics to `chorus watch`; and checkpoints of named tensors through the
// coordinator, with resume. Nothing here needs gRPC from the user.
//
// The final report is not the program's business: when it exits, the
// supervisor reports success (exit 0) or failure (the exit code).
//
// Thread-safety: the accessors and Step/EnterPhase may be called from any
// thread; the communicator is driven as its own header says; checkpoint
// calls from one thread at a time.
//
// Example:
//   absl::StatusOr<std::unique_ptr<chorus::Session>> session = chorus::Session::FromEnvironment();
//   if (!session.ok()) { std::cerr << session.status() << "\n"; return 2; }
//   chorus::Session& s = **session;
//   auto ddp = chorus::DistributedDataParallelFor(*net, {}, s.communicator()).value();
//   for (int64_t step = 1; step <= steps; ++step) {
//     { chorus::PhaseScope forward(s.progress(), chorus::v1::FORWARD); ... }
//     s.Step(step, loss, batch);
//     if (s.CheckpointRequested()) s.SaveCheckpoint(step, {{"w", w}}).IgnoreError();
//   }
#ifndef CHORUS_SDK_SESSION_H_
#define CHORUS_SDK_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "checkpoint/storage.h"
#include "chorus/checkpoints.h"
#include "chorus/environment.h"
#include "chorus/metrics.h"
#include "chorus/progress.h"
#include "chorus/v1/coordinator.pb.h"
#include "worker/comm/communicator.h"
#include "worker/replica/named_tensor.h"

namespace grpc {
class Channel;
}

namespace chorus {

class Store;

// The communicator of a rank of `env`'s job, through `store`: NCCL on GPU
// `env.local_rank` (as CUDA numbers the devices this process sees, so
// CUDA_VISIBLE_DEVICES is honoured) when the job's resources.device is CUDA,
// Gloo on the CPU otherwise. Errors name the rank and job; a CUDA job in a
// build without NCCL gets FAILED_PRECONDITION saying how to build one.
// Session::FromEnvironment uses it; exposed for programs that build their own
// parts and for tests.
absl::StatusOr<std::shared_ptr<Communicator>> CreateJobCommunicator(
    const SessionEnvironment& env, Store& store, absl::Duration connect_timeout);

struct SessionOptions {
  // How long building the communicator waits for the other ranks.
  absl::Duration connect_timeout = absl::Minutes(2);
  // How often progress goes to the supervisor (ProgressOptions::interval;
  // 0: at every step and phase change instead).
  absl::Duration progress_interval = absl::Milliseconds(200);
  // Count SIGUSR1 (`chorus checkpoint`, forwarded by the supervisor) as a
  // checkpoint request (CheckpointRequested). Installs a process-wide
  // handler.
  bool handle_checkpoint_signal = true;
};

class Session {
 public:
  // Joins the job this process was started for: reads the environment
  // (environment.h says which variables; errors name the variable and say
  // how to run the program under Chorus), connects to the coordinator,
  // builds the communicator (every rank of the generation must call this),
  // opens the progress channel.
  static absl::StatusOr<std::unique_ptr<Session>> FromEnvironment(
      SessionOptions options = SessionOptions());

  // The pieces FromEnvironment builds, for tests and for programs that set
  // up their own transport. `comm` and `checkpoint_storage` may be null (no
  // communicator: communicator() must not be called; no storage:
  // SaveCheckpoint/RestoreCheckpoint fail FAILED_PRECONDITION); `metrics`
  // null drops metrics; `progress_sink` null drops progress.
  struct Parts {
    SessionEnvironment env;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<Store> store;
    std::shared_ptr<Communicator> comm;
    std::unique_ptr<CheckpointStorage> checkpoint_storage;
    std::unique_ptr<MetricsReporter> metrics;
    ProgressSink progress_sink;
  };
  static std::unique_ptr<Session> FromParts(Parts parts, SessionOptions options = SessionOptions());

  // Ends phase reporting with FINISHED (one last record) and closes the
  // communicator.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  int local_rank() const { return env_.local_rank; }
  int local_world_size() const { return env_.local_world_size; }
  int64_t generation() const { return env_.generation; }
  const std::string& job_id() const { return env_.job_id; }
  const v1::JobSpec& spec() const { return env_.joined.spec(); }
  // The checkpoint this job resumes from (empty when it starts fresh).
  const v1::CheckpointManifest& resume_manifest() const { return env_.joined.resume(); }
  bool resuming() const { return HasCheckpoint(env_.joined.resume()); }
  const SessionEnvironment& environment() const { return env_; }

  // The job's communicator. REQUIRES: the session has one (FromEnvironment
  // always does).
  Communicator& communicator();
  std::shared_ptr<Communicator> shared_communicator() const { return comm_; }
  // Where this rank's tensors go: its GPU for a CUDA job (the communicator is
  // NCCL), the CPU otherwise. Move the model and batches there.
  c10::Device device() const;

  // Progress (progress.h): a step ended (step time, loss, samples of this
  // rank), or a phase begins — PhaseScope(session.progress(), v1::FORWARD).
  void Step(int64_t step, double loss, int64_t samples) { progress_->Step(step, loss, samples); }
  ProgressReporter& progress() { return *progress_; }

  // Metrics to `chorus watch` (not final; best effort, see metrics.h).
  absl::Status ReportMetrics(const v1::Metrics& metrics);

  // Whether a checkpoint was requested (`chorus checkpoint`) since the last
  // call that returned true. Ranks may see a request at different steps;
  // rank 0's SaveCheckpoint is the one that stores.
  bool CheckpointRequested();

  // Checkpoint `step` of `tensors` (checkpoints.h: rank 0 stores, blocks
  // until committed; other ranks return at once).
  absl::Status SaveCheckpoint(int64_t step, const std::vector<NamedTensor>& tensors);
  // Copies the resume checkpoint's tensors into `into` and returns its
  // step; NOT_FOUND when the job does not resume (resuming() is false).
  absl::StatusOr<int64_t> RestoreCheckpoint(const std::vector<NamedTensor>& into);

 private:
  Session(Parts parts, SessionOptions options);

  const SessionEnvironment env_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Store> store_;  // the communicator's; outlives it
  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<CheckpointStorage> checkpoint_storage_;
  std::unique_ptr<TensorCheckpoints> checkpoints_;
  std::unique_ptr<MetricsReporter> metrics_;
  std::unique_ptr<ProgressReporter> progress_;
  int64_t checkpoint_requests_seen_ = 0;
  bool send_on_every_change_ = false;
};

// SIGUSR1s this process has received since a Session installed its
// handler (the count CheckpointRequested compares against).
int64_t CheckpointSignalsReceived();

}  // namespace chorus

#endif  // CHORUS_SDK_SESSION_H_
