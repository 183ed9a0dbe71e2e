// Agents and ranks end to end over gRPC: a simulated node agent connects, a
// job is placed on it, its ranks join, exit, and the job ends.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/grpc_util.h"
#include "common/job_spec.h"
#include "absl/strings/match.h"
#include "checkpoint/wire.h"
#include "common/crc32c.h"
#include "coordinator/checkpoint_data_server.h"
#include "coordinator/server.h"
#include "checkpoint/download.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

class AgentServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.state_dir = std::string(std::getenv("TEST_TMPDIR")) + "/agents_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    server_dir_ = options.state_dir;
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = MakeCoordinatorChannel(server_->address());
    jobs_ = v1::JobService::NewStub(channel_);
    agents_ = v1::AgentService::NewStub(channel_);
    ranks_ = v1::RankService::NewStub(channel_);
  }

  std::string Submit(int ranks) {
    auto spec = ParseJobSpec(absl::StrCat("model { mlp {} } data { synthetic {} } resources { min_ranks: ",
                                          ranks, " max_ranks: ", ranks, " }"),
                             SpecFormat::kTextProto, "test");
    v1::SubmitJobRequest request;
    *request.mutable_spec() = *spec;
    v1::SubmitJobResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    EXPECT_TRUE(jobs_->SubmitJob(&context, request, &response).ok());
    return response.job_id();
  }

  v1::Job::State StateOf(const std::string& job_id, v1::Job* out = nullptr) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    EXPECT_TRUE(jobs_->GetJob(&context, request, &job).ok());
    if (out) *out = job;
    return job.state();
  }

  // Polls (bounded) until the job reaches `state`.
  bool WaitForState(const std::string& job_id, v1::Job::State state) {
    for (int i = 0; i < 200; ++i) {
      if (StateOf(job_id) == state) return true;
      absl::SleepFor(absl::Milliseconds(25));
    }
    return false;
  }

  // Joins slots 0..n-1 of `agent_id` to generation 1 of `job` concurrently
  // (as pids 1000+slot).
  std::vector<v1::JoinResponse> JoinAll(const std::string& job, const std::string& agent_id, int n,
                                        std::vector<grpc::Status>* statuses) {
    std::vector<v1::JoinResponse> joined(n);
    statuses->assign(n, grpc::Status());
    std::vector<std::thread> rank_threads;
    for (int slot = 0; slot < n; ++slot) {
      rank_threads.emplace_back([&, slot] {
        v1::JoinRequest request;
        request.set_job_id(job);
        request.set_generation(1);
        request.set_agent_id(agent_id);
        request.set_slot(slot);
        request.set_pid(1000 + slot);
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
        (*statuses)[slot] = ranks_->Join(&context, request, &joined[slot]);
      });
    }
    for (auto& t : rank_threads) t.join();
    return joined;
  }

  // A simulated agent with 2 slots and a 2-rank job placed on it whose
  // ranks joined generation 1; the agent stays connected for the test.
  std::string JoinedTwoRankJob() {
    agent_stream_ = agents_->Connect(&agent_context_);
    const std::string agent_id = ConnectAgent(*agent_stream_, 2);
    const std::string job = Submit(2);
    v1::CoordinatorMessage launch;
    EXPECT_TRUE(agent_stream_->Read(&launch));
    std::vector<grpc::Status> statuses;
    JoinAll(job, agent_id, 2, &statuses);
    return job;
  }

  void TearDown() override {
    if (agent_stream_ != nullptr) agent_stream_->WritesDone();
  }

  // Connects a simulated agent with `slots` slots; returns its id.
  std::string ConnectAgent(grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>& stream,
                           int slots) {
    v1::AgentMessage hello;
    hello.mutable_hello()->set_host("sim-node");
    hello.mutable_hello()->set_slots(slots);
    EXPECT_TRUE(stream.Write(hello));
    v1::CoordinatorMessage message;
    EXPECT_TRUE(stream.Read(&message));
    EXPECT_TRUE(message.has_welcome());
    return message.welcome().agent_id();
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::string server_dir_;
  grpc::ClientContext agent_context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>> agent_stream_;  // the coordinator's --state_dir
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::AgentService::Stub> agents_;
  std::unique_ptr<v1::RankService::Stub> ranks_;
};

