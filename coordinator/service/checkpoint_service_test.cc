// CheckpointService end to end over gRPC and the checkpoint data port: a
// simulated agent runs a two-rank job whose rank 0 uploads checkpoints
// (Upload stream, OpenUpload + data port), and files are downloaded back.
#include "coordinator/service/checkpoint_service.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "checkpoint/download.h"
#include "checkpoint/wire.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/auth.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "coordinator/checkpoint/checkpoint_data_server.h"
#include "coordinator/checkpoint/checkpoint_grant.h"
#include "coordinator/checkpoint/checkpoint_store.h"
#include "coordinator/checkpoint/checkpoint_uploads.h"
#include "coordinator/service/coordinator_test_fixture.h"
#include "coordinator/service/server.h"
#include "coordinator/state/state_store.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

class CheckpointServiceTest : public CoordinatorFixture {};

v1::CheckpointChunk Chunk(const std::string& job, int64_t generation, int rank,
                          const std::string& data) {
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

TEST_F(CheckpointServiceTest, CheckpointUploadsOnlyFromRankZeroOfTheCurrentGenerationAndIntact) {
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

TEST_F(CheckpointServiceTest, CheckpointUploadsOverTheDataPortAreCheckedCommittedAndSingleUse) {
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
    auto upload = CheckpointDataUpload::Connect("127.0.0.1", opened.port(), opened.token(),
                                                absl::Seconds(5), absl::Seconds(10));
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
  absl::StatusOr<std::string> model_back =
      DownloadCheckpointFile(*checkpoints, job, 7, "model.pt", absl::Seconds(10));
  ASSERT_TRUE(model_back.ok()) << model_back.status();
  EXPECT_TRUE(*model_back == model) << "the stored model.pt differs from what was sent";
  absl::StatusOr<std::string> state_back =
      DownloadCheckpointFile(*checkpoints, job, 7, "train_state.pt", absl::Seconds(10));
  ASSERT_TRUE(state_back.ok()) << state_back.status();
  EXPECT_EQ(*state_back, state);

  // A token works once.
  auto again = CheckpointDataUpload::Connect("127.0.0.1", opened.port(), opened.token(),
                                             absl::Seconds(5), absl::Seconds(10));
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
    ASSERT_TRUE(SendAll(fd,
                        {absl::string_view(kHelloMagic, kHelloMagicBytes), opened.token(),
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
    auto upload = CheckpointDataUpload::Connect("127.0.0.1", opened.port(), opened.token(),
                                                absl::Seconds(5), absl::Seconds(10));
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
      auto upload = CheckpointDataUpload::Connect("127.0.0.1", opened.port(), opened.token(),
                                                  absl::Seconds(5), absl::Seconds(10));
      ASSERT_TRUE(upload.ok()) << i << ": " << upload.status();
      running.push_back(*std::move(upload));
    }
    ASSERT_TRUE(open(200, 1, 0, &opened).ok());
    auto one_more = CheckpointDataUpload::Connect("127.0.0.1", opened.port(), opened.token(),
                                                  absl::Seconds(5), absl::Seconds(10));
    EXPECT_EQ(one_more.status().code(), absl::StatusCode::kResourceExhausted) << one_more.status();
    EXPECT_THAT(one_more.status().message(), HasSubstr("upload over gRPC"));
    running.clear();  // these end without sending a file: dropped
    absl::StatusOr<std::unique_ptr<CheckpointDataUpload>> later;
    for (int i = 0; i < 100; ++i) {  // until the coordinator has seen them close
      later = CheckpointDataUpload::Connect("127.0.0.1", opened.port(), opened.token(),
                                            absl::Seconds(5), absl::Seconds(10));
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

// The adapter alone, in process (no network): CheckpointUploads with a
// fixed grant behind it, statuses mapped to gRPC codes with their messages.
class CheckpointServiceAdapterTest : public ::testing::Test {
 protected:
  void SetUp() override { Serve(AllowAll()); }
  void TearDown() override { Stop(); }

  void Serve(const TokenAuthorizer& auth,
             CheckpointServiceImpl::ResumeFromOf resume_from_of = nullptr,
             CheckpointServiceImpl::OwnerOf owner_of = nullptr) {
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/checkpoint_adapter_" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir);
    state_ = *StateStore::Open(dir);
    store_ = std::make_unique<CheckpointStore>(dir + "/checkpoints", *state_);
    v1::Job job;
    job.set_job_id("job-000001");
    grant_ = UploadGrantFor(job, /*world_size=*/1, /*generation=*/1);
    uploads_ = std::make_unique<CheckpointUploads>(
        *store_,
        [this](const std::string& job_id, int64_t generation,
               int rank) -> absl::StatusOr<UploadGrant> {
          if (job_id != "job-000001")
            return absl::FailedPreconditionError(job_id + " is not running");
          return CheckUploader(grant_, generation, rank);
        });
    service_ = std::make_unique<CheckpointServiceImpl>(
        *store_, *uploads_, auth, std::move(resume_from_of), std::move(owner_of));
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    stub_ = v1::CheckpointService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  void Stop() {
    if (server_ != nullptr) server_->Shutdown();
    stub_.reset();
    server_.reset();
    service_.reset();
    uploads_.reset();
    store_.reset();
    state_.reset();
  }

  static std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return context;
  }

  grpc::Status Upload(const std::vector<v1::CheckpointChunk>& chunks,
                      v1::UploadCheckpointResponse* response, grpc::ClientContext* context) {
    auto writer = stub_->Upload(context, response);
    for (const v1::CheckpointChunk& chunk : chunks) writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }

  // A context that presents `token` (empty: none).
  static std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
    std::unique_ptr<grpc::ClientContext> context = Context();
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
    return context;
  }

  // Downloads model.pt of job's `step`; the status, and the bytes on success.
  grpc::Status Download(const std::string& token, const std::string& job, int64_t step,
                        std::string* bytes) {
    v1::DownloadCheckpointRequest request;
    request.set_job_id(job);
    request.set_step(step);
    request.set_file_name("model.pt");
    std::unique_ptr<grpc::ClientContext> context = As(token);
    auto reader = stub_->Download(context.get(), request);
    v1::CheckpointChunk chunk;
    bytes->clear();
    for (int i = 0; i < 100 && reader->Read(&chunk); ++i) *bytes += chunk.data();
    return reader->Finish();
  }

  TokenAuthorizer auth_;
  UploadGrant grant_;
  std::unique_ptr<StateStore> state_;
  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<CheckpointUploads> uploads_;
  std::unique_ptr<CheckpointServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::CheckpointService::Stub> stub_;
};

TEST_F(CheckpointServiceAdapterTest, UploadMapsTheManifestAndTheErrors) {
  v1::UploadCheckpointResponse response;
  grpc::Status empty = Upload({}, &response, Context().get());
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(empty.error_message(), "checkpoint upload with no chunks");
  grpc::Status other_job = Upload({Chunk("job-000002", 1, 0, "w")}, &response, Context().get());
  EXPECT_EQ(other_job.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(other_job.error_message(), "job-000002 is not running");
  grpc::Status good = Upload({Chunk("job-000001", 1, 0, "weights")}, &response, Context().get());
  ASSERT_TRUE(good.ok()) << good.error_message();
  EXPECT_EQ(response.manifest().job_id(), "job-000001");
  EXPECT_EQ(response.manifest().step(), 7);
  EXPECT_EQ(response.manifest().files(0).name(), "model.pt");
  grpc::Status again = Upload({Chunk("job-000001", 1, 0, "weights")}, &response, Context().get());
  EXPECT_EQ(again.error_code(), grpc::StatusCode::ALREADY_EXISTS);

  v1::DownloadCheckpointRequest download;
  download.set_job_id("job-000001");
  download.set_step(7);
  download.set_file_name("optimizer.pt");
  std::unique_ptr<grpc::ClientContext> context = Context();  // outlives its reader
  auto reader = stub_->Download(context.get(), download);
  v1::CheckpointChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  grpc::Status no_file = reader->Finish();
  EXPECT_EQ(no_file.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(no_file.error_message(), "checkpoint job-000001 step 7 has no file \"optimizer.pt\"");
  download.set_step(9);
  download.set_file_name("model.pt");
  reader.reset();
  context = Context();
  reader = stub_->Download(context.get(), download);
  EXPECT_FALSE(reader->Read(&chunk));
  grpc::Status no_step = reader->Finish();
  EXPECT_EQ(no_step.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(no_step.error_message(), HasSubstr("job job-000001 has no checkpoint at step 9"));
}

TEST_F(CheckpointServiceAdapterTest, OpenUploadAndCommitRefusalsKeepTheirCodes) {
  v1::OpenUploadRequest open;
  open.set_job_id("job-000001");
  open.set_generation(1);
  open.set_step(3);
  v1::OpenUploadResponse opened;
  grpc::Status no_port = stub_->OpenUpload(Context().get(), open, &opened);
  EXPECT_EQ(no_port.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  uploads_->set_data_port(5000);
  open.set_generation(2);
  grpc::Status stale = stub_->OpenUpload(Context().get(), open, &opened);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(stale.error_message(), HasSubstr("whose current generation is 1"));
  open.set_generation(1);
  ASSERT_TRUE(stub_->OpenUpload(Context().get(), open, &opened).ok());
  EXPECT_EQ(opened.port(), 5000);
  EXPECT_EQ(opened.token().size(), kTokenBytes);

  v1::CommitCheckpointRequest commit;
  commit.set_job_id("job-000001");
  commit.set_generation(1);
  commit.set_step(4);
  v1::UploadCheckpointResponse committed;
  grpc::Status not_shared = stub_->Commit(Context().get(), commit, &committed);
  EXPECT_EQ(not_shared.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(not_shared.error_message(), HasSubstr("Commit is for storage SHARED_DIR"));
}

TEST_F(CheckpointServiceAdapterTest, CallsNeedAWorkerToken) {
  Stop();
  absl::StatusOr<TokenAuthorizer> auth = TokenAuthorizer::FromText(
      "admin admin-token-0123456789\nworker worker-token-0123456789\n", "test");
  ASSERT_TRUE(auth.ok()) << auth.status();
  auth_ = *std::move(auth);
  Serve(auth_);
  v1::UploadCheckpointResponse response;
  grpc::Status anonymous = Upload({Chunk("job-000001", 1, 0, "w")}, &response, Context().get());
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  v1::OpenUploadRequest open;
  v1::OpenUploadResponse opened;
  EXPECT_EQ(stub_->OpenUpload(Context().get(), open, &opened).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  auto worker = Context();
  worker->AddMetadata("authorization", "Bearer worker-token-0123456789");
  grpc::Status allowed = Upload({Chunk("job-000001", 1, 0, "weights")}, &response, worker.get());
  EXPECT_TRUE(allowed.ok()) << allowed.error_message();
}

// Note [Job credentials], Note [Reading the checkpoint a job resumes from].
TEST_F(CheckpointServiceAdapterTest, AJobsCredentialReachesItsOwnCheckpointsAndItsResumeSource) {
  Stop();
  absl::StatusOr<TokenAuthorizer> auth = TokenAuthorizer::FromText(
      "admin admin-token-0123456789\nworker worker-token-0123456789\n", "test");
  ASSERT_TRUE(auth.ok()) << auth.status();
  auth_ = *std::move(auth);
  const JobCredentials credentials("0123456789abcdef0123456789abcdef");
  auth_.AcceptJobCredentials(credentials);
  // job-000002 resumes from step 7 of job-000001, job-000004 from its
  // step 5, job-000005 from its newest; job-000003 from nothing.
  Serve(auth_, [](const std::string& job_id) -> std::string {
    if (job_id == "job-000002") return "job-000001:7";
    if (job_id == "job-000004") return "job-000001:5";
    if (job_id == "job-000005") return "job-000001";
    return "";
  });
  const std::string own = credentials.For("job-000001");

  // Uploads, data-port grants and commits: only for the credential's job.
  v1::UploadCheckpointResponse response;
  grpc::Status foreign = Upload({Chunk("job-000001", 1, 0, "forged")}, &response,
                                As(credentials.For("job-000003")).get());
  EXPECT_EQ(foreign.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(foreign.error_message(),
            "the credential of job job-000003 may not upload checkpoints for job job-000001: a "
            "job's ranks may reach only their own job");
  grpc::Status mine = Upload({Chunk("job-000001", 1, 0, "weights")}, &response, As(own).get());
  ASSERT_TRUE(mine.ok()) << mine.error_message();
  uploads_->set_data_port(5000);
  v1::OpenUploadRequest open;
  open.set_job_id("job-000001");
  open.set_generation(1);
  open.set_step(8);
  v1::OpenUploadResponse opened;
  grpc::Status open_foreign =
      stub_->OpenUpload(As(credentials.For("job-000002")).get(), open, &opened);
  EXPECT_EQ(open_foreign.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(open_foreign.error_message(), HasSubstr("job job-000002 may not upload"));
  EXPECT_TRUE(stub_->OpenUpload(As(own).get(), open, &opened).ok());
  v1::CommitCheckpointRequest commit;
  commit.set_job_id("job-000001");
  v1::UploadCheckpointResponse committed;
  grpc::Status commit_foreign =
      stub_->Commit(As(credentials.For("job-000003")).get(), commit, &committed);
  EXPECT_EQ(commit_foreign.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(commit_foreign.error_message(), HasSubstr("may not commit checkpoints"));

  // Downloads: its own job's, and the checkpoint it resumes from.
  std::string bytes;
  grpc::Status s = Download(own, "job-000001", 7, &bytes);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(bytes, "weights");
  s = Download(credentials.For("job-000002"), "job-000001", 7, &bytes);
  EXPECT_TRUE(s.ok()) << "the resume source at its step: " << s.error_message();
  EXPECT_EQ(bytes, "weights");
  s = Download(credentials.For("job-000005"), "job-000001", 7, &bytes);
  EXPECT_TRUE(s.ok()) << "the resume source, any step: " << s.error_message();
  s = Download(credentials.For("job-000004"), "job-000001", 7, &bytes);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << "not the step it resumes from";
  s = Download(credentials.For("job-000002"), "job-000001", 0, &bytes);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << "\"newest\" is not step 7";
  s = Download(credentials.For("job-000003"), "job-000001", 7, &bytes);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "the credential of job job-000003 may not download checkpoints for job job-000001: a "
            "job's ranks may reach only their own job");
  EXPECT_TRUE(bytes.empty());
  s = Download("admin-token-0123456789", "job-000001", 7, &bytes);
  EXPECT_TRUE(s.ok()) << "the admin token reads every job's: " << s.error_message();
}

TEST_F(CheckpointServiceAdapterTest, AUserDownloadsTheCheckpointsOfTheirOwnJobsOnly) {
  Stop();
  absl::StatusOr<TokenAuthorizer> auth = TokenAuthorizer::FromText(
      "admin admin-token-0123456789 root\nuser alice-token-0123456789 alice\n"
      "user bob-token-0123456789 bob\nagent agent-token-0123456789\n",
      "test");
  ASSERT_TRUE(auth.ok()) << auth.status();
  auth_ = *std::move(auth);
  Serve(auth_, nullptr, [](const std::string& job_id) -> absl::StatusOr<std::string> {
    if (job_id == "job-000001") return std::string("alice");
    return absl::NotFoundError("no job " + job_id);
  });
  v1::UploadCheckpointResponse response;
  ASSERT_TRUE(
      Upload({Chunk("job-000001", 1, 0, "weights")}, &response, As("agent-token-0123456789").get())
          .ok());

  std::string bytes;
  grpc::Status s = Download("alice-token-0123456789", "job-000001", 7, &bytes);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(bytes, "weights");
  s = Download("bob-token-0123456789", "job-000001", 7, &bytes);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "job-000001 belongs to alice; only alice or an admin may download the checkpoints "
            "of it");
  EXPECT_TRUE(bytes.empty());
  s = Download("agent-token-0123456789", "job-000001", 7, &bytes);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << "agents read no job's";
  s = Download("bob-token-0123456789", "job-000009", 7, &bytes);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  s = Download("admin-token-0123456789", "job-000001", 7, &bytes);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace chorus
