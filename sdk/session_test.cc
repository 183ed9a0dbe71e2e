#include "chorus/session.h"

#include <signal.h>
#include <stdlib.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "checkpoint/coordinator_storage.h"
#include "checkpoint/fake_checkpoint_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/store.h"

namespace chorus {
namespace {

TEST(SessionTest, OutsideChorusTheMissingVariableIsNamed) {
  for (const char* name : {"CHORUS_JOB_ID", "CHORUS_COORDINATOR", "RANK", "WORLD_SIZE",
                           "CHORUS_JOIN_FILE", "CHORUS_PROGRESS_FD"}) {
    unsetenv(name);
  }
  SessionOptions options;
  options.handle_checkpoint_signal = false;
  absl::StatusOr<std::unique_ptr<Session>> session = Session::FromEnvironment(options);
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(session.status().message().rfind("CHORUS_JOB_ID is not set: ", 0), 0u)
      << session.status();
  EXPECT_NE(session.status().message().find("as a `program` job"), std::string::npos);
}

Session::Parts PartsFor(int rank, FakeCheckpointService* coordinator) {
  Session::Parts parts;
  parts.env.rank = rank;
  parts.env.world_size = 2;
  parts.env.generation = 1;
  parts.env.job_id = "job-000001";
  if (coordinator != nullptr) {
    parts.checkpoint_storage = std::make_unique<CoordinatorCheckpointStorage>(
        coordinator->channel(), "job-000001", 1, rank);
  }
  return parts;
}

SessionOptions Quiet() {
  SessionOptions options;
  options.progress_interval = absl::ZeroDuration();
  return options;
}

TEST(SessionTest, StepsAndPhasesGoToTheProgressSink) {
  absl::Mutex mu;
  std::vector<v1::RankHeartbeat> got;
  Session::Parts parts = PartsFor(0, nullptr);
  parts.progress_sink = [&](const v1::RankHeartbeat& hb) {
    absl::MutexLock lock(&mu);
    got.push_back(hb);
    return absl::OkStatus();
  };
  {
    std::unique_ptr<Session> session = Session::FromParts(std::move(parts), Quiet());
    EXPECT_EQ(session->rank(), 0);
    EXPECT_EQ(session->world_size(), 2);
    EXPECT_FALSE(session->resuming());
    { PhaseScope phase(session->progress(), v1::EVAL); }
    session->Step(3, 0.5, 10);
  }
  absl::MutexLock lock(&mu);
  ASSERT_EQ(got.size(), 4u);  // EVAL, back to SETUP, the step, FINISHED at the end
  EXPECT_EQ(got[0].phase(), v1::EVAL);
  EXPECT_EQ(got[1].phase(), v1::SETUP);
  EXPECT_EQ(got[2].step(), 3);
  EXPECT_DOUBLE_EQ(got[2].loss(), 0.5);
  EXPECT_EQ(got[3].phase(), v1::FINISHED);
}

// The coordinator's Report, frozen for the first call until thawed (as a
// SIGSTOPped leader is), recording the step of every report it answers.
class FrozenRanks : public v1::RankService::Service {
 public:
  grpc::Status Report(grpc::ServerContext*, const v1::ReportRequest* request,
                      v1::ReportResponse*) override {
    bool first;
    {
      absl::MutexLock lock(&mu_);
      first = ++calls_ == 1;
    }
    if (first) thaw_.WaitForNotificationWithTimeout(absl::Seconds(10));
    absl::MutexLock lock(&mu_);
    steps_.push_back(request->metrics().step());
    return grpc::Status::OK;
  }
  bool AwaitFirstCall() {
    absl::MutexLock lock(&mu_);
    auto called = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ > 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&called), absl::Seconds(10));
  }
  void Thaw() { thaw_.Notify(); }
  std::vector<int64_t> steps() {
    absl::MutexLock lock(&mu_);
    return steps_;
  }

 private:
  absl::Notification thaw_;
  absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> steps_ ABSL_GUARDED_BY(mu_);
};

