#include "worker/train/shard_reader.h"

#include <ATen/ATen.h>

#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/train/sampler.h"
#include "worker/train/shard_writer.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

// A tar of samples first..first+n-1: x float32 [features] whose values are
// key*1000 + j, y int64 key % 10. Sample `odd` (if in range) has one
// feature more.
std::string WriteShard(const std::string& name, int first, int n, int features, int odd = -1) {
  const std::string path = TempPath(name);
  auto tar = TarWriter::Create(path);
  EXPECT_TRUE(tar.ok()) << tar.status();
  std::vector<float> x(features + 1);
  for (int k = first; k < first + n; ++k) {
    for (int j = 0; j <= features; ++j) x[j] = static_cast<float>(k * 1000 + j);
    const int64_t y = k % 10;
    const int64_t width = k == odd ? features + 1 : features;
    const std::string key = absl::StrCat("s", k);
    EXPECT_TRUE(
        (*tar)->Add(key + ".x.npy", NpyBytes(ElementType::kFloat32, {width}, x.data())).ok());
    EXPECT_TRUE((*tar)->Add(key + ".y.npy", NpyBytes(ElementType::kInt64, {}, &y)).ok());
  }
  EXPECT_TRUE((*tar)->Close().ok());
  return path;
}

v1::ShardedData TarSpec(const std::vector<std::string>& paths, int64_t read_ahead) {
  v1::ShardedData s;
  s.set_format(v1::ShardedData::TAR);
  for (const std::string& p : paths) s.add_paths(p);
  s.set_input_member("x.npy");
  s.set_target_member("y.npy");
  s.set_num_classes(10);
  s.set_read_ahead_bytes(read_ahead);
  s.set_shuffle_buffer(64);
  return s;
}

// Checks that the batch's rows are the samples it names.
void ExpectRowsMatch(const ShardBatch& b) {
  for (int64_t r = 0; r < b.indices.size(0); ++r) {
    const int64_t key = b.indices[r].item<int64_t>();
    EXPECT_EQ(b.x[r][0].item<float>(), key * 1000.0f) << "row " << r;
    EXPECT_EQ(b.x[r][b.x.size(1) - 1].item<float>(), key * 1000.0f + b.x.size(1) - 1);
    EXPECT_EQ(b.y[r].item<int64_t>(), key % 10);
  }
}

TEST(ShardReaderTest, BatchesHoldTheNamedSamplesInTheGivenOrder) {
  const std::string a = WriteShard("a.tar", 0, 4, 5);
  const std::string b = WriteShard("b.tar", 4, 3, 5);
  auto reader = ShardReader::Open(TarSpec({a, b}, 1 << 20), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->index().size(), 7);
  EXPECT_EQ((*reader)->probe().x.sizes(), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ((*reader)->probe().num_classes, 10);
  (*reader)->Start({5, 0, 3, 6, 1}, 2);
  std::vector<int64_t> seen;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<ShardBatch> batch = (*reader)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    EXPECT_EQ(batch->x.scalar_type(), at::kFloat);
    EXPECT_EQ(batch->y.scalar_type(), at::kLong);
    ExpectRowsMatch(*batch);
    for (int64_t r = 0; r < batch->indices.size(0); ++r)
      seen.push_back(batch->indices[r].item<int64_t>());
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{5, 0, 3, 6, 1}));
  EXPECT_EQ((*reader)->Next().status().code(), absl::StatusCode::kFailedPrecondition);

  // A new start (the re-sharded rest of an epoch) drops what was read ahead.
  (*reader)->Start({2, 4, 6, 0}, 2);
  (*reader)->Start({1, 2}, 2);
  absl::StatusOr<ShardBatch> batch = (*reader)->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->indices[0].item<int64_t>(), 1);
  EXPECT_EQ(batch->indices[1].item<int64_t>(), 2);
}

