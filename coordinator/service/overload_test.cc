// Overload and hostile peers, end to end against a real coordinator on
// 127.0.0.1: thousands of idle connections on the gRPC port and the
// checkpoint data port, data-port peers that stay silent, promise 4 GB or
// stop mid-chunk, unsafe checkpoint file names, a job filling the store and
// a queue filling up. Each case checks the exact refusal and that the
// coordinator still serves afterwards (docs/reliability.md lists them).
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/coordinator_storage.h"
#include "checkpoint/wire.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "coordinator/checkpoint/checkpoint_data_server.h"
#include "coordinator/service/coordinator_test_fixture.h"
#include "coordinator/service/server.h"
#include "coordinator/state/job_manager.h"
#include "coordinator/state/key_value_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

// A TCP connection to 127.0.0.1:port, or -1. Each receive waits at most
// `receive_timeout`.
int ConnectTo(int port, absl::Duration receive_timeout = absl::Seconds(10)) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  SetSendTimeout(fd, absl::Seconds(5));  // also bounds connect()
  SetReceiveTimeout(fd, receive_timeout);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// `n` connections to `port` that never send a byte.
std::vector<int> IdleConnections(int port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = ConnectTo(port);
    if (fd < 0) break;
    fds.push_back(fd);
  }
  return fds;
}

void CloseAll(std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
  fds.clear();
}