// Note [Reports off the training thread] (worker/runtime/report_queue.h).
TEST(SessionTest, ReportMetricsNeverWaitsForAFrozenCoordinator) {
  FrozenRanks ranks;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&ranks);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  Session::Parts parts = PartsFor(0, nullptr);
  parts.metrics = std::make_unique<MetricsReporter>(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()),
      "job-000001", /*generation=*/1, /*rank=*/0);
  {
    std::unique_ptr<Session> session = Session::FromParts(std::move(parts), Quiet());
    v1::Metrics metrics;
    metrics.set_step(1);
    ASSERT_TRUE(session->ReportMetrics(metrics).ok());
    ASSERT_TRUE(ranks.AwaitFirstCall());
    const absl::Time start = absl::Now();
    for (int64_t step = 2; step <= 50; ++step) {
      metrics.set_step(step);
      EXPECT_TRUE(session->ReportMetrics(metrics).ok());
    }
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(50));
    ranks.Thaw();
    // The session's end sends the report still pending: the newest.
  }
  EXPECT_EQ(ranks.steps(), (std::vector<int64_t>{1, 50}));
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

// Note [Restart-all] (coordinator/scheduling/running_job.h): the coordinator restarts
// every rank of a program job unless its records say the program re-forms
// in process, which an elastic job's Session says once the program uses its
// elastic hooks.
TEST(SessionTest, UsingTheElasticHooksDeclaresInProcessReformation) {
  for (const bool elastic : {false, true}) {
    SCOPED_TRACE(elastic ? "elastic" : "not elastic");
    absl::Mutex mu;
    std::vector<v1::RankHeartbeat> got;
    Session::Parts parts = PartsFor(0, nullptr);
    parts.env.world_size = 1;
    parts.env.rank_host = "127.0.0.1";
    if (elastic) parts.env.joined.mutable_spec()->mutable_elastic()->set_max_restarts(3);
    MemoryStore store;
    absl::StatusOr<std::shared_ptr<Communicator>> comm =
        CreateJobCommunicator(parts.env, store, absl::Seconds(10));
    ASSERT_TRUE(comm.ok()) << comm.status();
    parts.comm = *comm;
    parts.progress_sink = [&](const v1::RankHeartbeat& hb) {
      absl::MutexLock lock(&mu);
      got.push_back(hb);
      return absl::OkStatus();
    };
    std::unique_ptr<Session> session = Session::FromParts(std::move(parts), Quiet());
    session->Step(1, 0.5, 10);
    {
      absl::MutexLock lock(&mu);
      ASSERT_FALSE(got.empty());
      EXPECT_FALSE(got.back().reforms_in_process()) << "nothing said before a hook is used";
    }
    absl::StatusOr<bool> planned = session->ReformRequested();
    ASSERT_TRUE(planned.ok()) << planned.status();
    EXPECT_FALSE(*planned);
    session->Step(2, 0.5, 10);
    absl::MutexLock lock(&mu);
    EXPECT_EQ(got.back().step(), 2);
    EXPECT_EQ(got.back().reforms_in_process(), elastic)
        << "said on every record from the first hook on, and only by an elastic job";
  }
}

TEST(SessionTest, CheckpointRequestedOncePerSignal) {
  std::unique_ptr<Session> session = Session::FromParts(PartsFor(0, nullptr), Quiet());
  EXPECT_FALSE(session->CheckpointRequested());
  ASSERT_EQ(raise(SIGUSR1), 0);
  EXPECT_TRUE(session->CheckpointRequested());
  EXPECT_FALSE(session->CheckpointRequested());
  ASSERT_EQ(raise(SIGUSR1), 0);
  ASSERT_EQ(raise(SIGUSR1), 0);
  EXPECT_TRUE(session->CheckpointRequested());  // two requests before a look: one checkpoint
  EXPECT_FALSE(session->CheckpointRequested());
}

