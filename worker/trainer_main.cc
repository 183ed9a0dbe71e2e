// chorus-trainer: a rank of a built-in training job. chorus-rank (the
// process the node agent started, worker/rank_main.cc) joins the job's
// generation and, for a job that trains with the built-in trainer, executes
// this binary in its place: the same process (pid, process group, standard
// streams), with the JoinResponse it got in the file CHORUS_RANK_JOINED.
//
// It bootstraps its communicator through the coordinator's store (Gloo for a
// CPU job; NCCL on GPU CHORUS_SLOT for a job with resources.device CUDA: the
// agent offers one slot per GPU, so slot k is the k-th GPU this process
// sees, after any CUDA_VISIBLE_DEVICES the operator set), trains, reports
// metrics, and (an elastic job) joins the next generation in the same
// process when a peer is lost (docs/elastic.md), and exits 0 on success or 1
// with the reason on stderr as one error record (the agent relays the last
// lines to the coordinator, which makes the last record the job's failure
// reason: Note [Rank error record] in common/output_limits.h). An exception
// that escapes training (LibTorch's c10::Error, std::bad_alloc) ends it the
// same way, with a record naming the cause and where it happened
// (worker/runtime/rank_failure.h).
//
// Configuration comes from the environment the agent sets:
//   CHORUS_COORDINATOR  HOST:PORT of the coordinator, or a list a:p,b:p (follow the leader)
//   CHORUS_JOB_ID, CHORUS_GENERATION, CHORUS_AGENT_ID, CHORUS_SLOT
//   CHORUS_RANK_HOST    address this rank's Gloo transport binds (default 127.0.0.1)
//   LOCAL_RANK, LOCAL_WORLD_SIZE (as torchrun sets them)
//   CHORUS_SAMPLE_TRACE a directory: test mode, worker/train/sample_trace.h
//   CHORUS_TEST_SETUP_GATE a file: test mode, TrainOptions::setup_gate
// and from chorus-rank: CHORUS_RANK_JOINED, the join file (removed once read).

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/rank_storage.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/auth.h"
#include "common/env_names.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/memory.h"
#include "common/memory_estimate.h"
#include "common/metrics_text.h"
#include "common/output_limits.h"
#include "common/retry.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/grpc_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/runtime/heartbeat_compose.h"
#include "worker/runtime/heartbeat_stream.h"
#include "worker/runtime/join_generation.h"
#include "worker/runtime/rank_failure.h"
#include "worker/runtime/report_queue.h"
#include "worker/train/step_boundary.h"
#include "worker/train/trainer.h"

namespace chorus {
namespace {

std::string Env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// SIGUSR1 (sent by the agent for `chorus checkpoint`): the requests so far,
// and the training progress that counts them once there is one. The handler
// counts first and then looks for the progress; after publishing the
// progress the rank raises its count to the requests so far. Both take the
// maximum, so a request that came during setup is not lost. (Lock-free
// atomics only: safe in a handler.)
std::atomic<int64_t> g_checkpoint_requests{0};
std::atomic<TrainingProgress*> g_progress{nullptr};

void RaiseTo(std::atomic<int64_t>& counter, int64_t value) {
  int64_t now = counter.load();
  while (now < value && !counter.compare_exchange_weak(now, value)) {
  }
}

void OnCheckpointSignal(int) {
  const int64_t requests = g_checkpoint_requests.fetch_add(1) + 1;
  TrainingProgress* p = g_progress.load();
  if (p != nullptr) RaiseTo(p->checkpoint_request, requests);
}

// Note [Rank error record] in common/output_limits.h.
int Fail(const std::string& message) {
  std::cerr << RankErrorRecord(message) << std::endl;
  return 1;
}

// Where the rank is, kept outside Run so that an exception escaping it can
// still say where it happened (see FailWithException).
struct RankWhere {
  int rank = -1;  // until joined
  const char* stage = "while starting";
  bool training = false;
  TrainingProgress progress;  // Train's, while `training`
  v1::JobSpec spec;           // once joined