TEST_F(AgentServiceTest, JobIsPlacedJoinedAndSucceeds) {
  grpc::ClientContext agent_context;
  auto stream = agents_->Connect(&agent_context);
  v1::AgentMessage hello;
  hello.mutable_hello()->set_host("sim-node");
  hello.mutable_hello()->set_slots(2);
  ASSERT_TRUE(stream->Write(hello));
  v1::CoordinatorMessage message;
  ASSERT_TRUE(stream->Read(&message));
  ASSERT_TRUE(message.has_welcome());
  const std::string agent_id = message.welcome().agent_id();

  const std::string job = Submit(2);
  ASSERT_TRUE(stream->Read(&message));
  ASSERT_TRUE(message.has_launch());
  EXPECT_EQ(message.launch().job_id(), job);
  EXPECT_EQ(message.launch().ranks_size(), 2);
  EXPECT_EQ(message.launch().coordinator(), server_->address());
  EXPECT_EQ(StateOf(job), v1::Job::RUNNING);

  std::vector<grpc::Status> statuses;
  std::vector<v1::JoinResponse> joined = JoinAll(job, agent_id, 2, &statuses);
  for (int slot = 0; slot < 2; ++slot) {
    ASSERT_TRUE(statuses[slot].ok()) << statuses[slot].error_message();
    EXPECT_EQ(joined[slot].rank(), slot);
    EXPECT_EQ(joined[slot].world_size(), 2);
    EXPECT_EQ(joined[slot].store_namespace(), job + "/gen-1");
  }

  v1::GetJobStatusRequest status_request;
  status_request.set_job_id(job);
  v1::JobStatus status;
  grpc::ClientContext status_context;
  ASSERT_TRUE(jobs_->GetJobStatus(&status_context, status_request, &status).ok());
  ASSERT_EQ(status.ranks_size(), 2);
  EXPECT_EQ(status.ranks(1).host(), "sim-node");
  EXPECT_EQ(status.ranks(1).pid(), 1001);
  EXPECT_EQ(status.ranks(1).state(), v1::RankStatus::TRAINING);

  for (int slot = 0; slot < 2; ++slot) {
    v1::AgentMessage exited;
    exited.mutable_rank_exited()->set_job_id(job);
    exited.mutable_rank_exited()->set_slot(slot);
    exited.mutable_rank_exited()->set_exit_code(0);
    ASSERT_TRUE(stream->Write(exited));
  }
  EXPECT_TRUE(WaitForState(job, v1::Job::SUCCEEDED));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(AgentServiceTest, LosingTheAgentFailsItsJob) {
  auto context = std::make_unique<grpc::ClientContext>();
  auto stream = agents_->Connect(context.get());
  v1::AgentMessage hello;
  hello.mutable_hello()->set_host("doomed-node");
  hello.mutable_hello()->set_slots(1);
  ASSERT_TRUE(stream->Write(hello));
  v1::CoordinatorMessage message;
  ASSERT_TRUE(stream->Read(&message));
  const std::string job = Submit(1);
  ASSERT_TRUE(stream->Read(&message));
  ASSERT_TRUE(message.has_launch());
  context->TryCancel();  // the node disappears
  stream->Finish();
  ASSERT_TRUE(WaitForState(job, v1::Job::FAILED));
  v1::Job failed;
  StateOf(job, &failed);
  EXPECT_THAT(failed.reason(), HasSubstr("lost contact with the agent on doomed-node"));
}

TEST_F(AgentServiceTest, FirstMessageMustBeAHello) {
  grpc::ClientContext context;
  auto stream = agents_->Connect(&context);
  v1::AgentMessage ping;
  ping.set_ping_time_us(1);
  ASSERT_TRUE(stream->Write(ping));
  v1::CoordinatorMessage message;
  EXPECT_FALSE(stream->Read(&message));
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("must be a hello"));
}

