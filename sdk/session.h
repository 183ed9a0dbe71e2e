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

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/checkpoints.h"
#include "chorus/communicator.h"
#include "chorus/elastic.h"
#include "chorus/environment.h"
#include "chorus/metrics.h"
#include "chorus/named_tensor.h"
#include "chorus/progress.h"
#include "chorus/v1/coordinator.pb.h"

namespace grpc {
class Channel;
}

namespace chorus {

// Internal to Chorus and not installed with the SDK (only the session's
// implementation uses them), so they are only named here: the checkpoint
// transport, the progress channel, the communicator's rendezvous store and
// the sender of metrics reports.
class CheckpointStorage;
class ProgressSender;
class ReportQueue;
class Store;

// The GPU a rank of a CUDA job trains on, as CUDA numbers the devices this
// process sees (so CUDA_VISIBLE_DEVICES is honoured): its agent slot
// (CHORUS_SLOT) under Chorus, where the agent offers one slot per GPU, so two
// jobs sharing a node never share a GPU (their LOCAL_RANKs both start at 0);
// LOCAL_RANK outside Chorus (torchrun's environment), as torchrun users expect.
int JobGpu(const SessionEnvironment& env);

// The communicator of a rank of `env`'s job, through `store`: NCCL on GPU
// JobGpu(env) when the job's resources.device is CUDA,
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
  // Ignore SIGPIPE process-wide (as Python does): the transport writes to
  // its peers' sockets, and a peer that died must fail the collective with
  // an error (IsMembershipLost) instead of killing the program.
  bool ignore_sigpipe = true;
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
    // The progress channel, read for the directives the supervisor passes
    // on (elastic jobs); null: none arrive.
    std::shared_ptr<ProgressSender> directives;
  };
  static std::unique_ptr<Session> FromParts(Parts parts, SessionOptions options = SessionOptions());

  // Ends phase reporting with FINISHED (one last record) and closes the
  // communicator (and those of earlier generations).
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  int local_rank() const { return env_.local_rank; }
  int local_world_size() const { return env_.local_world_size; }
  // Membership: rank(), world_size() and generation() change when an
  // elastic program joins the next generation (JoinNextGeneration); read
  // them from the thread that calls it.
  int64_t generation() const { return env_.generation; }
  const std::string& job_id() const { return env_.job_id; }
  const v1::JobSpec& spec() const { return env_.joined.spec(); }
  // The checkpoint this job resumes from (empty when it starts fresh).
  const v1::CheckpointManifest& resume_manifest() const { return env_.joined.resume(); }
  bool resuming() const { return HasCheckpoint(env_.joined.resume()); }
  const SessionEnvironment& environment() const { return env_; }

  // The job's communicator, the current generation's. REQUIRES: the
  // session has one (FromEnvironment always does).
  Communicator& communicator();
  std::shared_ptr<Communicator> shared_communicator() const { return comm_; }
  // The current generation's key-value store at the coordinator (where its
  // communicator met); the program may keep keys of its own there.
  // JoinNextGeneration replaces it; the old one stays valid until the
  // session ends.
  Store& store() { return *store_; }
  // Where this rank's tensors go: its GPU for a CUDA job (the communicator is
  // NCCL), the CPU otherwise. Move the model and batches there.
  c10::Device device() const;

  // Progress (progress.h): a step ended (step time, loss, samples of this
  // rank), or a phase begins — PhaseScope(session.progress(), v1::FORWARD).
  void Step(int64_t step, double loss, int64_t samples) { progress_->Step(step, loss, samples); }
  ProgressReporter& progress() { return *progress_; }

  // Metrics to `chorus watch` (not final; best effort). Never waits for the
  // coordinator: the report is handed to a thread of the session's, which
  // sends one at a time (Note [Reports off the training thread] in
  // worker/runtime/report_queue.h). While a send is in flight a newer
  // report replaces an older one not yet sent, and a report the coordinator
  // refuses or does not answer in time is logged and dropped, so this
  // returns OK. The session's end sends the report still pending, waiting
  // for the coordinator a few seconds at most.
  absl::Status ReportMetrics(const v1::Metrics& metrics);

  // Whether a checkpoint was requested (`chorus checkpoint`) since the last
  // call that returned true. Ranks may see a request at different steps;
  // rank 0's SaveCheckpoint is the one that stores.
  bool CheckpointRequested();

  // Checkpoint `step` of `tensors` (checkpoints.h: rank 0 stores, blocks
  // until committed; other ranks return at once).
  absl::Status SaveCheckpoint(int64_t step, const std::vector<NamedTensor>& tensors);
  // SaveCheckpoint without entering phase CHECKPOINT: for a copy of the
  // state stored from another thread while training goes on (the Python
  // package's save_checkpoint); one at a time.
  absl::Status StoreCheckpointCopy(int64_t step, const std::vector<NamedTensor>& copies);
  // Copies the resume checkpoint's tensors into `into` and returns its
  // step; NOT_FOUND when the job does not resume (resuming() is false).
  absl::StatusOr<int64_t> RestoreCheckpoint(const std::vector<NamedTensor>& into);
  // Every tensor of the resume checkpoint and its step (TensorCheckpoints::
  // Load); NOT_FOUND when the job does not resume.
  absl::StatusOr<TensorCheckpoints::Loaded> LoadCheckpoint();

  // ---- Elastic jobs (spec.elastic; docs/sdk.md "Elastic programs").
  //
  // A member is lost: the program's next collective fails (a status for
  // which IsMembershipLost is true; a survivor whose collective would not
  // fail by itself has its communicator aborted when the coordinator forms
  // the next generation). The program keeps the state of its last complete
  // step, calls JoinNextGeneration, builds what sat on the old communicator
  // (its DDP) afresh on communicator(), and calls ShareNewestState; a
  // newcomer, started for the new generation, calls ShareNewestState with
  // held_step -1 after FromEnvironment. A planned change (a drain, a
  // growth) is taken at a step boundary: ReformRequested at the start of
  // every step, on every rank. The first call of any of the four below in
  // an elastic job tells the coordinator that the program re-forms in its
  // own process (v1::RankHeartbeat.reforms_in_process); a program job that
  // never calls them is restarted whole on every change instead, as
  // torchrun restarts its workers (docs/programs.md).

  bool elastic() const { return env_.joined.spec().has_elastic(); }

  // One 8-byte all-reduce (every rank, at the same point, best at the start
  // of a step): true when the coordinator asked for a planned change and
  // every rank must call JoinNextGeneration(OkStatus()) now. Always false,
  // without a collective, for a job that is not elastic. A failed
  // collective's status otherwise.
  absl::StatusOr<bool> ReformRequested();

  // Aborts the current communicator (with `why`, the failure that ended the
  // generation, or OK for a planned change), joins the next generation at
  // the coordinator (asking again while it forms, up to
  // elastic.wait_seconds plus a minute) and connects to its members. True:
  // joined, and rank(), world_size(), generation(), communicator(),
  // checkpoints and metrics are the new generation's. False: this rank is
  // not part of it (its agent is draining): the program should exit 0,
  // without a collective. FAILED_PRECONDITION for a job without an elastic
  // block or a session not started by chorus-rank (CHORUS_AGENT_ID /
  // CHORUS_SLOT unset); the Join's or the connection's error otherwise.
  absl::StatusOr<bool> JoinNextGeneration(const absl::Status& why);

  // ShareNewestTensors / AverageHeldTensors (elastic.h) over communicator().
  absl::StatusOr<SharedTensors> ShareNewestState(int64_t held_step,
                                                 const std::vector<NamedTensor>& tensors);
  absl::StatusOr<int> AverageHeldState(bool held, const std::vector<NamedTensor>& tensors);

 private:
  Session(Parts parts, SessionOptions options);
  // The directives the supervisor passes on, until the session ends.
  void ReadDirectives();
  // Marks the progress records reforms_in_process (an elastic job only) and
  // sends one at once the first time.
  void DeclareReformsInProcess();
  absl::Time StateDeadline() const;
  // One attempt to send a report of ReportMetrics, on reports_'s thread.
  absl::Status SendReport(const v1::ReportRequest& request, absl::Time deadline);

  const SessionOptions options_;
  SessionEnvironment env_;  // written under comm_mu_ (JoinNextGeneration)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Store> store_;  // the communicator's; outlives it
  // Swapped by JoinNextGeneration; the directive thread aborts it.
  mutable absl::Mutex comm_mu_;
  std::shared_ptr<Communicator> comm_;
  // Earlier generations' communicators (aborted) and their stores: the
  // program may still hold references to them until it has rebuilt.
  std::vector<std::pair<std::shared_ptr<Communicator>, std::unique_ptr<Store>>> retired_;
  std::unique_ptr<CheckpointStorage> checkpoint_storage_;
  std::unique_ptr<TensorCheckpoints> checkpoints_;
  // The current generation's (JoinNextGeneration replaces it); its Send is
  // also how reports_ sends.
  std::shared_ptr<MetricsReporter> metrics_ ABSL_GUARDED_BY(comm_mu_);
  // Sends ReportMetrics's reports; ends first in the destructor.
  std::unique_ptr<ReportQueue> reports_;
  std::unique_ptr<ProgressReporter> progress_;
  int64_t checkpoint_requests_seen_ = 0;
  bool send_on_every_change_ = false;

  // The newest generation a REFORM_AT_STEP_BOUNDARY directive asked for.
  std::atomic<int64_t> reform_request_{0};
  std::shared_ptr<ProgressSender> directives_;
  std::atomic<bool> stop_directives_{false};
  std::thread directive_thread_;
};

// SIGUSR1s this process has received since a Session installed its
// handler (the count CheckpointRequested compares against).
int64_t CheckpointSignalsReceived();

}  // namespace chorus

#endif  // CHORUS_SDK_SESSION_H_