  std::string Describe() const {
    if (!training) return stage;
    const int phase = progress.phase.load();
    if (phase == v1::SETUP) {
      return "while setting up training (loading data, building the model and optimizer)";
    }
    return absl::StrCat("in phase ", v1::Phase_Name(static_cast<v1::Phase>(phase)), " at step ",
                        progress.step.load());
  }
};

// Any exception that escapes Run (a c10::Error LibTorch threw where no
// component caught it, std::bad_alloc, ...) ends the rank with its error
// record on stderr, which becomes the job's reason.
int FailWithException(const RankWhere& where, std::exception_ptr error) {
  std::string hint;
  if (DescribeException(error).out_of_memory && where.spec.has_model()) {
    hint = absl::StrCat("the spec's estimate for a rank is ",
                        EstimateRankMemory(where.spec, LocalFileSize).ToString());
    if (const int64_t memory = MachineMemoryBytes(); memory > 0)
      absl::StrAppend(&hint, "; this machine has ", FormatBytes(static_cast<double>(memory)));
  }
  return Fail(RankFailureLine(where.rank, where.Describe(), error, hint));
}

// One generation as this rank process joined it: the coordinator's answer,
// the communicator bootstrapped through the coordinator's store, and where
// checkpoints go. Old generations are kept (aborted) until the process ends.
struct JoinedGeneration {
  v1::JoinResponse joined;
  std::unique_ptr<GrpcStore> store;  // the communicator's; must outlive it
  std::shared_ptr<Communicator> comm;
  std::unique_ptr<CheckpointStorage> checkpoint_storage;

  CheckpointStorage* checkpoints() const { return checkpoint_storage.get(); }
};

// Builds the communicator and checkpoint storage of `joined`'s generation;
// a CUDA job's on GPU `slot`.
absl::StatusOr<std::unique_ptr<JoinedGeneration>> ConnectGeneration(
    const v1::JoinResponse& joined, const std::shared_ptr<grpc::Channel>& channel,
    const std::string& job_id, const std::string& coordinator, const std::string& rank_host,
    int slot) {
  auto gen = std::make_unique<JoinedGeneration>();
  gen->joined = joined;
  gen->store = std::make_unique<GrpcStore>(channel, joined.store_namespace());
  if (joined.spec().resources().device() == v1::ResourceSpec::CUDA) {
    if (!NcclAvailable()) {
      return absl::FailedPreconditionError(
          "the job's resources.device is CUDA, but this chorus-rank was built without NCCL; "
          "build it with `bazel build --config=cuda` against a CUDA LibTorch (docs/gpu.md)");
    }
    NcclOptions options;
    options.rank = joined.rank();
    options.size = joined.world_size();
    options.device = slot;
    ASSIGN_OR_RETURN(gen->comm, CreateNcclCommunicator(options, *gen->store));
  } else {
    GlooOptions options;
    options.rank = joined.rank();
    options.size = joined.world_size();
    options.hostname = rank_host;
    ASSIGN_OR_RETURN(gen->comm, CreateGlooCommunicator(options, *gen->store));
  }
  absl::StatusOr<std::unique_ptr<CheckpointStorage>> storage = MakeRankCheckpointStorage(
      channel, joined.spec().checkpoint(), coordinator, job_id, joined.generation(), joined.rank());
  if (!storage.ok()) {
    gen->comm->Abort(storage.status().message());
    return storage.status();
  }
  gen->checkpoint_storage = *std::move(storage);
  return gen;
}

// The JoinResponse chorus-rank got and left in CHORUS_RANK_JOINED's file,
// which is removed.
absl::StatusOr<v1::JoinResponse> TakeJoinFromRank() {
  const std::string join_file = Env(kEnvRankJoined);
  if (join_file.empty()) {
    return absl::FailedPreconditionError(
        "CHORUS_RANK_JOINED is not set: chorus-trainer is started by chorus-rank");
  }
  absl::StatusOr<v1::JoinResponse> joined = ReadJoinFile(join_file);
  ::unlink(join_file.c_str());
  unsetenv(kEnvRankJoined);
  return joined;
}

// Directives the training loop acts on at a step's end; false for others.
bool TakeStepDirective(const std::string& job_id, const v1::Directive& directive,
                       TrainingProgress& progress) {
  if (directive.kind() == v1::Directive::REFORM_AT_STEP_BOUNDARY) {
    // Acted on at the next step boundary the ranks agree on.
    RaiseTo(progress.reform_request,
            PackReformRequest(directive.generation(), directive.world_size()));
    return true;
  }
  if (directive.kind() != v1::Directive::CHECKPOINT_AND_HOLD) return false;
  // A preemption that re-queues the job (TrainingProgress::
  // hold_after_checkpoint); sent on every heartbeat until the rank is
  // stopped, acted on once.
  if (!progress.hold_after_checkpoint.exchange(true)) {
    LOG(WARNING) << job_id << ": " << directive.reason()
                 << "; checkpointing at the end of this step, then holding";
    progress.checkpoint_request.fetch_add(1);
  }
  return true;
}

// One chorus-trainer process: the generations it joined (old ones kept,
// aborted, until the process ends), the one training runs in (read by the
// heartbeat thread), its reports to the coordinator and, for an elastic
// job, its moves to the next generation.
class TrainerRank {
 public:
  // Reads the launch environment and the join chorus-rank left, then
  // connects to the first generation's ranks. An error's message is the
  // rank's failure line.
  static absl::StatusOr<std::unique_ptr<TrainerRank>> Start(RankWhere& where) {
    ASSIGN_OR_RETURN(RankLaunch launch, RankLaunchFromEnvironment());
    // Credentials come from the agent through the environment (CHORUS_TOKEN,
    // CHORUS_TLS_CA, CHORUS_TLS_CERT, CHORUS_TLS_KEY).
    ASSIGN_OR_RETURN(ClientSecurity security, LoadClientSecurity("", "", "", ""));
    ConfigureClient(std::move(security));
    std::shared_ptr<grpc::Channel> channel = MakeCoordinatorChannel(launch.coordinator);
    // chorus-rank joined (launch.join is what later joins build on).
    ASSIGN_OR_RETURN(v1::JoinResponse first, TakeJoinFromRank());
    std::unique_ptr<TrainerRank> rank(
        new TrainerRank(where, std::move(launch), std::move(channel), std::move(first)));
    where.rank = rank->first_.rank();
    where.spec = rank->spec();
    where.stage = "while connecting to the other ranks";
    rank->Announce(rank->first_);
    RETURN_IF_ERROR(rank->Connect(rank->first_).status());
    return rank;
  }