TEST_F(AgentServiceTest, JoinOfAnUnknownJobAndAStaleGeneration) {
  v1::JoinRequest request;
  request.set_job_id("job-000404");
  request.set_generation(1);
  v1::JoinResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(ranks_->Join(&context, request, &response).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(AgentServiceTest, WatchStreamsStatesMetricsAndEndsWithTheJobAndLogsAreKeptPerRank) {
  grpc::ClientContext agent_context;
  auto stream = agents_->Connect(&agent_context);
  const std::string agent_id = ConnectAgent(*stream, 2);
  const std::string job = Submit(2);
  v1::CoordinatorMessage launch;
  ASSERT_TRUE(stream->Read(&launch));
  ASSERT_TRUE(launch.has_launch());

  // A watcher from the start, reading until the server ends the stream.
  std::vector<v1::JobEvent> events;
  grpc::Status watch_status;
  std::thread watcher([&] {
    v1::WatchJobRequest request;
    request.set_job_id(job);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = jobs_->WatchJob(&context, request);
    v1::JobEvent event;
    while (reader->Read(&event)) events.push_back(event);
    watch_status = reader->Finish();
  });

  // Ranks are numbered at placement, so output from before the join already
  // carries the slot's rank.
  v1::AgentMessage early;
  early.mutable_logs()->set_job_id(job);
  early.mutable_logs()->set_slot(1);
  early.mutable_logs()->add_lines("slot 1 starting");
  ASSERT_TRUE(stream->Write(early));
  std::vector<grpc::Status> statuses;
  JoinAll(job, agent_id, 2, &statuses);
  for (const grpc::Status& s : statuses) ASSERT_TRUE(s.ok()) << s.error_message();
  for (int slot = 0; slot < 2; ++slot) {
    v1::AgentMessage logs;
    logs.mutable_logs()->set_job_id(job);
    logs.mutable_logs()->set_slot(slot);
    logs.mutable_logs()->add_lines(absl::StrCat("rank ", slot, " line 1"));
    logs.mutable_logs()->add_lines(absl::StrCat("rank ", slot, " line 2"));
    ASSERT_TRUE(stream->Write(logs));
  }

  v1::ReportRequest report;
  report.set_job_id(job);
  report.set_generation(1);
  report.set_rank(0);
  report.mutable_metrics()->set_step(10);
  report.mutable_metrics()->set_loss(0.25);
  v1::ReportResponse report_response;
  grpc::ClientContext report_context;
  ASSERT_TRUE(ranks_->Report(&report_context, report, &report_response).ok());

  for (int slot = 0; slot < 2; ++slot) {
    v1::AgentMessage exited;
    exited.mutable_rank_exited()->set_job_id(job);
    exited.mutable_rank_exited()->set_slot(slot);
    ASSERT_TRUE(stream->Write(exited));
  }
  ASSERT_TRUE(WaitForState(job, v1::Job::SUCCEEDED));
  watcher.join();

  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
  std::vector<std::string> kinds;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].seq(), static_cast<int64_t>(i + 1)) << "events arrive in order, none missing";
    EXPECT_EQ(events[i].job_id(), job);
    kinds.push_back(events[i].has_metrics() ? "metrics"
                                            : v1::Job::State_Name(events[i].state()));
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"PENDING", "RUNNING", "metrics", "SUCCEEDED"}));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2].metrics().step(), 10);
  EXPECT_EQ(events[3].reason(), "every rank exited with code 0");

  // Watching an ended job from the middle replays the rest and ends at once.
  {
    v1::WatchJobRequest request;
    request.set_job_id(job);
    request.set_after_seq(2);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = jobs_->WatchJob(&context, request);
    v1::JobEvent event;
    std::vector<int64_t> seqs;
    while (reader->Read(&event)) seqs.push_back(event.seq());
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(seqs, (std::vector<int64_t>{3, 4}));
  }
  {
    v1::WatchJobRequest request;
    request.set_job_id("job-999999");
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = jobs_->WatchJob(&context, request);
    v1::JobEvent event;
    EXPECT_FALSE(reader->Read(&event));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }

  v1::GetLogsRequest logs_request;
  logs_request.set_job_id(job);
  v1::GetLogsResponse logs;
  grpc::ClientContext logs_context;
  ASSERT_TRUE(jobs_->GetLogs(&logs_context, logs_request, &logs).ok());
  ASSERT_EQ(logs.lines_size(), 5);
  EXPECT_EQ(logs.lines(0).text(), "slot 1 starting");
  EXPECT_EQ(logs.lines(0).rank(), 1);
  EXPECT_EQ(logs.lines(0).slot(), 1);
  EXPECT_EQ(logs.lines(3).text(), "rank 1 line 1");
  EXPECT_EQ(logs.lines(3).rank(), 1);
  EXPECT_EQ(logs.lines(3).agent_id(), agent_id);
  EXPECT_TRUE(logs.complete()) << "the job ended and no rank is running";
  logs_request.set_rank(0);
  grpc::ClientContext rank_context;
  ASSERT_TRUE(jobs_->GetLogs(&rank_context, logs_request, &logs).ok());
  ASSERT_EQ(logs.lines_size(), 2);
  EXPECT_EQ(logs.lines(1).text(), "rank 0 line 2");
  logs_request.set_job_id("job-999999");
  grpc::ClientContext unknown_context;
  EXPECT_EQ(jobs_->GetLogs(&unknown_context, logs_request, &logs).error_code(), grpc::StatusCode::NOT_FOUND);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