// A dataset 100 times the read-ahead buffer: each rank reads its share of
// an epoch exactly once, reads only about its share of the bytes, and never
// holds more than the buffer.
TEST(ShardReaderTest, ADataset100TimesTheBufferStreamsEachRanksShareExactlyOnce) {
  constexpr int kShards = 4, kPerShard = 1600, kFeatures = 256;  // 6.6 MB decoded
  constexpr int64_t kBuffer = 64 << 10;
  std::vector<std::string> paths;
  for (int s = 0; s < kShards; ++s) {
    paths.push_back(
        WriteShard(absl::StrCat("big-", s, ".tar"), s * kPerShard, kPerShard, kFeatures));
  }
  const int64_t n = kShards * kPerShard;
  ASSERT_GE(n * (kFeatures * 4 + 8), 100 * kBuffer);
  constexpr int kWorld = 2;
  constexpr int64_t kBatch = 16;
  std::map<int64_t, int> seen;
  for (int rank = 0; rank < kWorld; ++rank) {
    auto reader = ShardReader::Open(TarSpec(paths, kBuffer), {});
    ASSERT_TRUE(reader.ok()) << reader.status();
    const std::vector<int64_t> order =
        StreamOrder((*reader)->index().ShardSizes(), 64, /*seed=*/3, /*shuffle=*/true, /*epoch=*/0);
    const SamplerOptions o{n, kWorld, rank, kBatch, 3, true, false};
    (*reader)->Start(ShareOfOrder(order, o), kBatch);
    for (int64_t b = 0; b < BatchesPerEpoch(o); ++b) {
      absl::StatusOr<ShardBatch> batch = (*reader)->Next();
      ASSERT_TRUE(batch.ok()) << batch.status();
      ExpectRowsMatch(*batch);
      for (int64_t r = 0; r < kBatch; ++r) ++seen[batch->indices[r].item<int64_t>()];
    }
    const ShardReader::Stats stats = (*reader)->stats();
    int64_t file_bytes = 0;
    for (const std::string& p : paths) file_bytes += std::ifstream(p, std::ios::ate).tellg();
    // Its samples' members, not the other rank's (plus the probe's sample).
    EXPECT_LT(stats.bytes_read, file_bytes / kWorld) << "rank " << rank;
    EXPECT_GT(stats.bytes_read, file_bytes / kWorld / 2) << "rank " << rank;
    EXPECT_LE(stats.max_ready_bytes, kBuffer) << "rank " << rank;
    EXPECT_GT(stats.max_ready_bytes, 0) << "rank " << rank;
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
  for (const auto& [i, count] : seen) ASSERT_EQ(count, 1) << "sample " << i;
}

TEST(ShardReaderTest, ASampleOfAnotherShapeIsAnErrorNamingFileAndOffset) {
  const std::string path = WriteShard("odd.tar", 0, 6, 3, /*odd=*/4);
  auto reader = ShardReader::Open(TarSpec({path}, 1 << 20), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  (*reader)->Start({0, 1, 2, 3, 4, 5}, 2);
  ASSERT_TRUE((*reader)->Next().ok());
  ASSERT_TRUE((*reader)->Next().ok());
  absl::StatusOr<ShardBatch> bad = (*reader)->Next();
  ASSERT_FALSE(bad.ok());
  // Sample 4's x member: 4 samples of 2 members of 2 blocks each, then its
  // header.
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr(absl::StrCat(path, " at byte offset ", 4 * 2048 + 512,
                                     " (sample 4): this .npy member's shape (4) or type differs "
                                     "from the first sample's (3)")));
}

// The first sample's headers are not parsed again for a member that has
// them byte for byte: one of another type with a header of the same length
// is still caught.
TEST(ShardReaderTest, ASampleOfAnotherTypeWithAHeaderAsLongIsAnError) {
  const std::string path = TempPath("type.tar");
  auto tar = TarWriter::Create(path);
  ASSERT_TRUE(tar.ok()) << tar.status();
  const std::vector<float> x = {1, 2, 3};
  const std::vector<int32_t> ints = {1, 2, 3};
  for (int k = 0; k < 4; ++k) {
    const int64_t y = k;
    const std::string key = absl::StrCat("s", k);
    const std::string member = k == 2 ? NpyBytes(ElementType::kInt32, {3}, ints.data())
                                      : NpyBytes(ElementType::kFloat32, {3}, x.data());
    ASSERT_EQ(member.size(), NpyBytes(ElementType::kFloat32, {3}, x.data()).size());
    ASSERT_TRUE((*tar)->Add(key + ".x.npy", member).ok());
    ASSERT_TRUE((*tar)->Add(key + ".y.npy", NpyBytes(ElementType::kInt64, {}, &y)).ok());
  }
  ASSERT_TRUE((*tar)->Close().ok());
  auto reader = ShardReader::Open(TarSpec({path}, 1 << 20), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  (*reader)->Start({0, 1, 3, 2}, 1);
  for (int b = 0; b < 3; ++b) ASSERT_TRUE((*reader)->Next().ok()) << "batch " << b;
  absl::StatusOr<ShardBatch> bad = (*reader)->Next();
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr(absl::StrCat(path, " at byte offset ", 2 * 2048 + 512,
                                     " (sample 2): this .npy member's shape (3) or type differs "
                                     "from the first sample's (3)")));
}

// Note [Parallel reads]: batches read by different threads come in the
// stream's order, and a read error comes in its batch's place, after every
// batch before it. Repeated, as the threads' timing differs run to run.
TEST(ShardReaderTest, AnErrorComesAfterEveryBatchBeforeIt) {
  const std::string path = WriteShard("late.tar", 0, 40, 64, /*odd=*/30);
  std::vector<int64_t> order(40);
  for (int64_t i = 0; i < 40; ++i) order[i] = i;
  for (int run = 0; run < 20; ++run) {
    auto reader = ShardReader::Open(TarSpec({path}, 1 << 20), {});
    ASSERT_TRUE(reader.ok()) << reader.status();
    (*reader)->Start(order, 2);
    for (int64_t b = 0; b < 15; ++b) {
      absl::StatusOr<ShardBatch> batch = (*reader)->Next();
      ASSERT_TRUE(batch.ok()) << "run " << run << " batch " << b << ": " << batch.status();
      EXPECT_EQ(batch->indices[0].item<int64_t>(), 2 * b) << "run " << run;
      ExpectRowsMatch(*batch);
    }
    absl::StatusOr<ShardBatch> bad = (*reader)->Next();
    ASSERT_FALSE(bad.ok()) << "run " << run;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("(sample 30)"));
  }
}

