#include "checkpoint/download.h"

#include <string>
#include <vector>

#include "checkpoint/fake_checkpoint_service.h"
#include "common/crc32c.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

v1::CheckpointChunk Chunk(int64_t offset, const std::string& data) {
  v1::CheckpointChunk chunk;
  chunk.set_offset(offset);
  chunk.set_data(data);
  chunk.set_chunk_crc32c(Crc32c(data));
  return chunk;
}

// `bytes` in chunks of `piece` bytes, the last one carrying the file's size
// and checksums as the coordinator sends them.
std::vector<v1::CheckpointChunk> Chunks(const std::string& bytes, size_t piece,
                                        bool with_sha256 = true) {
  std::vector<v1::CheckpointChunk> out;
  for (size_t offset = 0; offset < bytes.size(); offset += piece) {
    out.push_back(Chunk(static_cast<int64_t>(offset), bytes.substr(offset, piece)));
  }
  v1::CheckpointChunk& last = out.back();
  last.set_last(true);
  last.set_file_size(static_cast<int64_t>(bytes.size()));
  last.set_file_crc32c(Crc32c(bytes));
  if (with_sha256) last.set_file_sha256(Sha256Hex(bytes));
  return out;
}

class DownloadTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::string> DownloadWith(std::vector<v1::CheckpointChunk> chunks,
                                           grpc::Status end = grpc::Status::OK) {
    coordinator_.set_download_script(std::move(chunks), std::move(end));
    EXPECT_TRUE(coordinator_.Start().ok());
    auto stub = v1::CheckpointService::NewStub(coordinator_.channel());
    return DownloadCheckpointFile(*stub, "job-000001", 30, "model.pt", absl::Seconds(10));
  }

  FakeCheckpointService coordinator_;
};

TEST_F(DownloadTest, ReassemblesAFileCheckedBySha256) {
  std::string bytes(3000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 1);
  absl::StatusOr<std::string> got = DownloadWith(Chunks(bytes, 1024));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, bytes);
}

TEST_F(DownloadTest, SharedDirectoryFilesAreCheckedByCrc32c) {
  absl::StatusOr<std::string> got =
      DownloadWith(Chunks("weights of a shared-dir checkpoint", 10, false));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "weights of a shared-dir checkpoint");
}

TEST_F(DownloadTest, ADamagedChunkIsDataLoss) {
  std::vector<v1::CheckpointChunk> chunks = Chunks("abcdefghij", 4);
  chunks[1].set_data("EFGH");  // its CRC is still that of "efgh"
  absl::StatusOr<std::string> got = DownloadWith(chunks);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(),
              HasSubstr("checkpoint job-000001 model.pt: a chunk arrived damaged"));
}

TEST_F(DownloadTest, AChunkAtTheWrongOffsetIsDataLoss) {
  std::vector<v1::CheckpointChunk> chunks = Chunks("abcdefghij", 4);
  std::swap(chunks[0], chunks[1]);
  EXPECT_EQ(DownloadWith(chunks).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(DownloadTest, AFileThatDoesNotMatchItsRecordedChecksumIsDataLoss) {
  std::vector<v1::CheckpointChunk> chunks = Chunks("abcdefghij", 4);
  chunks.back().set_file_sha256(Sha256Hex("something else"));
  absl::StatusOr<std::string> got = DownloadWith(chunks);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(), HasSubstr("does not match its recorded size and SHA-256"));
}

TEST_F(DownloadTest, AWrongSizeIsDataLossNamingCrc32cForSharedDirectoryFiles) {
  std::vector<v1::CheckpointChunk> chunks = Chunks("abcdefghij", 4, false);
  chunks.back().set_file_size(11);
  absl::StatusOr<std::string> got = DownloadWith(chunks);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(), HasSubstr("does not match its recorded size and CRC-32C"));
}

TEST_F(DownloadTest, AStreamThatEndsWithoutTheLastChunkIsDataLoss) {
  std::vector<v1::CheckpointChunk> chunks = Chunks("abcdefghij", 4);
  chunks.pop_back();
  absl::StatusOr<std::string> got = DownloadWith(chunks);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(), HasSubstr("ended early"));
}

TEST_F(DownloadTest, TheCoordinatorsErrorIsReturned) {
  absl::StatusOr<std::string> got = DownloadWith(
      {}, grpc::Status(grpc::StatusCode::NOT_FOUND, "job-000001 has no checkpoint at step 30"));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("no checkpoint at step 30"));
}

}  // namespace
}  // namespace chorus