  // Trains to the end, sending heartbeats meanwhile; the process's exit
  // code.
  int Train() {
    TrainingProgress& progress = where_.progress;
    g_progress.store(&progress);
    RaiseTo(progress.checkpoint_request, g_checkpoint_requests.load());
    const TrainOptions train_options = MakeTrainOptions();
    absl::StatusOr<v1::Metrics> result;
    {
      HeartbeatStream::Options heartbeat_options;
      // Through the agent when it collects its ranks' heartbeats (Note
      // [Heartbeats through the agent] in worker/agent/agent.cc).
      heartbeat_options.agent = agent_;
      heartbeat_options.on_directive = [this](const v1::Directive& d) { OnDirective(d); };
      HeartbeatStream heartbeats(
          *ranks_,
          [this] {
            absl::MutexLock lock(&mu_);
            return ComposeHeartbeat(current_->joined, job_id_, *current_->comm, where_.progress,
                                    absl::Now());
          },
          heartbeat_options);
      where_.training = true;
      result = chorus::Train(
          spec(), *generations_.front()->comm,
          [this](const v1::Metrics& m) { reports_.Offer(RequestFor(m, /*final=*/false)); },
          &progress, train_options);
    }
    g_progress.store(nullptr);
    where_.training = false;
    where_.stage = "after training";
    return Finish(result);
  }

 private:
  TrainerRank(RankWhere& where, RankLaunch launch, std::shared_ptr<grpc::Channel> channel,
              v1::JoinResponse first)
      : where_(where),
        launch_(std::move(launch)),
        job_id_(launch_.join.job_id()),
        rank_host_(Env(kEnvRankHost, "127.0.0.1")),
        channel_(std::move(channel)),
        ranks_(v1::RankService::NewStub(channel_)),
        reports_([this](const v1::ReportRequest& request, absl::Time deadline) {
          return SendReport(request, deadline);
        }),
        agent_(AgentChannelFromEnvironment()),
        joiner_(*ranks_, AgentJoinChannel(agent_)),
        first_(std::move(first)) {}

  const v1::JobSpec& spec() const { return first_.spec(); }

  void Announce(const v1::JoinResponse& joined) const {
    setenv("RANK", std::to_string(joined.rank()).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(joined.world_size()).c_str(), 1);
    LOG(INFO) << job_id_ << ": rank " << joined.rank() << " of " << joined.world_size()
              << ", generation " << joined.generation() << ", training traffic on " << rank_host_;
  }

  // Connects to `joined`'s ranks and makes it the generation training runs
  // in (a CUDA job's communicator on GPU CHORUS_SLOT).
  absl::StatusOr<JoinedGeneration*> Connect(const v1::JoinResponse& joined) {
    ASSIGN_OR_RETURN(std::unique_ptr<JoinedGeneration> gen,
                     ConnectGeneration(joined, channel_, job_id_, launch_.coordinator, rank_host_,
                                       launch_.join.slot()));
    generations_.push_back(std::move(gen));
    absl::MutexLock lock(&mu_);
    current_ = generations_.back().get();
    return current_;
  }