// Note [Batch buffers]: the next epoch (a new Start) keeps the pool and
// trains in the buffers of the last one.
TEST(ShardReaderTest, ANewEpochReusesTheLastEpochsBuffers) {
  const std::string path = WriteShard("epochs.tar", 0, 32, 8);
  auto reader = ShardReader::Open(TarSpec({path}, 400), {});  // two batches of 192 bytes
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int64_t> order(32);
  for (int64_t i = 0; i < 32; ++i) order[i] = (i * 13) % 32;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> first;
  (*reader)->Start(order, 4);
  for (int b = 0; b < 8; ++b) {
    absl::StatusOr<ShardBatch> batch = (*reader)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    first.push_back(batch->x.storage().getWeakStorageImpl());
  }
  // Every batch is released: only the pool can hold their buffers now.
  (*reader)->Start(order, 4);
  int kept = 0;
  for (const auto& w : first) kept += w.expired() ? 0 : 1;
  EXPECT_GE(kept, 1) << "the pool was dropped";
  absl::StatusOr<ShardBatch> batch = (*reader)->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  ExpectRowsMatch(*batch);
  const c10::StorageImpl* storage = batch->x.storage().unsafeGetStorageImpl();
  bool reused = false;
  for (const auto& w : first) reused = reused || w.lock().get() == storage;
  EXPECT_TRUE(reused) << "the second epoch's first batch is in a new buffer";
}