// Whether the other end has closed `fd` (or answered and closed): a
// non-blocking read sees end of stream, data or an error, not "nothing yet".
bool ClosedByPeer(int fd) {
  char byte;
  const ssize_t r = ::recv(fd, &byte, 1, MSG_DONTWAIT);
  return !(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

// This process's open descriptors (the coordinator's and the test's).
int OpenDescriptors() {
  int n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

// Staging directories left under a job's checkpoint directory.
int StagingDirs(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    n += absl::StartsWith(e.path().filename().string(), ".staging-") ? 1 : 0;
  }
  return n;
}

// Polls (bounded) until `dir` holds no staging directory.
bool StagingGone(const std::string& dir) {
  for (int i = 0; i < 250; ++i) {
    if (StagingDirs(dir) == 0) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 131 + seed);
  return s;
}

TEST(ServerOptionsTest, TheLimitsDefaultToTheComponentsDefaults) {
  const ServerOptions options;
  EXPECT_EQ(options.max_pending_jobs, JobManager::kDefaultMaxPendingJobs);
  const KeyValueStore::Limits store;
  EXPECT_EQ(options.store_max_keys_per_job, static_cast<int64_t>(store.max_keys_per_job));
  EXPECT_EQ(options.store_max_bytes_per_job, static_cast<int64_t>(store.max_bytes_per_job));
  EXPECT_EQ(options.store_max_value_bytes, static_cast<int64_t>(store.max_value_bytes));
  const CheckpointDataServer::Options data;
  EXPECT_EQ(options.checkpoint_max_upload_bytes, data.max_upload_bytes);
  EXPECT_EQ(options.checkpoint_data_hello_timeout, data.hello_timeout);
  EXPECT_EQ(options.checkpoint_data_io_timeout, data.io_timeout);
  EXPECT_EQ(options.grpc_handshake_timeout, kHandshakeTimeout);
}

class OverloadTest : public CoordinatorFixture {
 protected:
  // Opens an upload of `step` for rank 0 of generation 1.
  v1::OpenUploadResponse Open(const std::string& job, int64_t step) {
    v1::OpenUploadRequest request;
    request.set_job_id(job);
    request.set_step(step);
    request.set_generation(1);
    request.set_rank(0);
    v1::OpenUploadResponse opened;
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    grpc::Status s =
        v1::CheckpointService::NewStub(channel_)->OpenUpload(&context, request, &opened);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return opened;
  }

  // A data-port connection whose upload of `step` the coordinator accepted
  // (it answered OK to the hello); -1 on failure.
  int Accepted(const std::string& job, int64_t step) {
    const v1::OpenUploadResponse opened = Open(job, step);
    const int fd = ConnectTo(server_->checkpoint_data_port());
    if (fd < 0) return -1;
    absl::Status answer;
    if (!SendAll(fd, {absl::string_view(kHelloMagic, kHelloMagicBytes), opened.token()}, "hello")
             .ok() ||
        !ReceiveReply(fd, &answer).ok() || !answer.ok()) {
      ADD_FAILURE() << "upload of step " << step << " not accepted: " << answer;
      ::close(fd);
      return -1;
    }
    return fd;
  }

  // Sends one chunk header (and `name`, and `data`) on `fd`.
  static absl::Status SendChunk(int fd, const ChunkHeader& h, absl::string_view name,
                                absl::string_view data) {
    char header[kChunkHeaderBytes];
    EncodeChunkHeader(h, header);
    return SendAll(fd, {absl::string_view(header, sizeof(header)), name, data}, "a chunk");
  }

  // Sends `name` as one whole file of `data` and asks for the commit;
  // returns the coordinator's answer.
  static absl::Status SendFile(int fd, const std::string& name, const std::string& data) {
    ChunkHeader h;
    h.data_len = static_cast<uint32_t>(data.size());
    h.chunk_crc32c = Crc32c(data);
    h.name_len = static_cast<uint16_t>(name.size());
    h.flags = ChunkHeader::kLast;
    h.file_size = data.size();
    h.file_crc32c = Crc32c(data);
    ChunkHeader end;
    end.flags = ChunkHeader::kEndOfUpload;
    char end_header[kChunkHeaderBytes];
    EncodeChunkHeader(end, end_header);
    (void)SendChunk(fd, h, name, data);
    (void)SendAll(fd, {absl::string_view(end_header, sizeof(end_header))}, "the end");
    absl::Status answer;
    if (absl::Status s = ReceiveReply(fd, &answer); !s.ok()) return s;
    return answer;
  }

  void ExpectServing() {
    absl::StatusOr<HealthCheckResponse::ServingStatus> health = CheckHealth(
        MakeCoordinatorChannel(server_->address()), server_->address(), absl::Seconds(5));
    ASSERT_TRUE(health.ok()) << health.status();
    EXPECT_EQ(*health, HealthCheckResponse::SERVING);
  }

  std::vector<int64_t> CommittedSteps(const std::string& job) {
    v1::ListCheckpointsRequest list;
    list.set_job_id(job);
    v1::ListCheckpointsResponse listed;
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    grpc::Status s = jobs_->ListCheckpoints(&context, list, &listed);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<int64_t> steps;
    for (const v1::CheckpointManifest& m : listed.checkpoints()) steps.push_back(m.step());
    return steps;
  }
};

TEST_F(OverloadTest, ThousandsOfIdleConnectionsLeavePingAndUploadsWorking) {
  // The coordinator raises its own limit the same way at start-up (main.cc).
  absl::StatusOr<uint64_t> files = RaiseOpenFileLimit();
  ASSERT_TRUE(files.ok()) << files.status();
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  EXPECT_EQ(limit.rlim_cur, limit.rlim_max);
  EXPECT_EQ(*files, limit.rlim_cur);
  // Both ends of every connection live in this process.
  const int idle = static_cast<int>(std::min<uint64_t>(2000, (*files - 1000) / 4));
  ASSERT_GE(idle, 1000) << "the hard open-file limit (" << *files << ") is too low for this test";

  const std::string job = JoinedTwoRankJob();
  const int baseline = OpenDescriptors();
  std::vector<int> grpc_idle = IdleConnections(server_->port(), idle);
  std::vector<int> data_idle = IdleConnections(server_->checkpoint_data_port(), idle);
  ASSERT_EQ(grpc_idle.size(), static_cast<size_t>(idle));
  ASSERT_EQ(data_idle.size(), static_cast<size_t>(idle));

  // `chorus ping`, a new client and a real upload all succeed meanwhile.
  // Their deadlines leave room for a loaded machine under AddressSanitizer
  // (a 10 s answer deadline ran out at load 10 while the data port dropped
  // the flood's connections): what they check is that the flood does not
  // block them, which without the port's connection limit it does until
  // the idle connections' hello timeout, for every one of them.
  const absl::Time start = absl::Now();
  ExpectServing();
  {
    v1::GetJobRequest request;
    request.set_job_id(job);
    v1::Job got;
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(5)));
    grpc::Status s = v1::JobService::NewStub(MakeCoordinatorChannel(server_->address()))
                         ->GetJob(&context, request, &got);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(got.state(), v1::Job::RUNNING);
  }
  // Over the data port itself, not the gRPC fallback: the idle connections
  // there make room for it.
  {
    const v1::OpenUploadResponse opened = Open(job, 7);
    auto upload = CheckpointDataUpload::Connect("127.0.0.1", opened.port(), opened.token(),
                                                absl::Seconds(15), absl::Seconds(30));
    ASSERT_TRUE(upload.ok()) << upload.status();
    ASSERT_TRUE((*upload)->BeginFile("model.pt").ok());
    ASSERT_TRUE((*upload)->Write(Pattern(5 << 20, 1)).ok());
    ASSERT_TRUE((*upload)->EndFile().ok());
    absl::Status finished = (*upload)->Finish();
    ASSERT_TRUE(finished.ok()) << finished;
  }
  // As a rank stores one.
  {
    CoordinatorCheckpointStorage storage(MakeCoordinatorChannel(server_->address()), job,
                                         /*generation=*/1, /*rank=*/0, "127.0.0.1",
                                         absl::Seconds(40));
    const std::string model = Pattern(9 << 20, 2);
    absl::Status stored =
        storage.Store(8, {{"model.pt", [&](const CheckpointByteSink& out) { return out(model); }}});
    ASSERT_TRUE(stored.ok()) << stored;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
  EXPECT_EQ(CommittedSteps(job), (std::vector<int64_t>{7, 8}));

  // The data port kept at most its connection limit of them open.
  int data_closed = 0;
  for (int fd : data_idle) data_closed += ClosedByPeer(fd) ? 1 : 0;
  EXPECT_GE(data_closed, idle - CheckpointDataServer::kMaxConnections);

  // Once they go, so do the coordinator's descriptors for them.
  CloseAll(grpc_idle);
  CloseAll(data_idle);
  int open = OpenDescriptors();
  for (int i = 0; i < 300 && open > baseline + 16; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    open = OpenDescriptors();
  }
  EXPECT_LE(open, baseline + 16) << "descriptors before the idle connections: " << baseline;
  ExpectServing();
}

class SilentGrpcPeerTest : public OverloadTest {
 protected:
  void Configure(ServerOptions& options) override {
    options.grpc_handshake_timeout = absl::Seconds(2);
  }
};

TEST_F(SilentGrpcPeerTest, PeersThatNeverStartHttp2AreClosedAfterTheHandshakeTimeout) {
  // Taken before the first connection: every peer's timeout runs from its
  // own connection, after this, so however slowly the 100 connect on a busy
  // machine, none may be closed before `start` + 2 s.
  const absl::Time start = absl::Now();
  std::vector<int> silent = IdleConnections(server_->port(), 100);
  ASSERT_EQ(silent.size(), 100u);
  ExpectServing();  // meanwhile
  // The server's HTTP/2 settings and GOAWAY may come first; then the end.
  std::vector<bool> ended(silent.size(), false);
  int closed = 0;
  std::vector<char> sink(4096);
  for (int round = 0; round < 200 && closed < 100; ++round) {  // 10 s at most
    for (size_t i = 0; i < silent.size(); ++i) {
      ssize_t r = 1;
      while (!ended[i] && (r = ::recv(silent[i], sink.data(), sink.size(), MSG_DONTWAIT)) > 0) {
      }
      if (!ended[i] && (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK))) {
        ended[i] = true;
        ++closed;
      }
    }
    if (closed < 100) absl::SleepFor(absl::Milliseconds(50));
  }
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(closed, 100);
  EXPECT_GE(waited, absl::Milliseconds(1500));
  EXPECT_LT(waited, absl::Seconds(8));
  CloseAll(silent);
  ExpectServing();
}

