#include "checkpoint/wire.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

TEST(ChunkHeaderTest, HasItsDocumentedLittleEndianLayoutAndRoundTrips) {
  ChunkHeader h;
  h.data_len = 0x01020304;
  h.chunk_crc32c = 0xa1b2c3d4;
  h.offset = 0x1122334455667788ull;
  h.file_size = 0x0000000500000006ull;
  h.file_crc32c = 0xdeadbeef;
  h.name_len = 0x0102;
  h.flags = ChunkHeader::kLast;
  char out[kChunkHeaderBytes];
  EncodeChunkHeader(h, out);
  const unsigned char* b = reinterpret_cast<const unsigned char*>(out);
  EXPECT_EQ(b[0], 0x04);
  EXPECT_EQ(b[3], 0x01);
  EXPECT_EQ(b[4], 0xd4);
  EXPECT_EQ(b[8], 0x88);
  EXPECT_EQ(b[15], 0x11);
  EXPECT_EQ(b[16], 0x06);
  EXPECT_EQ(b[20], 0x05);
  EXPECT_EQ(b[24], 0xef);
  EXPECT_EQ(b[28], 0x02);
  EXPECT_EQ(b[29], 0x01);
  EXPECT_EQ(b[30], ChunkHeader::kLast);
  EXPECT_EQ(b[31], 0);
  h.data_len = 4 << 20;
  EncodeChunkHeader(h, out);
  ChunkHeader back;
  ASSERT_TRUE(DecodeChunkHeader(out, &back).ok());
  EXPECT_EQ(back.data_len, h.data_len);
  EXPECT_EQ(back.chunk_crc32c, h.chunk_crc32c);
  EXPECT_EQ(back.offset, h.offset);
  EXPECT_EQ(back.file_size, h.file_size);
  EXPECT_EQ(back.file_crc32c, h.file_crc32c);
  EXPECT_EQ(back.name_len, h.name_len);
  EXPECT_EQ(back.flags, h.flags);
}

TEST(ChunkHeaderTest, HeadersBeyondTheLimitsAreRejected) {
  char out[kChunkHeaderBytes];
  ChunkHeader h;
  ChunkHeader back;
  h.data_len = kMaxChunkDataBytes + 1;
  EncodeChunkHeader(h, out);
  absl::Status s = DecodeChunkHeader(out, &back);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("more than the limit"));
  h = ChunkHeader();
  h.name_len = kMaxFileNameBytes + 1;
  EncodeChunkHeader(h, out);
  EXPECT_EQ(DecodeChunkHeader(out, &back).code(), absl::StatusCode::kInvalidArgument);
  h = ChunkHeader();
  h.flags = 8;
  EncodeChunkHeader(h, out);
  EXPECT_THAT(DecodeChunkHeader(out, &back).message(), HasSubstr("unknown flags"));
  h = ChunkHeader();
  h.flags = ChunkHeader::kEndOfUpload;
  h.data_len = 1;
  EncodeChunkHeader(h, out);
  EXPECT_THAT(DecodeChunkHeader(out, &back).message(), HasSubstr("end-of-upload marker with data"));
}

TEST(ReplyTest, CarriesCodeAndMessage) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  const std::string error = EncodeReply(absl::DataLossError("file model.pt: bad CRC"));
  const std::string ok = EncodeReply(absl::OkStatus());
  ASSERT_TRUE(SendAll(fds[0], {error, ok}, "replies").ok());
  ::close(fds[0]);
  absl::Status answer;
  ASSERT_TRUE(ReceiveReply(fds[1], &answer).ok());
  EXPECT_EQ(answer.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(answer.message(), "file model.pt: bad CRC");
  ASSERT_TRUE(ReceiveReply(fds[1], &answer).ok());
  EXPECT_TRUE(answer.ok());
  absl::Status closed = ReceiveReply(fds[1], &answer);
  EXPECT_EQ(closed.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(closed.message(), HasSubstr("closed"));
  ::close(fds[1]);
}

TEST(UploadTokenTest, IsRandomAndOfTheFixedSize) {
  absl::StatusOr<std::string> a = NewUploadToken();
  absl::StatusOr<std::string> b = NewUploadToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), kTokenBytes);
  EXPECT_NE(*a, *b);
}

// A listener on 127.0.0.1 (port 0); returns its fd and sets *port.
int Listen(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 4) != 0)
    return -1;
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

struct ReceivedChunk {
  ChunkHeader header;
  std::string name;
  std::string data;
};