v1::CheckpointChunk Chunk(const std::string& job, int64_t generation, int rank, const std::string& data) {
  v1::CheckpointChunk c;
  c.set_job_id(job);
  c.set_step(7);
  c.set_generation(generation);
  c.set_rank(rank);
  c.set_file_name("model.pt");
  c.set_data(data);
  c.set_chunk_crc32c(Crc32c(data));
  c.set_last(true);
  c.set_file_size(data.size());
  c.set_file_crc32c(Crc32c(data));
  return c;
}

TEST_F(AgentServiceTest, CheckpointUploadsOnlyFromRankZeroOfTheCurrentGenerationAndIntact) {
  const std::string job = JoinedTwoRankJob();
  auto checkpoints = v1::CheckpointService::NewStub(channel_);
  auto upload = [&](const v1::CheckpointChunk& chunk, v1::UploadCheckpointResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto writer = checkpoints->Upload(&context, response);
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  };
  v1::UploadCheckpointResponse response;
  grpc::Status stale = upload(Chunk(job, 2, 0, "weights"), &response);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(stale.error_message(), HasSubstr("generation 2"));
  grpc::Status other_rank = upload(Chunk(job, 1, 1, "weights"), &response);
  EXPECT_EQ(other_rank.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(other_rank.error_message(), HasSubstr("only rank 0 uploads"));
  v1::CheckpointChunk damaged = Chunk(job, 1, 0, "weights");
  damaged.set_data("weightz");
  EXPECT_EQ(upload(damaged, &response).error_code(), grpc::StatusCode::DATA_LOSS);

  grpc::Status good = upload(Chunk(job, 1, 0, "weights"), &response);
  ASSERT_TRUE(good.ok()) << good.error_message();
  EXPECT_EQ(response.manifest().step(), 7);
  EXPECT_EQ(response.manifest().world_size(), 2);
  EXPECT_EQ(response.manifest().generation(), 1);
  EXPECT_EQ(response.manifest().files(0).crc32c(), Crc32c("weights"));
  EXPECT_EQ(response.manifest().files(0).size(), 7);

  // Two files in several chunks each, as the rank sends them: only the
  // first chunk of the stream names the job; each file's last chunk
  // carries its size and CRC-32C.
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::UploadCheckpointResponse multi;
    auto writer = checkpoints->Upload(&context, &multi);
    const std::vector<std::pair<std::string, std::vector<std::string>>> files = {
        {"model.pt", {"wei", "ghts of", " step 8"}}, {"train_state.pt", {"moment", "um"}}};
    bool first = true;
    for (const auto& [name, pieces] : files) {
      std::string whole;
      for (size_t i = 0; i < pieces.size(); ++i) {
        v1::CheckpointChunk c;
        if (first) {
          c.set_job_id(job);
          c.set_step(8);
          c.set_generation(1);
          c.set_rank(0);
          first = false;
        }
        c.set_file_name(name);
        c.set_offset(whole.size());
        c.set_data(pieces[i]);
        c.set_chunk_crc32c(Crc32c(pieces[i]));
        whole += pieces[i];
        if (i + 1 == pieces.size()) {
          c.set_last(true);
          c.set_file_size(whole.size());
          c.set_file_crc32c(Crc32c(whole));
        }
        ASSERT_TRUE(writer->Write(c));
      }
    }
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(multi.manifest().files_size(), 2);
    EXPECT_EQ(multi.manifest().step(), 8);
    EXPECT_EQ(multi.manifest().files(0).size(), 17);
    EXPECT_EQ(multi.manifest().files(0).crc32c(), Crc32c("weights of step 8"));
    EXPECT_EQ(multi.manifest().files(1).name(), "train_state.pt");
    EXPECT_EQ(multi.manifest().files(1).crc32c(), Crc32c("momentum"));
  }

  v1::ListCheckpointsRequest list;
  list.set_job_id(job);
  v1::ListCheckpointsResponse listed;
  grpc::ClientContext list_context;
  ASSERT_TRUE(jobs_->ListCheckpoints(&list_context, list, &listed).ok());
  ASSERT_EQ(listed.checkpoints_size(), 2) << "refused uploads left nothing";
  EXPECT_EQ(listed.checkpoints(0).step(), 7);
  EXPECT_EQ(listed.checkpoints(1).step(), 8);
}