// Short timeouts and a 64 MB checkpoint limit, so the hostile cases end fast.
class HostileDataPortTest : public OverloadTest {
 protected:
  void Configure(ServerOptions& options) override {
    options.checkpoint_data_hello_timeout = absl::Seconds(1);
    options.checkpoint_data_io_timeout = absl::Seconds(2);
    options.checkpoint_max_upload_bytes = 64 << 20;
  }
};

TEST_F(HostileDataPortTest, SilentPeersAreDroppedAfterTheHelloTimeout) {
  for (const std::string& sent : {std::string(), std::string(kHelloMagic, 4)}) {
    const absl::Time start = absl::Now();  // before the server's timer starts
    const int fd = ConnectTo(server_->checkpoint_data_port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(sent.empty() || SendAll(fd, {sent}, "half a hello").ok());
    absl::Status answer;
    ASSERT_TRUE(ReceiveReply(fd, &answer).ok());
    const absl::Duration waited = absl::Now() - start;
    EXPECT_EQ(answer.code(), absl::StatusCode::kUnavailable) << answer;
    EXPECT_EQ(answer.message(),
              "checkpoint data port: receiving the upload's hello: timed out (a connection must "
              "send its hello within 1s)");
    EXPECT_GE(waited, absl::Milliseconds(900));
    EXPECT_LT(waited, absl::Seconds(5));
    char byte;
    EXPECT_EQ(::recv(fd, &byte, 1, 0), 0) << "the coordinator closes the connection";
    ::close(fd);
  }
  ExpectServing();
}

TEST_F(HostileDataPortTest, HeadersPromisingFourGigabytesAreRefusedAtOnce) {
  const std::string job = JoinedTwoRankJob();
  const std::string job_dir = server_dir_ + "/checkpoints/" + job;
  constexpr uint64_t kFourGB = uint64_t{4} << 30;
  struct Case {
    ChunkHeader header;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases(3);
  cases[0].header.data_len = 0xffffffffu;  // one chunk of 4 GB
  cases[0].code = absl::StatusCode::kInvalidArgument;
  cases[0].message =
      "checkpoint data connection: chunk of 4294967295 bytes, more than the limit of 4194304";
  cases[1].header.data_len = 10;  // a file that says it is 4 GB
  cases[1].header.flags = ChunkHeader::kLast;
  cases[1].header.file_size = kFourGB;
  cases[1].code = absl::StatusCode::kResourceExhausted;
  cases[1].message =
      "checkpoint file \"model.pt\": a file of 4294967296 bytes (after 0 bytes of earlier files) "
      "is more than the limit of 67108864 bytes per checkpoint (coordinator flag "
      "--checkpoint_max_upload_bytes)";
  cases[2].header.data_len = 4 << 20;  // a chunk 4 GB into its file
  cases[2].header.offset = kFourGB;
  cases[2].code = absl::StatusCode::kResourceExhausted;
  cases[2].message =
      "checkpoint file \"model.pt\": a chunk of 4194304 bytes at offset 4294967296 (after 0 "
      "bytes of earlier files) is more than the limit of 67108864 bytes per checkpoint "
      "(coordinator flag --checkpoint_max_upload_bytes)";
  int64_t step = 10;
  for (Case& c : cases) {
    const int fd = Accepted(job, ++step);
    ASSERT_GE(fd, 0);
    c.header.name_len = 8;
    const absl::Time start = absl::Now();
    ASSERT_TRUE(SendChunk(fd, c.header, "model.pt", "").ok());  // and then nothing
    absl::Status answer;
    ASSERT_TRUE(ReceiveReply(fd, &answer).ok());
    EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "refused before the 2 s receive timeout";
    EXPECT_EQ(answer.code(), c.code) << answer;
    EXPECT_EQ(answer.message(), c.message);
    ::close(fd);
    EXPECT_TRUE(StagingGone(job_dir)) << "step " << step << " left its staging directory";
  }
  // A checkpoint of several files stops at the limit in all.
  {
    const int fd = Accepted(job, 20);
    ASSERT_GE(fd, 0);
    const std::string four_mb = Pattern(4 << 20, 3);
    ChunkHeader h;
    h.data_len = static_cast<uint32_t>(four_mb.size());
    h.chunk_crc32c = Crc32c(four_mb);
    h.flags = ChunkHeader::kLast;
    h.file_size = four_mb.size();
    h.file_crc32c = h.chunk_crc32c;
    for (int i = 0; i < 16; ++i) {  // 16 files of 4 MB: 64 MB, at the limit
      const std::string name = absl::StrCat("part", i);
      h.name_len = static_cast<uint16_t>(name.size());
      ASSERT_TRUE(SendChunk(fd, h, name, four_mb).ok()) << i;
    }
    absl::Status answer;
    h.name_len = 6;
    ASSERT_TRUE(SendChunk(fd, h, "part16", "").ok());
    ASSERT_TRUE(ReceiveReply(fd, &answer).ok());
    EXPECT_EQ(answer.code(), absl::StatusCode::kResourceExhausted) << answer;
    EXPECT_THAT(answer.message(),
                HasSubstr("checkpoint file \"part16\": a chunk of 4194304 bytes at offset 0 "
                          "(after 67108864 bytes of earlier files)"));
    ::close(fd);
    EXPECT_TRUE(StagingGone(job_dir));
  }
  EXPECT_TRUE(CommittedSteps(job).empty());
  ExpectServing();
}

TEST_F(HostileDataPortTest, APeerThatStopsMidChunkIsDroppedAndItsFilesDeleted) {
  const std::string job = JoinedTwoRankJob();
  const std::string job_dir = server_dir_ + "/checkpoints/" + job;
  const int fd = Accepted(job, 30);
  ASSERT_GE(fd, 0);
  const std::string first = Pattern(1 << 20, 4);
  ChunkHeader h;
  h.data_len = 4 << 20;  // promises 4 MB, sends 1 MB
  h.chunk_crc32c = 1;
  h.name_len = 8;
  // Before the send: the server may read the last byte (its last progress)
  // before SendChunk returns.
  const absl::Time start = absl::Now();
  ASSERT_TRUE(SendChunk(fd, h, "model.pt", first).ok());
  absl::Status answer;
  ASSERT_TRUE(ReceiveReply(fd, &answer).ok());
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(answer.code(), absl::StatusCode::kUnavailable) << answer;
  EXPECT_EQ(answer.message(),
            "receiving checkpoint data: timed out (the checkpoint data port drops an upload after "
            "2s without progress: coordinator flag --checkpoint_data_timeout_seconds)");
  EXPECT_GE(waited, absl::Milliseconds(1500));
  EXPECT_LT(waited, absl::Seconds(10));
  ::close(fd);
  EXPECT_TRUE(StagingGone(job_dir)) << "the dropped upload's staging directory is still there";

  // The next upload of the same step goes through.
  const int again = Accepted(job, 30);
  ASSERT_GE(again, 0);
  absl::Status committed = SendFile(again, "model.pt", first);
  EXPECT_TRUE(committed.ok()) << committed;
  ::close(again);
  EXPECT_EQ(CommittedSteps(job), (std::vector<int64_t>{30}));
}

TEST_F(HostileDataPortTest, UnsafeFileNamesAreRefusedOverBothPaths) {
  const std::string job = JoinedTwoRankJob();
  const std::string job_dir = server_dir_ + "/checkpoints/" + job;
  const std::vector<std::string> names = {"../escape",
                                          "sub/model.pt",
                                          "/etc/passwd",
                                          std::string("nul\0byte", 8),
                                          "",
                                          ".hidden",
                                          "MANIFEST",
                                          std::string(129, 'x'),
                                          std::string("..")};
  auto checkpoints = v1::CheckpointService::NewStub(channel_);
  int64_t step = 40;
  for (const std::string& name : names) {
    const std::string expected = absl::StrCat("checkpoint: bad file name \"", name, "\"");
    // Data port.
    const int fd = Accepted(job, ++step);
    ASSERT_GE(fd, 0);
    absl::Status answer = SendFile(fd, name, "weights");
    EXPECT_EQ(answer.code(), absl::StatusCode::kInvalidArgument) << answer;
    EXPECT_EQ(answer.message(), expected);
    ::close(fd);
    // Upload stream.
    v1::CheckpointChunk c;
    c.set_job_id(job);
    c.set_step(++step);
    c.set_generation(1);
    c.set_rank(0);
    c.set_file_name(name);
    c.set_data("weights");
    c.set_chunk_crc32c(Crc32c("weights"));
    c.set_last(true);
    c.set_file_size(7);
    c.set_file_crc32c(Crc32c("weights"));
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    v1::UploadCheckpointResponse response;
    auto writer = checkpoints->Upload(&context, &response);
    writer->Write(c);
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_EQ(s.error_message(), expected);
  }
  // Longer than the wire allows: refused from its header.
  {
    const int fd = Accepted(job, ++step);
    ASSERT_GE(fd, 0);
    absl::Status answer = SendFile(fd, std::string(2000, 'y'), "weights");
    EXPECT_EQ(answer.code(), absl::StatusCode::kInvalidArgument) << answer;
    EXPECT_EQ(answer.message(),
              "checkpoint data connection: file name of 2000 bytes, more than the limit of 1024");
    ::close(fd);
  }
  EXPECT_TRUE(StagingGone(job_dir));
  EXPECT_FALSE(std::filesystem::exists(server_dir_ + "/checkpoints/escape"));
  EXPECT_FALSE(std::filesystem::exists(job_dir + "/sub"));
  EXPECT_TRUE(CommittedSteps(job).empty());

  // A proper name still works.
  const int fd = Accepted(job, ++step);
  ASSERT_GE(fd, 0);
  absl::Status good = SendFile(fd, "model-0_final.pt", "weights");
  EXPECT_TRUE(good.ok()) << good;
  ::close(fd);
  EXPECT_EQ(CommittedSteps(job), (std::vector<int64_t>{step}));
  ExpectServing();
}

class StoreQuotaTest : public OverloadTest {
 protected:
  void Configure(ServerOptions& options) override { options.store_max_keys_per_job = 3000; }

  grpc::Status Set(v1::StoreService::Stub& store, const std::string& ns, const std::string& key,
                   const std::string& value) {
    v1::StoreSetRequest request;
    request.set_ns(ns);
    request.set_key(key);
    request.set_value(value);
    v1::StoreSetResponse response;
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    return store.Set(&context, request, &response);
  }
};

TEST_F(StoreQuotaTest, AJobWritingAMillionKeysStopsAtItsQuotaAndOthersKeepWorking) {
  auto store = v1::StoreService::NewStub(channel_);
  grpc::Status refused;
  int written = 0;
  for (int i = 0; i < 1000000; ++i) {
    refused = Set(*store, "job-000001/gen-1", absl::StrCat("key", i), "value");
    if (!refused.ok()) break;
    ++written;
  }
  EXPECT_EQ(written, 3000);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.error_message(),
            "store: job \"job-000001\" already holds 3000 keys, the limit of 3000 per job "
            "(coordinator flag --store_max_keys_per_job); key \"key3000\" was not set. "
            "Rendezvous needs a few keys per rank and generation: a job that reaches this "
            "writes keys in a loop");
  // A later generation of the same job counts against the same quota.
  EXPECT_EQ(Set(*store, "job-000001/gen-2", "0", "addr").error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);

  // Huge values: the store's limit, then gRPC's own message limit.
  grpc::Status huge = Set(*store, "job-000002/gen-1", "blob", std::string(20 << 20, 'x'));
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(huge.error_message(),
            "store: job \"job-000002\": the value of key \"blob\" is 20971520 bytes, more than the "
            "limit of 16777216 bytes per value (coordinator flag --store_max_value_bytes)");
  grpc::Status larger = Set(*store, "job-000002/gen-1", "blob", std::string(40 << 20, 'x'));
  EXPECT_EQ(larger.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << larger.error_message();

  // Another job's rendezvous is untouched.
  ASSERT_TRUE(Set(*store, "job-000002/gen-1", "0", "10.0.0.1:4000").ok());
  v1::StoreGetRequest get;
  get.set_ns("job-000002/gen-1");
  get.set_key("0");
  v1::StoreGetResponse got;
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(10)));
  ASSERT_TRUE(store->Get(&context, get, &got).ok());
  EXPECT_EQ(got.value(), "10.0.0.1:4000");
  ExpectServing();
}