// Note [Batch buffers]: an input buffer of 2 MiB or more starts on a 2 MiB
// boundary, where a transparent huge page can back it.
TEST(ShardReaderTest, ABatchOfTwoMebibytesStartsOnAHugePageBoundary) {
  const std::string path = WriteShard("huge.tar", 0, 64, 8192);  // 32 KiB a sample
  auto reader = ShardReader::Open(TarSpec({path}, 8 << 20), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int64_t> order(64);
  for (int64_t i = 0; i < 64; ++i) order[i] = 63 - i;
  (*reader)->Start(order, 64);
  absl::StatusOr<ShardBatch> batch = (*reader)->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  ExpectRowsMatch(*batch);
  EXPECT_EQ(batch->x.nbytes(), size_t{2} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(batch->x.data_ptr()) % (uintptr_t{2} << 20), 0u);
}

TEST(ShardReaderTest, TokenFilesGiveShiftedWindowsAndCheckTheVocabulary) {
  const std::string path = TempPath("tokens.bin");
  std::vector<uint16_t> tokens(1001);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 251);
  tokens[905] = 300;  // in sample 90 only (tokens 900..910)
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  v1::ShardedData s;
  s.set_format(v1::ShardedData::TOKENS);
  s.add_paths(path);
  s.set_token_type(v1::ShardedData::UINT16);
  s.set_sequence_length(10);
  s.set_read_ahead_bytes(1 << 16);
  auto reader = ShardReader::Open(s, {/*float_inputs=*/false, /*vocab_size=*/256});
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->index().size(), 100);
  EXPECT_EQ((*reader)->probe().num_classes, 256);
  (*reader)->Start({99, 3, 90}, 2);
  absl::StatusOr<ShardBatch> batch = (*reader)->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->x.sizes(), (std::vector<int64_t>{2, 10}));
  EXPECT_EQ(batch->x.scalar_type(), at::kLong);
  EXPECT_EQ(batch->x[0][0].item<int64_t>(), 990 % 251);
  EXPECT_EQ(batch->y[0][9].item<int64_t>(), 1000 % 251) << "y is x shifted by one token";
  EXPECT_EQ(batch->x[1][2].item<int64_t>(), 32);
  absl::StatusOr<ShardBatch> bad = (*reader)->Next();
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr(absl::StrCat(path,
                                     " at byte offset 1800 holds token id 300, not below "
                                     "model.transformer_lm.vocab_size 256")));
}

// Note [Batch buffers]: a batch the trainer still holds (or a view of it)
// is never refilled, while released ones are reused.
TEST(ShardReaderTest, ABatchStillHeldIsNeverReusedForTheNextOnes) {
  const std::string path = WriteShard("pool.tar", 0, 64, 8);
  auto reader = ShardReader::Open(TarSpec({path}, 400), {});  // two batches of 192 bytes
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int64_t> order(64);
  for (int64_t i = 0; i < 64; ++i) order[i] = (i * 37) % 64;
  (*reader)->Start(order, 4);
  absl::StatusOr<ShardBatch> held = (*reader)->Next();
  ASSERT_TRUE(held.ok()) << held.status();
  // Only a tensor sharing its storage (no reference to the batch tensor
  // itself) outlives the batch.
  const at::Tensor view = held->x.detach();
  const at::Tensor expected = view.clone();
  const int64_t held_first = held->indices[0].item<int64_t>();
  held = absl::UnknownError("dropped");
  std::set<const void*> buffers;
  for (int b = 1; b < 16; ++b) {
    absl::StatusOr<ShardBatch> batch = (*reader)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    ExpectRowsMatch(*batch);
    buffers.insert(batch->x.data_ptr());
    EXPECT_TRUE(at::equal(view, expected)) << "the held batch was overwritten at batch " << b;
  }
  EXPECT_EQ(view[0][0].item<float>(), held_first * 1000.0f);
  EXPECT_LT(buffers.size(), 15u) << "released batches are reused";
}

TEST(ShardReaderTest, AClassOutsideNumClassesIsAnErrorNamingFileAndOffset) {
  const std::string path = WriteShard("classes.tar", 0, 12, 3);  // classes key % 10
  ShardReaderOptions options;
  options.num_classes = 8;
  auto reader = ShardReader::Open(TarSpec({path}, 1 << 20), options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  (*reader)->Start({0, 7, 8}, 3);
  absl::StatusOr<ShardBatch> bad = (*reader)->Next();
  ASSERT_FALSE(bad.ok());
  // Sample 8's y member: 8 samples of 2048 bytes, then its x member's 2
  // blocks and its y header.
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr(absl::StrCat(path, " at byte offset ", 8 * 2048 + 1024 + 512,
                                     " (sample 8): class 8 is outside [0, "
                                     "data.shards.num_classes 8)")));
}

}  // namespace
}  // namespace chorus
