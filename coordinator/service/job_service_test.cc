// JobService as an adapter, in process (no network): proto requests reach
// the JobManager and Scheduler, their statuses come back as gRPC codes with
// the same messages, bad requests are refused naming the field, and tokens
// are checked.
#include "coordinator/service/job_service.h"

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/job_spec.h"
#include "coordinator/scheduling/scheduling_policy.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

class JobServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Serve(AllowAll()); }

  void Serve(const TokenAuthorizer& auth) {
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/job_service_" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    state_ = *StateStore::Open(dir);
    jobs_ = *JobManager::Create(*state_, &clock_);
    scheduler_ = std::make_unique<Scheduler>(*jobs_, &clock_, SchedulerOptions{"127.0.0.1:1"});
    service_ = std::make_unique<JobServiceImpl>(*jobs_, *scheduler_, auth, /*checkpoints=*/nullptr);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    stub_ = v1::JobService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  void TearDown() override { Stop(); }

  void Stop() {
    if (server_ != nullptr) server_->Shutdown();
    stub_.reset();
    server_.reset();
    service_.reset();
    scheduler_.reset();
    jobs_.reset();
    state_.reset();
  }

  static std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return context;
  }

  grpc::Status Submit(const std::string& text, v1::SubmitJobResponse* response,
                      const std::string& resume_from = "") {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = *ParseJobSpec(text, SpecFormat::kTextProto, "test");
    request.set_resume_from(resume_from);
    return stub_->SubmitJob(Context().get(), request, response);
  }

  static constexpr char kSpec[] =
      "model { mlp {} } data { synthetic {} } resources { min_ranks: 2 max_ranks: 2 }";

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  TokenAuthorizer auth_;
  std::unique_ptr<StateStore> state_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<JobServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

TEST_F(JobServiceTest, SubmitGetAndListMapTheJob) {
  v1::SubmitJobResponse submitted;
  ASSERT_TRUE(Submit(kSpec, &submitted).ok());
  EXPECT_EQ(submitted.job_id(), "job-000001");
  v1::GetJobRequest get;
  get.set_job_id("job-000001");
  v1::Job job;
  ASSERT_TRUE(stub_->GetJob(Context().get(), get, &job).ok());
  EXPECT_EQ(job.state(), v1::Job::PENDING) << "no agent: the job waits";
  EXPECT_EQ(job.spec().resources().min_ranks(), 2);
  EXPECT_EQ(job.submit_time_us(), 1000 * 1000000LL);

  ASSERT_TRUE(Submit(kSpec, &submitted).ok());
  v1::ListJobsRequest list;
  list.set_limit(1);
  v1::ListJobsResponse listed;
  ASSERT_TRUE(stub_->ListJobs(Context().get(), list, &listed).ok());
  ASSERT_EQ(listed.jobs_size(), 1);
  EXPECT_EQ(listed.jobs(0).job_id(), "job-000002") << "newest first";
  list.set_limit(0);
  list.add_states(v1::Job::SUCCEEDED);
  listed.Clear();
  ASSERT_TRUE(stub_->ListJobs(Context().get(), list, &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 0);
}

// Every job's spec travels in a listing: once a long history made ListJobs
// replies grow without bound, past gRPC's message limit.
TEST_F(JobServiceTest, ListingPagesThroughTheHistoryAndNoReplyOutgrowsItsLimit) {
  v1::SubmitJobResponse submitted;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Submit(kSpec, &submitted).ok());
  v1::ListJobsRequest list;
  list.set_limit(2);
  std::vector<std::string> seen;
  for (int page = 0; page < 10; ++page) {
    v1::ListJobsResponse listed;
    ASSERT_TRUE(stub_->ListJobs(Context().get(), list, &listed).ok());
    EXPECT_LE(listed.jobs_size(), 2);
    for (const v1::Job& job : listed.jobs()) seen.push_back(job.job_id());
    if (listed.next_page_token().empty()) break;
    list.set_page_token(listed.next_page_token());
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"job-000005", "job-000004", "job-000003", "job-000002",
                                            "job-000001"}));

  // Specs near the size limit: a page ends at kListJobsPageBytes.
  const std::string big(200 << 10, 'x');
  // The bulk in argv, not env: under --config=tsan, parsing a map field
  // crashes in Debian's shared libprotobuf (see //common:program_spec_test).
  const std::string program =
      absl::StrCat("program { argv: ['/bin/true', '", big, "'] working_dir: '/tmp' }");
  for (int i = 0; i < 24; ++i) {
    grpc::Status s = Submit(program, &submitted);
    ASSERT_TRUE(s.ok()) << i << ": " << s.error_message();
  }
  list.Clear();
  v1::ListJobsResponse first;
  ASSERT_TRUE(stub_->ListJobs(Context().get(), list, &first).ok());
  EXPECT_LT(first.ByteSizeLong(), JobServiceImpl::kListJobsPageBytes + (256 << 10));
  EXPECT_LT(first.jobs_size(), 24);
  EXPECT_EQ(first.jobs(0).job_id(), "job-000029");
  ASSERT_FALSE(first.next_page_token().empty());
  int total = first.jobs_size();
  list.set_page_token(first.next_page_token());
  for (int page = 0; page < 10 && !list.page_token().empty(); ++page) {
    v1::ListJobsResponse next;
    ASSERT_TRUE(stub_->ListJobs(Context().get(), list, &next).ok());
    total += next.jobs_size();
    list.set_page_token(next.next_page_token());
  }
  EXPECT_EQ(total, 29) << "every job once, across pages";

  // A spec over the limit is refused, saying what to do.
  const std::string huge = absl::StrCat("program { argv: ['/bin/true', '",
                                        std::string(300 << 10, 'x'), "'] working_dir: '/tmp' }");
  grpc::Status refused = Submit(huge, &submitted);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("spec: is 307."));
  EXPECT_THAT(refused.error_message(),
              HasSubstr("kB serialized, more than the 262.1 kB a job spec may hold"));
}