class QueueLimitTest : public OverloadTest {
 protected:
  void Configure(ServerOptions& options) override { options.max_pending_jobs = 300; }

  grpc::Status SubmitJob(v1::SubmitJobResponse* response) {
    v1::SubmitJobRequest request;
    request.mutable_spec()->mutable_model()->mutable_mlp();
    request.mutable_spec()->mutable_data()->mutable_synthetic();
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    return jobs_->SubmitJob(&context, request, response);
  }
};

TEST_F(QueueLimitTest, SubmissionsBeyondTheQueueLimitAreRefusedWithWhatToDo) {
  v1::SubmitJobResponse response;
  std::string first;
  for (int i = 0; i < 300; ++i) {
    grpc::Status s = SubmitJob(&response);
    ASSERT_TRUE(s.ok()) << i << ": " << s.error_message();
    if (i == 0) first = response.job_id();
  }
  grpc::Status full = SubmitJob(&response);
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(full.error_message(),
            "the coordinator's queue is full: 300 jobs are pending, the limit is 300 (coordinator "
            "flag --max_pending_jobs). Submit again once some have started or ended, or cancel "
            "the ones you no longer need (`chorus jobs`, `chorus cancel JOB`)");
  // Cancelling one makes room for exactly one.
  v1::CancelJobRequest cancel;
  cancel.set_job_id(first);
  v1::CancelJobResponse cancelled;
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(10)));
  ASSERT_TRUE(jobs_->CancelJob(&context, cancel, &cancelled).ok());
  EXPECT_TRUE(SubmitJob(&response).ok());
  EXPECT_EQ(response.job_id(), "job-000301");
  EXPECT_EQ(SubmitJob(&response).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ExpectServing();
}

}  // namespace
}  // namespace chorus