  TrainOptions MakeTrainOptions() {
    TrainOptions options;
    options.checkpoints = generations_.back()->checkpoints();
    options.resume = first_.resume();
    options.generation = first_.generation();
    if (spec().has_elastic()) {
      options.rejoin = [this](const absl::Status& failure) { return Rejoin(failure); };
    }
    options.sample_trace_dir = Env(kEnvSampleTrace);
    options.setup_gate = Env(kEnvTestSetupGate);
    if (!first_.resume().job_id().empty() && first_.rank() == 0 && first_.generation() == 1) {
      LOG(INFO) << job_id_ << ": resuming from checkpoint " << first_.resume().job_id() << " step "
                << first_.resume().step();
    }
    return options;
  }

  v1::JoinResponse CurrentJoined() {
    absl::MutexLock lock(&mu_);
    return current_->joined;
  }

  // This rank's report of `metrics` as a member of its current generation.
  v1::ReportRequest RequestFor(const v1::Metrics& metrics, bool final) {
    const v1::JoinResponse joined = CurrentJoined();
    v1::ReportRequest request;
    request.set_job_id(job_id_);
    request.set_generation(joined.generation());
    request.set_rank(joined.rank());
    *request.mutable_metrics() = metrics;
    request.set_final(final);
    request.set_success(true);
    return request;
  }

  // A report along the way, on reports_'s thread: one attempt, best effort
  // (Note [Reports off the training thread] in
  // worker/runtime/report_queue.h).
  absl::Status SendReport(const v1::ReportRequest& request, absl::Time deadline) {
    v1::ReportResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    return FromGrpcStatus(ranks_->Report(&context, request, &response));
  }

  // The final report, sent once reports_ has stopped: retried while the
  // coordinator is unreachable (e.g. restarting), up to a minute.
  void ReportFinal(const v1::Metrics& metrics) {
    const v1::ReportRequest request = RequestFor(metrics, /*final=*/true);
    RetryOptions retry;
    retry.deadline = absl::Minutes(1);
    retry.attempt_timeout = absl::Seconds(10);
    retry.max_backoff = absl::Seconds(1);
    absl::Status s = Retry(retry, [&](absl::Time attempt_deadline) {
      v1::ReportResponse response;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(attempt_deadline));
      context.set_wait_for_ready(true);
      return FromGrpcStatus(ranks_->Report(&context, request, &response));
    });
    if (!s.ok()) LOG(WARNING) << "report: " << s.message();
  }

  // Elastic jobs: after a failed collective, abort this generation's
  // communicator (peers blocked on this rank fail at once), join the next
  // generation and connect to its members (docs/elastic.md). A rank the
  // next generation does not include (a drain) leaves: left_.
  absl::StatusOr<Generation> Rejoin(const absl::Status& failure) {
    JoinedGeneration* failed;
    {
      absl::MutexLock lock(&mu_);
      failed = current_;
    }
    const int64_t was = failed->joined.generation();
    LOG(WARNING) << job_id_ << ": generation " << was << " failed (" << failure.message()
                 << "); joining the next one";
    failed->comm->Abort(failure.message());
    where_.stage = "while joining the next generation";
    v1::JoinRequest next = launch_.join;
    next.set_generation(was + 1);
    // Through the agent when it takes its ranks' joins (Note
    // [Joins gathered by the agent] in worker/agent/agent.cc).
    ASSIGN_OR_RETURN(
        v1::JoinResponse joined,
        joiner_.Join(
            next, absl::Now() + absl::Seconds(spec().elastic().wait_seconds()) + absl::Minutes(1),
            /*until_formed=*/true));
    if (joined.leave()) {
      // Not a member of the next generation (its agent is draining).
      left_ = true;
      return absl::CancelledError(absl::StrCat("rank ", where_.rank,
                                               " left the job after generation ", was, " at step ",
                                               where_.progress.step.load()));
    }
    Announce(joined);
    where_.rank = joined.rank();
    where_.stage = "while connecting to the other ranks";
    const absl::Time connect_start = absl::Now();
    ASSIGN_OR_RETURN(JoinedGeneration * gen, Connect(joined));
    LOG(INFO) << job_id_ << ": connected to the " << joined.world_size() << " ranks of generation "
              << joined.generation() << " in "
              << absl::FormatDuration(
                     absl::Trunc(absl::Now() - connect_start, absl::Milliseconds(1)));
    // The checkpoint to start over from should no member hold training
    // state (Note [Starting over] in worker/train/trainer.cc).
    return Generation{gen->comm.get(), gen->checkpoints(), joined.generation(), joined.resume()};
  }