// Accepts one connection, reads the hello and answers `accept`; if that is
// OK, reads chunks up to the end marker (or `stop_after` chunks) and
// answers `answer`.
void Receive(int listen_fd, std::string* hello, std::vector<ReceivedChunk>* chunks,
             const absl::Status& answer, int stop_after = 1 << 30,
             const absl::Status& accept = absl::OkStatus()) {
  const int fd = ::accept(listen_fd, nullptr, nullptr);
  hello->assign(kHelloMagicBytes + kTokenBytes, '\0');
  if (!ReceiveAll(fd, hello->data(), hello->size(), "hello").ok()) return;
  const std::string accepted = EncodeReply(accept);
  (void)SendAll(fd, {accepted}, "acceptance");
  if (!accept.ok()) {
    ::close(fd);
    return;
  }
  for (int i = 0; i < stop_after; ++i) {
    char header[kChunkHeaderBytes];
    ReceivedChunk c;
    if (!ReceiveAll(fd, header, sizeof(header), "header").ok() ||
        !DecodeChunkHeader(header, &c.header).ok())
      break;
    if (c.header.flags & ChunkHeader::kEndOfUpload) break;
    c.name.resize(c.header.name_len);
    c.data.resize(c.header.data_len);
    if (!ReceiveAll(fd, c.name.data(), c.name.size(), "name").ok() ||
        !ReceiveAll(fd, c.data.data(), c.data.size(), "data").ok()) {
      break;
    }
    chunks->push_back(std::move(c));
  }
  const std::string reply = EncodeReply(answer);
  (void)SendAll(fd, {reply}, "reply");
  if (!answer.ok()) {
    // As the coordinator does: let the sender see the answer before the close.
    ::shutdown(fd, SHUT_WR);
    char sink[65536];
    timeval tv{0, 300000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    for (int i = 0; i < 10000 && ::recv(fd, sink, sizeof(sink), 0) > 0; ++i) {
    }
  }
  ::close(fd);
}

TEST(CheckpointDataUploadTest, SendsLargeWritesInPlaceAndGathersSmallOnesWithChecksums) {
  int port = 0;
  const int listen_fd = Listen(&port);
  ASSERT_GE(listen_fd, 0);
  std::string hello;
  std::vector<ReceivedChunk> chunks;
  std::thread receiver([&] { Receive(listen_fd, &hello, &chunks, absl::OkStatus()); });
  const std::string token(kTokenBytes, 'k');
  // model.pt: a small header, 9 MB in one write, then small pieces;
  // state.pt: small pieces only.
  std::string big(9 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  std::string model;
  std::string state;
  {
    auto upload = CheckpointDataUpload::Connect("127.0.0.1", port, token, absl::Seconds(5),
                                                absl::Seconds(10));
    ASSERT_TRUE(upload.ok()) << upload.status();
    ASSERT_TRUE((*upload)->BeginFile("model.pt").ok());
    for (const std::string& piece :
         {std::string("PK-header"), big, std::string("tail-1"), std::string("tail-2")}) {
      ASSERT_TRUE((*upload)->Write(piece).ok());
      model += piece;
    }
    ASSERT_TRUE((*upload)->EndFile().ok());
    ASSERT_TRUE((*upload)->BeginFile("state.pt").ok());
    for (int i = 0; i < 100; ++i) {
      const std::string piece = absl::StrCat("step ", i, ";");
      ASSERT_TRUE((*upload)->Write(piece).ok());
      state += piece;
    }
    ASSERT_TRUE((*upload)->EndFile().ok());
    absl::Status finished = (*upload)->Finish();
    EXPECT_TRUE(finished.ok()) << finished;
    EXPECT_EQ((*upload)->bytes_sent(), static_cast<int64_t>(model.size() + state.size()));
  }
  receiver.join();
  ::close(listen_fd);
  EXPECT_EQ(hello, std::string(kHelloMagic, kHelloMagicBytes) + token);
  // Reassemble per file and check every chunk's CRC and the file trailers.
  std::map<std::string, std::string> files;
  std::string current;
  std::vector<uint32_t> sizes;
  for (const ReceivedChunk& c : chunks) {
    if (!c.name.empty()) current = c.name;
    EXPECT_EQ(c.header.offset, files[current].size()) << current;
    EXPECT_EQ(c.header.chunk_crc32c, Crc32c(c.data));
    EXPECT_LE(c.data.size(), CheckpointDataUpload::kSendBytes);
    files[current] += c.data;
    sizes.push_back(c.header.data_len);
    if (c.header.flags & ChunkHeader::kLast) {
      EXPECT_EQ(c.header.file_size, files[current].size());
      EXPECT_EQ(c.header.file_crc32c, Crc32c(files[current]));
    }
  }
  EXPECT_EQ(files["model.pt"], model);
  EXPECT_EQ(files["state.pt"], state);
  // "PK-header" gathered with the first 1 MB - 9 of `big` (the gather buffer
  // is filled, not flushed half empty), the next 8 MB straight from `big` in
  // 4 MB chunks, its last 9 bytes gathered with the tails as the last chunk;
  // state.pt in one last chunk.
  EXPECT_THAT(sizes, ::testing::ElementsAre(1u << 20, 4u << 20, 4u << 20, 9u + 12u, state.size()));
}

TEST(CheckpointDataUploadTest, AnEarlyRefusalStopsTheSenderWithTheReceiversReason) {
  int port = 0;
  const int listen_fd = Listen(&port);
  ASSERT_GE(listen_fd, 0);
  std::string hello;
  std::vector<ReceivedChunk> chunks;
  std::thread receiver([&] {
    Receive(listen_fd, &hello, &chunks,
            absl::DataLossError("model.pt: chunk at offset 0 is corrupt"),
            /*stop_after=*/1);
  });
  auto upload = CheckpointDataUpload::Connect("127.0.0.1", port, std::string(kTokenBytes, 't'),
                                              absl::Seconds(5), absl::Seconds(10));
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE((*upload)->BeginFile("model.pt").ok());
  const std::string block(4 << 20, 'x');
  absl::Status status;
  int writes = 0;
  for (; writes < 50 && status.ok(); ++writes) status = (*upload)->Write(block);
  receiver.join();
  if (status.ok()) status = (*upload)->Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("corrupt"));
  EXPECT_LT(writes, 50);  // it stopped once the answer was there
  ::close(listen_fd);
}

TEST(CheckpointDataUploadTest, ARefusalAtTheHelloIsWhatConnectReturns) {
  int port = 0;
  const int listen_fd = Listen(&port);
  ASSERT_GE(listen_fd, 0);
  std::string hello;
  std::vector<ReceivedChunk> chunks;
  std::thread receiver([&] {
    Receive(listen_fd, &hello, &chunks, absl::OkStatus(), 0,
            absl::ResourceExhaustedError(
                "checkpoint data port: 32 uploads are running; upload over gRPC"));
  });
  auto upload = CheckpointDataUpload::Connect("127.0.0.1", port, std::string(kTokenBytes, 't'),
                                              absl::Seconds(5), absl::Seconds(10));
  receiver.join();
  ::close(listen_fd);
  EXPECT_EQ(upload.status().code(), absl::StatusCode::kResourceExhausted) << upload.status();
  EXPECT_THAT(upload.status().message(), HasSubstr("upload over gRPC"));
}

TEST(CheckpointDataUploadTest, AnUnreachablePortIsUnavailableAndNamed) {
  int port = 0;
  const int listen_fd = Listen(&port);
  ASSERT_GE(listen_fd, 0);
  ::close(listen_fd);  // nothing listens there now
  auto upload = CheckpointDataUpload::Connect("127.0.0.1", port, std::string(kTokenBytes, 't'),
                                              absl::Seconds(5), absl::Seconds(5));
  ASSERT_FALSE(upload.ok());
  EXPECT_EQ(upload.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(upload.status().message(), HasSubstr(absl::StrCat("127.0.0.1:", port)));
  auto bad_token =
      CheckpointDataUpload::Connect("127.0.0.1", port, "short", absl::Seconds(5), absl::Seconds(5));
  EXPECT_EQ(bad_token.status().code(), absl::StatusCode::kInvalidArgument);
}

// A process whose signals interrupt system calls (libFuzzer's timeout alarm,
// a profiler, an operator's SIGUSR1) must still connect: the connection goes
// on after the signal, and so must the wait for it.
TEST(ConnectTcpTest, RidesOutSignalsWhileTheConnectionIsPending) {
  int port = 0;
  const int listen_fd = Listen(&port);
  ASSERT_GE(listen_fd, 0);
  ASSERT_EQ(::listen(listen_fd, 0), 0);
  // Fill the accept queue, so the next connection waits for a SYN retry.
  std::vector<int> fillers;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<int> fd = ConnectTcp("127.0.0.1", port, absl::Milliseconds(100));
    if (fd.ok()) fillers.push_back(*fd);
  }
  ASSERT_FALSE(fillers.empty());

  struct sigaction action {};
  action.sa_handler = [](int) {};  // no SA_RESTART: calls return EINTR
  struct sigaction previous {};
  ASSERT_EQ(::sigaction(SIGALRM, &action, &previous), 0);
  itimerval every_10ms{{0, 10000}, {0, 10000}};
  ASSERT_EQ(::setitimer(ITIMER_REAL, &every_10ms, nullptr), 0);
  std::atomic<bool> stop{false};
  std::thread acceptor([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (int i = 0; i < 100 && !stop.load(); ++i) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK);
      if (fd >= 0) fillers.push_back(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  absl::StatusOr<int> fd = ConnectTcp("127.0.0.1", port, absl::Seconds(10));
  itimerval off{};
  ::setitimer(ITIMER_REAL, &off, nullptr);
  ::sigaction(SIGALRM, &previous, nullptr);
  stop = true;
  acceptor.join();
  ASSERT_TRUE(fd.ok()) << fd.status();
  ::close(*fd);
  for (int f : fillers) ::close(f);
  ::close(listen_fd);
}

}  // namespace
}  // namespace chorus