TEST_F(JobServiceTest, ValidationErrorsNameTheFieldAsInvalidArgument) {
  v1::SubmitJobResponse response;
  grpc::Status bad = Submit(
      "model { mlp {} } data { synthetic {} } strategy { ddp { bucket_cap_mb: -3 } }", &response);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("strategy.ddp.bucket_cap_mb: must be > 0, got -3"));
  grpc::Status resume = Submit(kSpec, &response, "job-000001:soon");
  EXPECT_EQ(resume.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(resume.error_message(), HasSubstr("resume_from must be JOB or JOB:STEP"));

  v1::ListJobsRequest list;
  list.set_limit(-1);
  v1::ListJobsResponse listed;
  grpc::Status limit = stub_->ListJobs(Context().get(), list, &listed);
  EXPECT_EQ(limit.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(limit.error_message(), "limit must be >= 0");
  v1::GetLogsRequest logs;
  logs.set_job_id("job-000001");
  logs.set_max_lines(-5);
  v1::GetLogsResponse got;
  grpc::Status lines = stub_->GetLogs(Context().get(), logs, &got);
  EXPECT_EQ(lines.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(lines.error_message(), "max_lines must be >= 0");
}

TEST_F(JobServiceTest, JobsNoAgentCanHoldAreRefusedOnceAgentsAreKnown) {
  constexpr char kHuge[] = "model { mlp { hidden_sizes: [2000000000] } } data { synthetic {} }";
  // No agent yet: accepted, and status says what it waits for.
  v1::SubmitJobResponse first;
  ASSERT_TRUE(Submit(kHuge, &first).ok());
  v1::GetJobStatusRequest get;
  get.set_job_id(first.job_id());
  v1::JobStatus status;
  ASSERT_TRUE(stub_->GetJobStatus(Context().get(), get, &status).ok());
  EXPECT_EQ(status.pending_reason(),
            "waiting for a node agent with CPU slots (none is connected); later jobs start "
            "meanwhile");

  v1::AgentHello hello;
  hello.set_host("node-a");
  hello.set_slots(2);
  hello.set_memory_bytes(16'000'000'000);
  ASSERT_TRUE(scheduler_->AddAgent(hello, [](const v1::CoordinatorMessage&) {}).ok());
  v1::SubmitJobResponse response;
  grpc::Status refused = Submit(kHuge, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(refused.error_message(),
            "job spec: model.mlp.hidden_sizes: a rank needs about 5.1 TB (runtime 180.0 MB, "
            "parameters 344.0 GB, gradients 344.0 GB, checkpoint copy 344.0 GB, data 668.4 kB, "
            "the larger of activations 1.5 TB and evaluation 4.1 TB), more than the 16.0 GB of "
            "memory on the largest connected agent (node-a); make the job smaller");
  // The job accepted before stays queued, saying why.
  status.Clear();
  ASSERT_TRUE(stub_->GetJobStatus(Context().get(), get, &status).ok());
  EXPECT_EQ(status.job().state(), v1::Job::PENDING);
  EXPECT_EQ(status.pending_reason(),
            "waiting for agents that can hold 1 CPU rank: the 1 connected could hold 0 even when "
            "idle (about 5.1 TB a rank); later jobs start meanwhile");

  // A job that fits is accepted; so is any job while an agent does not say
  // how much memory it has.
  EXPECT_TRUE(Submit("model { mlp {} } data { synthetic {} }", &response).ok());
  hello.set_host("node-b");
  hello.set_memory_bytes(0);
  ASSERT_TRUE(scheduler_->AddAgent(hello, [](const v1::CoordinatorMessage&) {}).ok());
  EXPECT_TRUE(Submit(kHuge, &response).ok());
}

TEST_F(JobServiceTest, StatusCodesAndMessagesComeThrough) {
  v1::GetJobRequest get;
  get.set_job_id("job-000042");
  v1::Job job;
  grpc::Status missing = stub_->GetJob(Context().get(), get, &job);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(missing.error_message(),
            "no job \"job-000042\"; `chorus jobs` lists the jobs this coordinator knows");

  v1::SubmitJobResponse submitted;
  ASSERT_TRUE(Submit(kSpec, &submitted).ok());
  v1::CheckpointJobRequest checkpoint;
  checkpoint.set_job_id(submitted.job_id());
  v1::CheckpointJobResponse requested;
  grpc::Status pending = stub_->CheckpointJob(Context().get(), checkpoint, &requested);
  EXPECT_EQ(pending.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(pending.error_message(),
            "job job-000001 is PENDING; only a running job can be checkpointed");

  v1::CancelJobRequest cancel;
  cancel.set_job_id(submitted.job_id());
  cancel.set_reason("not needed");
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(stub_->CancelJob(Context().get(), cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.job().state(), v1::Job::CANCELLED);
  EXPECT_THAT(cancelled.job().reason(), HasSubstr("not needed"));
  EXPECT_EQ(stub_->CancelJob(Context().get(), cancel, &cancelled).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  v1::ListCheckpointsRequest list;
  list.set_job_id(submitted.job_id());
  v1::ListCheckpointsResponse listed;
  grpc::Status none = stub_->ListCheckpoints(Context().get(), list, &listed);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(none.error_message(), "this coordinator keeps no checkpoints");
}

TEST_F(JobServiceTest, SubmitAppliesTheSchedulingPolicyAndGetQueueListsThePlan) {
  absl::StatusOr<SchedulingPolicy> policy =
      ParseSchedulingPolicy("default queued_jobs=2 max_priority=NORMAL", "policy");
  ASSERT_TRUE(policy.ok()) << policy.status();
  SchedulerOptions options{"127.0.0.1:1"};
  options.scheduling_policy = *std::move(policy);
  scheduler_->Configure(std::move(options));
  v1::SubmitJobResponse response;
  grpc::Status high = Submit(absl::StrCat(kSpec, " priority: HIGH"), &response);
  EXPECT_EQ(high.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(high.error_message(),
            "job spec: priority HIGH is above what the scheduling policy allows anonymous "
            "(NORMAL); ask for at most that, or ask the administrator");
  v1::SubmitJobResponse low, normal;
  ASSERT_TRUE(Submit(absl::StrCat(kSpec, " priority: LOW"), &low).ok());
  ASSERT_TRUE(Submit(kSpec, &normal).ok());
  grpc::Status third = Submit(kSpec, &response);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.error_message(), HasSubstr("anonymous already has 2 queued jobs"));

  // No agent: both wait; the NORMAL job comes first although submitted later.
  v1::GetQueueResponse queue;
  ASSERT_TRUE(stub_->GetQueue(Context().get(), v1::GetQueueRequest(), &queue).ok());
  ASSERT_EQ(queue.jobs_size(), 2);
  EXPECT_EQ(queue.jobs(0).job_id(), normal.job_id());
  EXPECT_EQ(queue.jobs(0).priority(), v1::JobSpec::NORMAL);
  EXPECT_EQ(queue.jobs(0).min_ranks(), 2);
  EXPECT_EQ(queue.jobs(1).job_id(), low.job_id());
  EXPECT_EQ(queue.jobs(1).priority(), v1::JobSpec::LOW);
  EXPECT_EQ(queue.jobs(1).reason(),
            "waiting for a node agent with CPU slots (none is connected); later jobs start "
            "meanwhile");
}

TEST_F(JobServiceTest, EveryCallNeedsAnAdminToken) {
  Stop();
  absl::StatusOr<TokenAuthorizer> auth = TokenAuthorizer::FromText(
      "admin admin-token-0123456789\nworker worker-token-0123456789\n", "test");
  ASSERT_TRUE(auth.ok()) << auth.status();
  auth_ = *std::move(auth);
  Serve(auth_);
  v1::GetJobRequest get;
  get.set_job_id("job-000001");
  v1::Job job;
  grpc::Status anonymous = stub_->GetJob(Context().get(), get, &job);
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(anonymous.error_message(), HasSubstr("requires a token"));
  auto worker = Context();
  worker->AddMetadata("authorization", "Bearer worker-token-0123456789");
  EXPECT_EQ(stub_->GetJob(worker.get(), get, &job).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  auto admin = Context();
  admin->AddMetadata("authorization", "Bearer admin-token-0123456789");
  EXPECT_EQ(stub_->GetJob(admin.get(), get, &job).error_code(), grpc::StatusCode::NOT_FOUND)
      << "an admin gets past the check to the (missing) job";
}

// Note [Roles and owners] in common/auth.h, through every JobService call.
class JobAuthorizationTest : public JobServiceTest {
 protected:
  void SetUp() override {
    absl::StatusOr<TokenAuthorizer> auth = TokenAuthorizer::FromText(
        "admin admin-token-0123456789 root\nuser alice-token-0123456789 alice\n"
        "user bob-token-0123456789 bob\nagent agent-token-0123456789\n",
        "test");
    ASSERT_TRUE(auth.ok()) << auth.status();
    auth_ = *std::move(auth);
    Serve(auth_);
  }

  // A context presenting `who`'s token ("alice", "bob", "admin", "agent").
  static std::unique_ptr<grpc::ClientContext> As(const std::string& who) {
    std::unique_ptr<grpc::ClientContext> context = Context();
    context->AddMetadata("authorization", "Bearer " + who + "-token-0123456789");
    return context;
  }

  // Submits a named job as `who`; its id, or the refusal.
  absl::StatusOr<std::string> SubmitAs(const std::string& who,
                                       const std::string& resume_from = "") {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = *ParseJobSpec(absl::StrCat("name: \"", who, "-job\" ", kSpec),
                                            SpecFormat::kTextProto, "test");
    request.set_resume_from(resume_from);
    v1::SubmitJobResponse response;
    grpc::Status s = stub_->SubmitJob(As(who).get(), request, &response);
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
    return response.job_id();
  }

  // Every call on one job as `who`, by name: its status code and message.
  std::map<std::string, grpc::Status> EveryCall(const std::string& who, const std::string& job) {
    std::map<std::string, grpc::Status> out;
    v1::GetJobRequest get;
    get.set_job_id(job);
    v1::Job got;
    out["get"] = stub_->GetJob(As(who).get(), get, &got);
    v1::GetJobStatusRequest status;
    status.set_job_id(job);
    v1::JobStatus job_status;
    out["status"] = stub_->GetJobStatus(As(who).get(), status, &job_status);
    v1::GetLogsRequest logs;
    logs.set_job_id(job);
    v1::GetLogsResponse lines;
    out["logs"] = stub_->GetLogs(As(who).get(), logs, &lines);
    v1::ListCheckpointsRequest checkpoints;
    checkpoints.set_job_id(job);
    v1::ListCheckpointsResponse listed;
    out["checkpoints"] = stub_->ListCheckpoints(As(who).get(), checkpoints, &listed);
    v1::CheckpointJobRequest checkpoint;
    checkpoint.set_job_id(job);
    v1::CheckpointJobResponse requested;
    out["checkpoint"] = stub_->CheckpointJob(As(who).get(), checkpoint, &requested);
    v1::WatchJobRequest watch;
    watch.set_job_id(job);
    std::unique_ptr<grpc::ClientContext> watch_context = As(who);
    auto reader = stub_->WatchJob(watch_context.get(), watch);
    v1::JobEvent event;
    // An allowed watch streams the (PENDING) job's events until the
    // deadline; one read tells whether it was let through.
    const bool streamed = reader->Read(&event);
    if (streamed) watch_context->TryCancel();
    grpc::Status watched = reader->Finish();
    out["watch"] = streamed ? grpc::Status::OK : watched;
    return out;
  }
};

TEST_F(JobAuthorizationTest, AUserActsOnTheirOwnJobsOnlyAndAnAdminOnAll) {
  absl::StatusOr<std::string> alices = SubmitAs("alice");
  ASSERT_TRUE(alices.ok()) << alices.status();
  ASSERT_TRUE(jobs_->Get(*alices).ok());
  EXPECT_EQ(jobs_->Get(*alices)->owner(), "alice") << "the submitter is recorded";

  const std::map<std::string, std::string> actions = {{"get", "read"},
                                                      {"status", "read the status of"},
                                                      {"logs", "read the logs of"},
                                                      {"checkpoints", "list the checkpoints of"},
                                                      {"checkpoint", "checkpoint"},
                                                      {"watch", "watch"}};
  for (const auto& [call, status] : EveryCall("bob", *alices)) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << call;
    EXPECT_EQ(status.error_message(), absl::StrCat(*alices,
                                                   " belongs to alice; only alice or an "
                                                   "admin may ",
                                                   actions.at(call), " it"))
        << call;
  }
  for (const auto& [call, status] : EveryCall("agent", *alices)) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << call;
    EXPECT_THAT(status.error_message(), HasSubstr("agent")) << call;
  }
  // The owner and an admin get past the check (to the job's own answers:
  // a PENDING job cannot be checkpointed; this service keeps no
  // checkpoints).
  for (const std::string who : {"alice", "admin"}) {
    for (const auto& [call, status] : EveryCall(who, *alices)) {
      EXPECT_NE(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << who << " " << call << ": " << status.error_message();
    }
  }

  v1::CancelJobRequest cancel;
  cancel.set_job_id(*alices);
  v1::CancelJobResponse cancelled;
  grpc::Status refused = stub_->CancelJob(As("bob").get(), cancel, &cancelled);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(refused.error_message(),
            "job-000001 belongs to alice; only alice or an admin may cancel it");
  EXPECT_EQ(jobs_->Get(*alices)->state(), v1::Job::PENDING);
  EXPECT_TRUE(stub_->CancelJob(As("alice").get(), cancel, &cancelled).ok());
  absl::StatusOr<std::string> second = SubmitAs("alice");
  ASSERT_TRUE(second.ok());
  cancel.set_job_id(*second);
  EXPECT_TRUE(stub_->CancelJob(As("admin").get(), cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.job().state(), v1::Job::CANCELLED);
}

TEST_F(JobAuthorizationTest, OthersJobsAreListedAsTheListViewOnly) {
  ASSERT_TRUE(SubmitAs("alice").ok());
  ASSERT_TRUE(SubmitAs("bob").ok());
  v1::CancelJobRequest cancel;
  cancel.set_job_id("job-000001");
  cancel.set_reason("private reason");
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(stub_->CancelJob(As("alice").get(), cancel, &cancelled).ok());

  v1::ListJobsResponse bobs;
  ASSERT_TRUE(stub_->ListJobs(As("bob").get(), v1::ListJobsRequest(), &bobs).ok());
  ASSERT_EQ(bobs.jobs_size(), 2);
  const v1::Job& own = bobs.jobs(0);
  EXPECT_EQ(own.owner(), "bob");
  EXPECT_TRUE(own.spec().model().has_mlp()) << "his own job in full";
  const v1::Job& other = bobs.jobs(1);
  EXPECT_EQ(other.job_id(), "job-000001");
  EXPECT_EQ(other.owner(), "alice");
  EXPECT_EQ(other.state(), v1::Job::CANCELLED);
  EXPECT_EQ(other.spec().name(), "alice-job");
  EXPECT_EQ(other.spec().resources().min_ranks(), 2);
  EXPECT_GT(other.submit_time_us(), 0);
  EXPECT_FALSE(other.spec().has_model()) << "no spec beyond its name and resources";
  EXPECT_FALSE(other.spec().has_data());
  EXPECT_EQ(other.reason(), "") << "no reason";
  EXPECT_FALSE(other.has_latest_metrics());

  v1::ListJobsResponse all;
  ASSERT_TRUE(stub_->ListJobs(As("admin").get(), v1::ListJobsRequest(), &all).ok());
  ASSERT_EQ(all.jobs_size(), 2);
  EXPECT_TRUE(all.jobs(1).spec().model().has_mlp()) << "an admin sees every job in full";
  EXPECT_THAT(all.jobs(1).reason(), HasSubstr("private reason"));
}

TEST_F(JobAuthorizationTest, AnAgentTokenCannotSubmitOrList) {
  absl::StatusOr<std::string> agent = SubmitAs("agent");
  EXPECT_EQ(agent.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(agent.status().message(), HasSubstr("needs a user or admin token"));
  EXPECT_EQ(jobs_->CountByState()[v1::Job::PENDING], 0);
  v1::ListJobsResponse listed;
  EXPECT_EQ(stub_->ListJobs(As("agent").get(), v1::ListJobsRequest(), &listed).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::DrainAgentRequest drain;
  drain.set_agent("agent-1");
  v1::DrainAgentResponse drained;
  grpc::Status user_drains = stub_->DrainAgent(As("alice").get(), drain, &drained);
  EXPECT_EQ(user_drains.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(user_drains.error_message(), HasSubstr("needs an admin token"));
}

TEST_F(JobAuthorizationTest, AJobResumesOnlyFromAJobTheSubmitterMayRead) {
  ASSERT_TRUE(SubmitAs("alice").ok());
  absl::StatusOr<std::string> bobs = SubmitAs("bob", "job-000001:5");
  EXPECT_EQ(bobs.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(bobs.status().message(),
            "job-000001 belongs to alice; only alice or an admin may resume from it");
  EXPECT_TRUE(SubmitAs("alice", "job-000001:5").ok());
  EXPECT_TRUE(SubmitAs("admin", "job-000001").ok());
  EXPECT_EQ(SubmitAs("bob", "job-000042").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobAuthorizationTest, WhoAmINamesTheUserAndRole) {
  v1::WhoAmIResponse me;
  ASSERT_TRUE(stub_->WhoAmI(As("alice").get(), v1::WhoAmIRequest(), &me).ok());
  EXPECT_EQ(me.user(), "alice");
  EXPECT_EQ(me.role(), "user");
  EXPECT_TRUE(me.tokens_required());
  ASSERT_TRUE(stub_->WhoAmI(As("agent").get(), v1::WhoAmIRequest(), &me).ok());
  EXPECT_EQ(me.role(), "agent");
  EXPECT_EQ(stub_->WhoAmI(Context().get(), v1::WhoAmIRequest(), &me).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(JobAuthorizationTest, EachUsersSubmissionsCountAgainstTheirOwnQueueAndQueueIsReadable) {
  absl::StatusOr<SchedulingPolicy> policy =
      ParseSchedulingPolicy("default queued_jobs=5\nuser alice queued_jobs=1", "policy");
  ASSERT_TRUE(policy.ok()) << policy.status();
  SchedulerOptions options{"127.0.0.1:1"};
  options.scheduling_policy = *std::move(policy);
  scheduler_->Configure(std::move(options));
  absl::StatusOr<std::string> first = SubmitAs("alice");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::string> second = SubmitAs("alice");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(), HasSubstr("alice already has 1 queued job"));
  // bob's limit is the default's, not alice's.
  ASSERT_TRUE(SubmitAs("bob").ok());
  ASSERT_TRUE(SubmitAs("bob").ok());

  v1::GetQueueResponse queue;
  ASSERT_TRUE(stub_->GetQueue(As("bob").get(), v1::GetQueueRequest(), &queue).ok());
  ASSERT_EQ(queue.jobs_size(), 3);
  EXPECT_EQ(queue.jobs(0).owner(), "alice");
  EXPECT_EQ(queue.jobs(0).job_id(), *first);
  EXPECT_EQ(stub_->GetQueue(As("agent").get(), v1::GetQueueRequest(), &queue).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

}  // namespace
}  // namespace chorus