  // The heartbeat stream's directives: step directives for the training
  // loop, or the end of the current generation's communicator. A survivor
  // whose communicator has not failed by itself (its peers were not its
  // ring neighbours, say) learns of the next generation here.
  void OnDirective(const v1::Directive& directive) {
    if (TakeStepDirective(job_id_, directive, where_.progress)) return;
    if (directive.kind() == v1::Directive::ABORT) {
      // The job ended (failed, cancelled) and this rank was not stopped:
      // its next collective fails, and training with it.
      std::shared_ptr<Communicator> comm;
      {
        absl::MutexLock lock(&mu_);
        comm = current_->comm;
      }
      LOG(WARNING) << job_id_ << ": the coordinator aborts the rank: " << directive.reason();
      comm->Abort(absl::StrCat("the coordinator aborts the rank: ", directive.reason()));
      return;
    }
    if (directive.kind() != v1::Directive::RE_RENDEZVOUS) return;
    std::shared_ptr<Communicator> comm;
    {
      absl::MutexLock lock(&mu_);
      if (current_->joined.generation() >= directive.generation()) return;
      comm = current_->comm;
    }
    LOG(WARNING) << job_id_ << ": the coordinator formed generation " << directive.generation()
                 << " (" << directive.reason() << ")";
    comm->Abort(absl::StrCat("the coordinator formed generation ", directive.generation(), ": ",
                             directive.reason()));
  }

  // After training: the final report, or the failure (a rank that left
  // ends well).
  int Finish(const absl::StatusOr<v1::Metrics>& result) {
    // Reports along the way end here: the final report carries newer
    // metrics, and a rank that failed has nothing more to say. Waits for a
    // send in flight until its deadline at most.
    reports_.Flush(absl::Now());
    if (!result.ok()) {
      generations_.back()->comm->Abort(result.status().message());
      if (left_) {
        LOG(INFO) << job_id_ << ": " << result.status().message() << " (its agent is draining)";
        return 0;
      }
      return Fail(std::string(result.status().message()));
    }
    ReportFinal(*result);
    const v1::JoinResponse last = CurrentJoined();
    if (last.rank() == 0) {
      LOG(INFO) << job_id_ << ": done after " << result->step() << " steps, "
                << EvaluationText(*result);
    }
    return 0;
  }

  RankWhere& where_;
  const RankLaunch launch_;
  const std::string job_id_;
  const std::string rank_host_;  // where this rank's Gloo transport binds
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::RankService::Stub> ranks_;
  // Reports along the way, off the training thread; uses ranks_.
  ReportQueue reports_;
  // This process's end of its agent's channel (null: none), shared by the
  // heartbeats and the joins of later generations.
  const std::shared_ptr<ProgressSender> agent_;
  GenerationJoiner joiner_;       // used by Rejoin, on the training thread
  const v1::JoinResponse first_;  // chorus-rank's join
  std::vector<std::unique_ptr<JoinedGeneration>> generations_;
  absl::Mutex mu_;
  JoinedGeneration* current_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool left_ = false;
};

int Run(RankWhere& where) {
  absl::StatusOr<std::unique_ptr<TrainerRank>> rank = TrainerRank::Start(where);
  if (!rank.ok()) return Fail(std::string(rank.status().message()));
  return (*rank)->Train();
}

}  // namespace
}  // namespace chorus

int main(int argc, char** argv) {
  // Every step frees and takes again the same large tensors: keep them.
  chorus::KeepFreedMemoryForReuse({});
  chorus::InitRankLogging(argv[0], 0);
  // SIGTERM is how the agent stops a rank: a normal exit, not a crash report.
  signal(SIGTERM, SIG_DFL);
  // Gloo writes to its peers' sockets with plain writes: a peer that died
  // (a killed rank, a lost node) must fail the collective with EPIPE, not
  // kill this rank with SIGPIPE — a survivor of an elastic job re-forms.
  signal(SIGPIPE, SIG_IGN);
  // SIGUSR1 must not kill a rank (its default), even before training starts.
  // The agent starts ranks with it blocked, so one sent before this point
  // waits until it is unblocked here.
  struct sigaction checkpoint_now = {};
  checkpoint_now.sa_handler = chorus::OnCheckpointSignal;
  checkpoint_now.sa_flags = SA_RESTART;
  sigemptyset(&checkpoint_now.sa_mask);
  sigaction(SIGUSR1, &checkpoint_now, nullptr);
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigprocmask(SIG_UNBLOCK, &usr1, nullptr);
  chorus::RankWhere where;
  try {
    return chorus::Run(where);
  } catch (...) {
    chorus::g_progress.store(nullptr);
    return chorus::FailWithException(where, std::current_exception());
  }
}