// A raw connection to the checkpoint data port (what a misbehaving or
// foreign client would send).
int ConnectTo(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Staging directories left under the job's checkpoint directory.
int StagingDirs(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    n += absl::StartsWith(e.path().filename().string(), ".staging-") ? 1 : 0;
  }
  return n;
}

TEST_F(AgentServiceTest, CheckpointUploadsOverTheDataPortAreCheckedCommittedAndSingleUse) {
  const std::string job = JoinedTwoRankJob();
  ASSERT_GT(server_->checkpoint_data_port(), 0);
  auto checkpoints = v1::CheckpointService::NewStub(channel_);
  auto open = [&](int64_t step, int64_t generation, int rank, v1::OpenUploadResponse* opened) {
    v1::OpenUploadRequest request;
    request.set_job_id(job);
    request.set_step(step);
    request.set_generation(generation);
    request.set_rank(rank);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return checkpoints->OpenUpload(&context, request, opened);
  };
  v1::OpenUploadResponse opened;
  grpc::Status stale = open(7, 2, 0, &opened);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(stale.error_message(), HasSubstr("generation 2"));
  grpc::Status other_rank = open(7, 1, 1, &opened);
  EXPECT_EQ(other_rank.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(other_rank.error_message(), HasSubstr("only rank 0 uploads"));

  // Two files, one larger than a chunk, written in pieces as the serializer
  // hands them over.
  grpc::Status good = open(7, 1, 0, &opened);
  ASSERT_TRUE(good.ok()) << good.error_message();
  EXPECT_EQ(opened.port(), server_->checkpoint_data_port());
  EXPECT_EQ(opened.token().size(), kTokenBytes);
  std::string model(CheckpointDataUpload::kSendBytes + 12345, '\0');
  for (size_t i = 0; i < model.size(); ++i) model[i] = static_cast<char>(i % 251);
  const std::string state = "momentum of step 7";
  {
    auto upload = CheckpointDataUpload::Connect("127.0.0.1", opened.port(), opened.token(), absl::Seconds(5),
                                                absl::Seconds(10));
    ASSERT_TRUE(upload.ok()) << upload.status();
    ASSERT_TRUE((*upload)->BeginFile("model.pt").ok());
    ASSERT_TRUE((*upload)->Write(absl::string_view(model).substr(0, 100)).ok());
    ASSERT_TRUE((*upload)->Write(absl::string_view(model).substr(100)).ok());
    ASSERT_TRUE((*upload)->EndFile().ok());
    ASSERT_TRUE((*upload)->BeginFile("train_state.pt").ok());
    ASSERT_TRUE((*upload)->Write(state).ok());
    ASSERT_TRUE((*upload)->EndFile().ok());
    absl::Status finished = (*upload)->Finish();
    ASSERT_TRUE(finished.ok()) << finished;
  }
  absl::StatusOr<std::string> model_back = DownloadCheckpointFile(*checkpoints, job, 7, "model.pt", absl::Seconds(10));
  ASSERT_TRUE(model_back.ok()) << model_back.status();
  EXPECT_TRUE(*model_back == model) << "the stored model.pt differs from what was sent";
  absl::StatusOr<std::string> state_back =
      DownloadCheckpointFile(*checkpoints, job, 7, "train_state.pt", absl::Seconds(10));
  ASSERT_TRUE(state_back.ok()) << state_back.status();
  EXPECT_EQ(*state_back, state);

  // A token works once.
  auto again = CheckpointDataUpload::Connect("127.0.0.1", opened.port(), opened.token(), absl::Seconds(5),
                                              absl::Seconds(10));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kPermissionDenied) << again.status();
  EXPECT_THAT(again.status().message(), HasSubstr("unknown or expired upload token"));

  // A chunk whose CRC does not match is refused; nothing of it stays.
  const std::string job_dir = server_dir_ + "/checkpoints/" + job;
  ASSERT_TRUE(open(8, 1, 0, &opened).ok());
  {
    const int fd = ConnectTo(opened.port());
    ASSERT_GE(fd, 0);
    ChunkHeader h;
    h.data_len = 7;
    h.chunk_crc32c = Crc32c("weights") ^ 1;
    h.name_len = 8;
    char header[kChunkHeaderBytes];
    EncodeChunkHeader(h, header);
    ASSERT_TRUE(SendAll(fd, {absl::string_view(kHelloMagic, kHelloMagicBytes), opened.token(),
                             absl::string_view(header, sizeof(header)), "model.pt", "weights"},
                        "a damaged chunk")
                    .ok());
    absl::Status answer;
    ASSERT_TRUE(ReceiveReply(fd, &answer).ok());
    EXPECT_TRUE(answer.ok()) << "the upload is accepted after the hello: " << answer;
    ASSERT_TRUE(ReceiveReply(fd, &answer).ok());
    EXPECT_EQ(answer.code(), absl::StatusCode::kDataLoss) << answer;
    EXPECT_THAT(answer.message(), HasSubstr("does not match its CRC-32C"));
    ::close(fd);
  }
  EXPECT_EQ(StagingDirs(job_dir), 0);

  // A rank that goes away mid-file: the upload is dropped, its files deleted.
  ASSERT_TRUE(open(9, 1, 0, &opened).ok());
  {
    auto upload = CheckpointDataUpload::Connect("127.0.0.1", opened.port(), opened.token(), absl::Seconds(5),
                                                absl::Seconds(10));
    ASSERT_TRUE(upload.ok()) << upload.status();
    ASSERT_TRUE((*upload)->BeginFile("model.pt").ok());
    ASSERT_TRUE((*upload)->Write(model).ok());
  }  // closed without EndFile/Finish
  bool cleaned = false;
  for (int i = 0; i < 100 && !cleaned; ++i) {
    cleaned = StagingDirs(job_dir) == 0;
    if (!cleaned) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(cleaned) << "the dropped upload's staging directory is still there";

  // Anything else is told what the port is for.
  {
    const int fd = ConnectTo(server_->checkpoint_data_port());
    ASSERT_GE(fd, 0);
    const std::string request = "GET / HTTP/1.1\r\nHost: coordinator\r\n\r\n";
    ASSERT_TRUE(SendAll(fd, {request}, "an HTTP request").ok());
    absl::Status answer;
    ASSERT_TRUE(ReceiveReply(fd, &answer).ok());
    EXPECT_EQ(answer.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(answer.message(), HasSubstr("checkpoint data port"));
    ::close(fd);
  }

  // As many uploads as may run are accepted; one more is told to use gRPC
  // before it sends anything, and its token still works once one ends.
  {
    std::vector<std::unique_ptr<CheckpointDataUpload>> running;
    for (int i = 0; i < CheckpointDataServer::kDefaultMaxUploads; ++i) {
      ASSERT_TRUE(open(100 + i, 1, 0, &opened).ok());
      auto upload = CheckpointDataUpload::Connect("127.0.0.1", opened.port(), opened.token(), absl::Seconds(5),
                                                  absl::Seconds(10));
      ASSERT_TRUE(upload.ok()) << i << ": " << upload.status();
      running.push_back(*std::move(upload));
    }
    ASSERT_TRUE(open(200, 1, 0, &opened).ok());
    auto one_more = CheckpointDataUpload::Connect("127.0.0.1", opened.port(), opened.token(), absl::Seconds(5),
                                                  absl::Seconds(10));
    EXPECT_EQ(one_more.status().code(), absl::StatusCode::kResourceExhausted) << one_more.status();
    EXPECT_THAT(one_more.status().message(), HasSubstr("upload over gRPC"));
    running.clear();  // these end without sending a file: dropped
    absl::StatusOr<std::unique_ptr<CheckpointDataUpload>> later;
    for (int i = 0; i < 100; ++i) {  // until the coordinator has seen them close
      later = CheckpointDataUpload::Connect("127.0.0.1", opened.port(), opened.token(), absl::Seconds(5),
                                            absl::Seconds(10));
      if (!absl::IsResourceExhausted(later.status())) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_TRUE(later.ok()) << later.status();
  }
  bool all_dropped = false;
  for (int i = 0; i < 100 && !all_dropped; ++i) {
    all_dropped = StagingDirs(job_dir) == 0;
    if (!all_dropped) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(all_dropped) << "uploads that ended without their files left staging directories";

  v1::ListCheckpointsRequest list;
  list.set_job_id(job);
  v1::ListCheckpointsResponse listed;
  grpc::ClientContext list_context;
  ASSERT_TRUE(jobs_->ListCheckpoints(&list_context, list, &listed).ok());
  ASSERT_EQ(listed.checkpoints_size(), 1) << "refused uploads left nothing";
  EXPECT_EQ(listed.checkpoints(0).step(), 7);
  EXPECT_EQ(listed.checkpoints(0).files_size(), 2);
  EXPECT_EQ(listed.checkpoints(0).files(0).crc32c(), Crc32c(model));
}

TEST(CheckpointDataPortTest, OffOrUnderTlsOpenUploadSaysToUseTheStream) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.state_dir = std::string(std::getenv("TEST_TMPDIR")) + "/no_data_port";
  options.checkpoint_data_port = -1;
  auto server = CoordinatorServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->checkpoint_data_port(), 0);
  auto checkpoints = v1::CheckpointService::NewStub(MakeCoordinatorChannel((*server)->address()));
  v1::OpenUploadRequest request;
  request.set_job_id("job-000001");
  request.set_step(1);
  request.set_generation(1);
  v1::OpenUploadResponse opened;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Status s = checkpoints->OpenUpload(&context, request, &opened);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_THAT(s.error_message(), HasSubstr("CheckpointService.Upload"));

  options.checkpoint_data_port = 70000;
  options.state_dir += "_bad";
  auto bad = CoordinatorServer::Start(options);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("--checkpoint_data_port 70000"));
}

}  // namespace
}  // namespace chorus