TEST(SessionTest, SaveThenResumeBitForBit) {
  FakeCheckpointService coordinator;
  coordinator.set_data_port(FakeCheckpointService::DataPort::kNone);
  ASSERT_TRUE(coordinator.Start().ok());
  torch::manual_seed(3);
  at::Tensor w = torch::randn({16, 8});
  at::Tensor steps = torch::tensor({int64_t{777}});
  {
    std::unique_ptr<Session> rank0 = Session::FromParts(PartsFor(0, &coordinator), Quiet());
    ASSERT_TRUE(rank0->SaveCheckpoint(12, {{"w", w}, {"steps", steps}}).ok());
  }
  std::optional<v1::CheckpointManifest> manifest = coordinator.Manifest(12);
  ASSERT_TRUE(manifest.has_value());
  manifest->set_job_id("job-000001");

  Session::Parts parts = PartsFor(1, &coordinator);
  *parts.env.joined.mutable_resume() = *manifest;
  std::unique_ptr<Session> resumed = Session::FromParts(std::move(parts), Quiet());
  ASSERT_TRUE(resumed->resuming());
  at::Tensor w2 = torch::zeros({16, 8});
  at::Tensor steps2 = torch::zeros({1}, torch::kLong);
  absl::StatusOr<int64_t> step = resumed->RestoreCheckpoint({{"w", w2}, {"steps", steps2}});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 12);
  EXPECT_EQ(std::memcmp(w.data_ptr(), w2.data_ptr(), w.numel() * sizeof(float)), 0);
  EXPECT_EQ(steps2.item<int64_t>(), 777);
  EXPECT_EQ(resumed->progress().Current().phase(), v1::SETUP);  // CHECKPOINT left again
}

TEST(SessionTest, NoStorageIsAnErrorNotACrash) {
  std::unique_ptr<Session> session = Session::FromParts(PartsFor(0, nullptr), Quiet());
  absl::Status s = session->SaveCheckpoint(1, {{"w", torch::ones({1})}});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "this session has no checkpoint storage");
}

TEST(SessionTest, CpuJobGetsGloo) {
  SessionEnvironment env;
  env.job_id = "job-000007";
  env.rank_host = "127.0.0.1";
  env.joined.mutable_spec()->mutable_resources()->set_device(v1::ResourceSpec::CPU);
  MemoryStore store;
  absl::StatusOr<std::shared_ptr<Communicator>> comm =
      CreateJobCommunicator(env, store, absl::Seconds(10));
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_TRUE((*comm)->device().is_cpu());
  torch::Tensor x = torch::full({4}, 3.0f);
  ASSERT_TRUE((*comm)->AllReduce(x, ReduceOp::kSum, "x")->Wait(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_TRUE(torch::equal(x, torch::full({4}, 3.0f)));
}

// Under Chorus a rank's GPU is its agent slot, not its LOCAL_RANK: two
// two-rank jobs on one four-GPU agent both have LOCAL_RANKs 0 and 1, but the
// second holds slots 2 and 3. Outside Chorus (torchrun), LOCAL_RANK.
TEST(SessionTest, TheGpuIsTheAgentSlotUnderChorusAndLocalRankOutside) {
  SessionEnvironment env;
  env.local_rank = 1;
  env.slot = 3;
  EXPECT_EQ(JobGpu(env), 3);
  env.slot = 0;
  EXPECT_EQ(JobGpu(env), 0);
  env.slot = -1;  // CHORUS_SLOT unset
  EXPECT_EQ(JobGpu(env), 1);
}

// A CUDA job gets NCCL on the rank's GPU; without NCCL in the build, or
// without a GPU, the error names the rank and says what is missing.
TEST(SessionTest, CudaJobGetsNcclOrSaysWhatIsMissing) {
  SessionEnvironment env;
  env.job_id = "job-000007";
  env.joined.mutable_spec()->mutable_resources()->set_device(v1::ResourceSpec::CUDA);
  MemoryStore store;
  absl::StatusOr<std::shared_ptr<Communicator>> comm =
      CreateJobCommunicator(env, store, absl::Seconds(10));
  if (NcclAvailable() && torch::cuda::is_available()) {
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_EQ((*comm)->device(), torch::Device(torch::kCUDA, 0));
    return;
  }
  ASSERT_FALSE(comm.ok());
  EXPECT_NE(comm.status().message().find("rank 0 of job-000007"), std::string::npos)
      << comm.status();
  if (!NcclAvailable()) {
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(comm.status().message().find("resources.device is CUDA"), std::string::npos);
    EXPECT_NE(comm.status().message().find("--config=cuda"), std::string::npos);
    EXPECT_NE(comm.status().message().find("-DCHORUS_WITH_CUDA=ON"), std::string::npos);
  }
}

}  // namespace
}  // namespace chorus
