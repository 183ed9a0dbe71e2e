#include "worker/train/shard_reader.h"

#include <ATen/ATen.h>
#include <unistd.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <map>
#include <numeric>
#include <random>
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

// Note [Samples in file order]: a group is sorted by counting when its
// samples are neighbours and by comparison when they are far apart; a
// sample named twice (an epoch padded for equal shares) fills both rows.
TEST(ShardReaderTest, SamplesNamedTwiceOrFarApartFillTheirOwnRows) {
  std::vector<std::string> paths;
  for (int s = 0; s < 3; ++s) {
    paths.push_back(WriteShard(absl::StrCat("apart-", s, ".tar"), s * 300, 300, 8));
  }
  auto reader = ShardReader::Open(TarSpec(paths, 1 << 20), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const std::vector<int64_t>& named :
       {std::vector<int64_t>{5, 3, 5, 4, 3, 5}, std::vector<int64_t>{899, 0, 899, 450, 0, 301}}) {
    (*reader)->Start(named, 3);
    std::vector<int64_t> seen;
    for (int b = 0; b < 2; ++b) {
      absl::StatusOr<ShardBatch> batch = (*reader)->Next();
      ASSERT_TRUE(batch.ok()) << batch.status();
      ExpectRowsMatch(*batch);
      for (int64_t r = 0; r < batch->indices.size(0); ++r) {
        seen.push_back(batch->indices[r].item<int64_t>());
      }
    }
    EXPECT_EQ(seen, named);
  }
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
    // Its samples' members, not the other rank's (plus the probe's sample
    // and the tar headers between neighbours read as one, Note [Grouped
    // reads]).
    EXPECT_LT(stats.bytes_read, file_bytes / kWorld * 105 / 100) << "rank " << rank;
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
  EXPECT_EQ(bad.status().message(),
            absl::StrCat("data.shards: ", path, " at byte offset ", 4 * 2048 + 512,
                         " (sample 4, member \"s4.x.npy\"): this member holds float32 of shape "
                         "(4), the first sample's float32 of shape (3): its shape differs; every "
                         "sample's member must have the same"));
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
  EXPECT_EQ(bad.status().message(),
            absl::StrCat("data.shards: ", path, " at byte offset ", 2 * 2048 + 512,
                         " (sample 2, member \"s2.x.npy\"): this member holds int32 of shape "
                         "(3), the first sample's float32 of shape (3): its type differs; every "
                         "sample's member must have the same"));
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
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("(sample 30, member \"s30.x.npy\")"));
  }
}

// Note [Grouped reads]: a rank alone with a buffer that holds whole
// shuffle blocks reads each run of neighbouring samples with one call, and
// every sample still lands in its own batch and row, in the stream's order.
TEST(ShardReaderTest, NeighboursInAGroupAreReadTogetherIntoTheirOwnRows) {
  constexpr int kShards = 3, kPerShard = 300, kFeatures = 64;
  std::vector<std::string> paths;
  for (int s = 0; s < kShards; ++s) {
    paths.push_back(
        WriteShard(absl::StrCat("runs-", s, ".tar"), s * kPerShard, kPerShard, kFeatures));
  }
  constexpr int64_t kBatch = 25;
  // A group is at most half the buffer: 8 batches, 200 samples, two blocks
  // of 100.
  auto reader = ShardReader::Open(TarSpec(paths, 16 * kBatch * (kFeatures * 4 + 16)), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  const std::vector<int64_t> order =
      StreamOrder((*reader)->index().ShardSizes(), 100, /*seed=*/7, /*shuffle=*/true, /*epoch=*/1);
  const int64_t reads_before = (*reader)->stats().reads;  // Open()'s probe
  (*reader)->Start(order, kBatch);
  std::vector<int64_t> seen;
  for (int64_t b = 0; b < kShards * kPerShard / kBatch; ++b) {
    absl::StatusOr<ShardBatch> batch = (*reader)->Next();
    ASSERT_TRUE(batch.ok()) << "batch " << b << ": " << batch.status();
    ExpectRowsMatch(*batch);
    for (int64_t r = 0; r < kBatch; ++r) seen.push_back(batch->indices[r].item<int64_t>());
  }
  EXPECT_EQ(seen, order);
  // 900 samples: the first block's in groups still growing (a batch, a
  // batch, two), which hold parts of it, read with about a call per sample;
  // then groups of two whole blocks, a call per block. One call per sample
  // would be 900; batch by batch, about 20 calls a batch, 700.
  const int64_t reads = (*reader)->stats().reads - reads_before;
  EXPECT_LT(reads, 100 + 20) << "neighbours were not read together";
  EXPECT_GE(reads, 9);
}

// Every read-ahead size, from less than a sample to many batches, with
// every batch size and world size here, reads each rank's share once, in
// order: the groups, the advisor's window and the buffer's bound never
// leave a thread waiting on another for good.
TEST(ShardReaderTest, EveryBufferBatchAndWorldSizeReadsTheShareOnceInOrder) {
  constexpr int kPerShard = 60, kFeatures = 16;
  const std::vector<std::string> paths = {WriteShard("sizes-0.tar", 0, kPerShard, kFeatures),
                                          WriteShard("sizes-1.tar", kPerShard, kPerShard,
                                                     kFeatures)};
  constexpr int64_t kSample = kFeatures * 4 + 16;  // decoded: x, y and its index
  for (const int64_t read_ahead : {int64_t{1}, 7 * kSample, 20 * kSample, 61 * kSample,
                                   1000 * kSample}) {
    for (const int64_t batch : {1, 7, 20}) {
      for (const int world : {1, 3}) {
        SCOPED_TRACE(absl::StrCat("read_ahead ", read_ahead, " batch ", batch, " world ", world));
        auto reader = ShardReader::Open(TarSpec(paths, read_ahead), {});
        ASSERT_TRUE(reader.ok()) << reader.status();
        const std::vector<int64_t> order = StreamOrder((*reader)->index().ShardSizes(), 16,
                                                       /*seed=*/2, /*shuffle=*/true, /*epoch=*/0);
        const SamplerOptions o{2 * kPerShard, world, world - 1, batch, 2, true, false};
        const std::vector<int64_t> share = ShareOfOrder(order, o);
        (*reader)->Start(share, batch);
        std::vector<int64_t> seen;
        for (int64_t b = 0; b < BatchesPerEpoch(o); ++b) {
          absl::StatusOr<ShardBatch> next = (*reader)->Next();
          ASSERT_TRUE(next.ok()) << "batch " << b << ": " << next.status();
          ExpectRowsMatch(*next);
          for (int64_t r = 0; r < next->indices.size(0); ++r)
            seen.push_back(next->indices[r].item<int64_t>());
        }
        EXPECT_EQ(seen, std::vector<int64_t>(share.begin(), share.begin() + seen.size()));
        EXPECT_EQ(static_cast<int64_t>(seen.size()), BatchesPerEpoch(o) * batch);
      }
    }
  }
}

// A shard cut short after it was indexed: the run that reaches past its
// end is read again sample by sample, so that the error names the first
// sample missing, after every batch before it.
TEST(ShardReaderTest, AShardCutShortUnderARunNamesTheSampleAfterTheBatchesBeforeIt) {
  const std::string path = WriteShard("cut.tar", 0, 40, 64);
  auto reader = ShardReader::Open(TarSpec({path}, 1 << 20), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  // Sample 30's members start at 30 x 2048 (2 members of 2 blocks each).
  ASSERT_EQ(::truncate(path.c_str(), 30 * 2048 + 700), 0);
  std::vector<int64_t> order(40);
  std::iota(order.begin(), order.end(), 0);
  (*reader)->Start(order, 2);
  for (int64_t b = 0; b < 15; ++b) {
    absl::StatusOr<ShardBatch> batch = (*reader)->Next();
    ASSERT_TRUE(batch.ok()) << "batch " << b << ": " << batch.status();
    ExpectRowsMatch(*batch);
  }
  absl::StatusOr<ShardBatch> bad = (*reader)->Next();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr(absl::StrCat("cannot read ", path, " at byte offset ", 30 * 2048 + 512,
                                     ": the file is shorter than when it was indexed")));
}

// Note [Token samples]: a TAR sample of token ids past the vocabulary is an
// error naming its file, offset and sample, after every batch before it,
// wherever it lies in a group of batches read together.
TEST(ShardReaderTest, ATarTokenPastTheVocabularyNamesItsSampleAfterTheBatchesBefore) {
  const std::string path = TempPath("tokens.tar");
  auto tar = TarWriter::Create(path);
  ASSERT_TRUE(tar.ok()) << tar.status();
  for (int k = 0; k < 12; ++k) {
    std::vector<int64_t> x(4), y(4);
    for (int j = 0; j < 4; ++j) {
      x[j] = (k + j) % 50;
      y[j] = (k + j + 1) % 50;
    }
    if (k == 9) x[2] = 300;  // past a vocabulary of 256
    const std::string key = absl::StrCat("s", k);
    ASSERT_TRUE((*tar)->Add(key + ".x.npy", NpyBytes(ElementType::kInt64, {4}, x.data())).ok());
    ASSERT_TRUE((*tar)->Add(key + ".y.npy", NpyBytes(ElementType::kInt64, {4}, y.data())).ok());
  }
  ASSERT_TRUE((*tar)->Close().ok());
  v1::ShardedData spec = TarSpec({path}, 1 << 20);
  spec.set_num_classes(0);
  auto reader = ShardReader::Open(spec, {/*float_inputs=*/false, /*vocab_size=*/256});
  ASSERT_TRUE(reader.ok()) << reader.status();
  // Sample 9 is row 1 of batch 3, the second batch of the third group
  // (groups grow: batch 0, batch 1, batches 2-3).
  (*reader)->Start({11, 0, 5, 2, 8, 1, 3, 4, 6, 7, 9, 10}, 3);
  for (int64_t b = 0; b < 3; ++b) {
    absl::StatusOr<ShardBatch> batch = (*reader)->Next();
    ASSERT_TRUE(batch.ok()) << "batch " << b << ": " << batch.status();
    EXPECT_EQ(batch->x[0][0].item<int64_t>(), batch->indices[0].item<int64_t>() % 50);
  }
  absl::StatusOr<ShardBatch> bad = (*reader)->Next();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  // Sample 9's x member: 9 samples of 2 members of 2 blocks each, then its
  // tar header, its .npy header and two int64 values before the token.
  const std::vector<int64_t> four(4);
  const int64_t values =
      9 * 2048 + 512 + NpyBytes(ElementType::kInt64, {4}, four.data()).size() - 4 * 8;
  EXPECT_EQ(bad.status().message(),
            absl::StrCat("data.shards: ", path, " at byte offset ", values + 2 * 8,
                         " (sample 9, element 2 of member \"s9.x.npy\"): input token id 300 is "
                         "not in [0, model.transformer_lm.vocab_size 256)"));
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
  // The two reading threads start on the first two batches at once, so
  // either may take the pooled buffer first.
  std::vector<ShardBatch> second;
  for (int b = 0; b < 2; ++b) {
    absl::StatusOr<ShardBatch> batch = (*reader)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    ExpectRowsMatch(*batch);
    second.push_back(*std::move(batch));
  }
  bool reused = false;
  for (const ShardBatch& batch : second) {
    const c10::StorageImpl* storage = batch.x.storage().unsafeGetStorageImpl();
    for (const auto& w : first) reused = reused || w.lock().get() == storage;
  }
  EXPECT_TRUE(reused) << "the second epoch's first two batches are both in new buffers";
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
  // Token 905 (2 bytes each), not sample 90's first (1800).
  EXPECT_EQ(bad.status().message(),
            absl::StrCat("data.shards: ", path,
                         " at byte offset 1810 (sample 90): token id 300 is not in [0, "
                         "model.transformer_lm.vocab_size 256)"));
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

// The bytes torch.save(value) writes (torch::pickle_save: the same zip
// format).
std::string Saved(const c10::IValue& value) {
  const std::vector<char> bytes = torch::jit::pickle_save(value);
  return std::string(bytes.begin(), bytes.end());
}

std::string SavedDict(const at::Tensor& x, const at::Tensor& y) {
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("x", x);
  dict.insert("y", y);
  return Saved(c10::IValue(dict));
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Sample k's input: `shape` values k*100 + j of `dtype`.
at::Tensor SampleTensor(int k, const std::vector<int64_t>& shape, at::ScalarType dtype) {
  return (at::arange(
              std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>()),
              at::kDouble) +
          k * 100)
      .reshape(shape)
      .to(dtype);
}

// The issue-59 case: a member whose .npy header lacks its shape. The error
// names the file, offset, sample and member, and quotes the header (which
// ends in a newline) on one line.
TEST(ShardReaderTest, ADamagedNpyHeaderIsAnErrorNamingFileOffsetSampleAndMember) {
  const std::string path = TempPath("damaged_header.tar");
  auto tar = TarWriter::Create(path);
  ASSERT_TRUE(tar.ok()) << tar.status();
  const std::vector<float> x = {1, 2, 3};
  std::string header;
  for (int k = 0; k < 4; ++k) {
    const int64_t y = k;
    std::string member = NpyBytes(ElementType::kFloat32, {3}, x.data());
    if (k == 3) {
      member.replace(member.find("'shape'"), 7, "'shapf'");
      header = member.substr(10, member.size() - 10 - 12);
    }
    const std::string key = absl::StrCat("s", k);
    ASSERT_TRUE((*tar)->Add(key + ".x.npy", member).ok());
    ASSERT_TRUE((*tar)->Add(key + ".y.npy", NpyBytes(ElementType::kInt64, {}, &y)).ok());
  }
  ASSERT_TRUE((*tar)->Close().ok());
  auto reader = ShardReader::Open(TarSpec({path}, 1 << 20), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  (*reader)->Start({0, 1, 2, 3}, 2);
  ASSERT_TRUE((*reader)->Next().ok());
  absl::StatusOr<ShardBatch> bad = (*reader)->Next();
  ASSERT_FALSE(bad.ok());
  ASSERT_EQ(header.back(), '\n');
  EXPECT_EQ(bad.status().message(),
            absl::StrCat("data.shards: ", path, " at byte offset ", 3 * 2048 + 512,
                         " (sample 3, member \"s3.x.npy\"): .npy header \"",
                         header.substr(0, header.size() - 1),
                         "\\n\" lacks descr, fortran_order or shape"));
}

// Note [Text label members]: WebDataset's integer labels as text.
TEST(ShardReaderTest, ATextLabelIsOneIntegerWithWhitespaceAround) {
  for (const auto& [text, label] : std::vector<std::pair<std::string, int64_t>>{
           {"7", 7}, {"7\n", 7}, {" 12 \r\n", 12}, {"0", 0}, {"-1", -1}, {"9000000000", 9000000000}}) {
    absl::StatusOr<int64_t> parsed = ParseTextLabel(text.data(), text.size());
    ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status();
    EXPECT_EQ(*parsed, label) << text;
  }
  for (const std::string text : {"cat\n", "7.0", "", "1e3", "[7]", "+7", "7 8", "\"7\""}) {
    absl::StatusOr<int64_t> parsed = ParseTextLabel(text.data(), text.size());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
  const std::string cat = "cat\n";
  EXPECT_EQ(ParseTextLabel(cat.data(), cat.size()).status().message(),
            "holds \"cat\\n\", not one integer: a .cls, .txt or .json target member must hold an "
            "integer class label as text (as WebDataset writes one)");
}

// Writes `n` WebDataset-style samples KEY.npy (float32 [3]) and
// KEY.`label`, the label k % 10 as text ("cls", with a newline as
// WebDataset writes it, "txt", "json") or as a .npy int64 ("y.npy"); sample
// `bad`'s label is "seven\n".
std::string WriteLabelShard(const std::string& name, int n, const std::string& label,
                            int bad = -1) {
  const std::string path = TempPath(name);
  auto tar = TarWriter::Create(path);
  EXPECT_TRUE(tar.ok()) << tar.status();
  for (int k = 0; k < n; ++k) {
    const std::vector<float> x = {k * 1.0f, k * 2.0f, k * 3.0f};
    const int64_t y = k % 10;
    const std::string text = k == bad ? "seven\n" : absl::StrCat(y, label == "cls" ? "\n" : "");
    EXPECT_TRUE(
        (*tar)->Add(absl::StrCat(k, ".npy"), NpyBytes(ElementType::kFloat32, {3}, x.data())).ok());
    EXPECT_TRUE((*tar)
                    ->Add(absl::StrCat(k, ".", label),
                          label == "y.npy" ? NpyBytes(ElementType::kInt64, {}, &y) : text)
                    .ok());
  }
  EXPECT_TRUE((*tar)->Close().ok());
  return path;
}

v1::ShardedData LabelSpec(const std::string& path, const std::string& label) {
  v1::ShardedData spec = TarSpec({path}, 1 << 20);
  spec.set_input_member("npy");
  spec.set_target_member(label);
  return spec;
}

TEST(ShardReaderTest, TextLabelsReadAsTheSameLabelsInNpyMembers) {
  std::vector<ShardBatch> read;
  for (const std::string label : {"y.npy", "cls", "txt", "json"}) {
    const std::string path = WriteLabelShard(absl::StrCat("labels_", label, ".tar"), 12, label);
    auto reader = ShardReader::Open(LabelSpec(path, label), {});
    ASSERT_TRUE(reader.ok()) << label << ": " << reader.status();
    EXPECT_EQ((*reader)->probe().y.sizes(), (std::vector<int64_t>{1})) << label;
    (*reader)->Start({11, 0, 5, 2, 8, 1, 3, 4, 6, 7, 9, 10}, 12);
    absl::StatusOr<ShardBatch> batch = (*reader)->Next();
    ASSERT_TRUE(batch.ok()) << label << ": " << batch.status();
    EXPECT_EQ(batch->y.scalar_type(), at::kLong) << label;
    EXPECT_EQ(batch->y[0].item<int64_t>(), 1) << label << ": sample 11's label";
    read.push_back(*batch);
  }
  for (size_t i = 1; i < read.size(); ++i) {
    EXPECT_TRUE(at::equal(read[i].x, read[0].x)) << i;
    EXPECT_TRUE(at::equal(read[i].y, read[0].y)) << i;
  }
}

TEST(ShardReaderTest, ATextLabelThatIsNoIntegerNamesFileOffsetSampleAndMember) {
  const std::string path = WriteLabelShard("bad_label.tar", 8, "cls", /*bad=*/5);
  auto reader = ShardReader::Open(LabelSpec(path, "cls"), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  (*reader)->Start({0, 1, 2, 3, 4, 5, 6, 7}, 4);
  ASSERT_TRUE((*reader)->Next().ok());
  absl::StatusOr<ShardBatch> bad = (*reader)->Next();
  ASSERT_FALSE(bad.ok());
  // Sample 5's label: 5 samples of 2 members of 2 blocks each, then the
  // .npy member (2 blocks) and its header.
  EXPECT_EQ(bad.status().message(),
            absl::StrCat("data.shards: ", path, " at byte offset ", 5 * 2048 + 1024 + 512,
                         " (sample 5, member \"5.cls\"): holds \"seven\\n\", not one integer: a "
                         ".cls, .txt or .json target member must hold an integer class label as "
                         "text (as WebDataset writes one)"));
  // A label outside num_classes is caught as a .npy label is.
  const std::string high = WriteLabelShard("high_label.tar", 12, "cls");
  reader = ShardReader::Open(LabelSpec(high, "cls"),
                             {/*float_inputs=*/true, /*vocab_size=*/0, /*num_classes=*/5});
  ASSERT_TRUE(reader.ok()) << reader.status();
  (*reader)->Start(std::vector<int64_t>{5}, 1);
  EXPECT_THAT(std::string((*reader)->Next().status().message()),
              HasSubstr("(sample 5): class 5 is outside [0, data.shards.num_classes 5)"));
}

TEST(ShardReaderTest, PtMembersDecodeToTheSavedShapesTypesAndValues) {
  const std::string path = TempPath("pt.tar");
  {
    auto tar = TarWriter::Create(path);
    ASSERT_TRUE(tar.ok()) << tar.status();
    for (int k = 0; k < 5; ++k) {
      const std::string key = absl::StrCat("s", k);
      // float64 [2, 3] inputs (trained as float32), int32 [2] class pairs.
      ASSERT_TRUE((*tar)->Add(key + ".x.pt", Saved(SampleTensor(k, {2, 3}, at::kDouble))).ok());
      ASSERT_TRUE(
          (*tar)->Add(key + ".y.pth", Saved(at::tensor({k % 3, (k + 1) % 3}, at::kInt))).ok());
    }
    ASSERT_TRUE((*tar)->Close().ok());
  }
  v1::ShardedData spec = TarSpec({path}, 1 << 20);
  spec.set_input_member("x.pt");
  spec.set_target_member("y.pth");
  spec.set_num_classes(3);
  auto reader = ShardReader::Open(spec, {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->index().size(), 5);
  EXPECT_EQ((*reader)->probe().x.sizes(), (std::vector<int64_t>{1, 2, 3}));
  (*reader)->Start({3, 0, 4, 1, 2}, 5);
  absl::StatusOr<ShardBatch> batch = (*reader)->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->x.scalar_type(), at::kFloat);
  ASSERT_EQ(batch->y.scalar_type(), at::kLong);
  EXPECT_EQ(batch->x.sizes(), (std::vector<int64_t>{5, 2, 3}));
  EXPECT_EQ(batch->y.sizes(), (std::vector<int64_t>{5, 2}));
  for (int64_t r = 0; r < 5; ++r) {
    const int k = static_cast<int>(batch->indices[r].item<int64_t>());
    EXPECT_TRUE(at::equal(batch->x[r], SampleTensor(k, {2, 3}, at::kFloat))) << "sample " << k;
    EXPECT_EQ(batch->y[r][0].item<int64_t>(), k % 3);
    EXPECT_EQ(batch->y[r][1].item<int64_t>(), (k + 1) % 3);
  }
}

// A damaged .pt member names the shard, its byte offset and the member.
TEST(ShardReaderTest, ADamagedPtMemberIsAnErrorNamingFileOffsetAndMember) {
  const std::string good = Saved(SampleTensor(0, {4}, at::kFloat));
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("x", SampleTensor(0, {4}, at::kFloat));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {good.substr(0, good.size() / 2), "not a torch.save file"},
      {Saved(c10::IValue(dict)), "holds a GenericDict, not a tensor"},
      {NpyBytes(ElementType::kFloat32, {4}, good.data()), "not a torch.save file"},
      {Saved(SampleTensor(0, {5}, at::kFloat)),
       "this member holds float32 of shape (5), the first sample's float32 of shape (4): its "
       "shape differs; every sample's member must have the same"},
      {Saved(SampleTensor(0, {4}, at::kDouble)),
       "this member holds float64 of shape (4), the first sample's float32 of shape (4): its "
       "type differs; every sample's member must have the same"},
      {Saved(SampleTensor(0, {2, 2}, at::kInt)),
       "this member holds int32 of shape (2, 2), the first sample's float32 of shape (4): its "
       "type and shape differ; every sample's member must have the same"},
      {Saved(SampleTensor(0, {4}, at::kHalf)), "holds a tensor of Half, which is not read"}};
  for (size_t c = 0; c < bad.size(); ++c) {
    const std::string path = TempPath(absl::StrCat("bad-pt-", c, ".tar"));
    int64_t offset = 0;
    {
      auto tar = TarWriter::Create(path);
      ASSERT_TRUE(tar.ok()) << tar.status();
      for (int k = 0; k < 3; ++k) {
        const int64_t y = k;
        if (k == 2) offset = (*tar)->bytes() + 512;
        ASSERT_TRUE((*tar)->Add(absl::StrCat("s", k, ".x.pt"), k == 2 ? bad[c].first : good).ok());
        ASSERT_TRUE((*tar)
                        ->Add(absl::StrCat("s", k, ".y.npy"), NpyBytes(ElementType::kInt64, {}, &y))
                        .ok());
      }
      ASSERT_TRUE((*tar)->Close().ok());
    }
    v1::ShardedData spec = TarSpec({path}, 1 << 20);
    spec.set_input_member("x.pt");
    auto reader = ShardReader::Open(spec, {});
    ASSERT_TRUE(reader.ok()) << reader.status();
    (*reader)->Start({0, 1, 2}, 3);
    absl::StatusOr<ShardBatch> batch = (*reader)->Next();
    ASSERT_FALSE(batch.ok()) << "case " << c;
    EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(batch.status().message()),
                HasSubstr(absl::StrCat(path, " at byte offset ", offset,
                                       " (sample 2, member \"s2.x.pt\"): ", bad[c].second)))
        << "case " << c;
  }
}

v1::ShardedData TensorFilesSpec(const std::vector<std::string>& paths, int64_t read_ahead) {
  v1::ShardedData s = TarSpec(paths, read_ahead);
  s.set_format(v1::ShardedData::TENSOR_FILES);
  s.clear_input_member();
  s.clear_target_member();
  return s;
}

// Note [Tensor file shards] in shard_index.cc: a directory of torch.save
// dicts is indexed from the files' zip directories and data.pkl, and a
// sample is read as its two rows.
TEST(ShardReaderTest, TensorFilesAreIndexedByRowAndReadBackExactly) {
  // Shard 0: x float32 [6, 3, 2]; shard 1: a slice (storage offset 2) of
  // 4 rows; y int64 classes.
  const at::Tensor x0 = at::randn({6, 3, 2}, at::kFloat);
  const at::Tensor y0 = at::arange(6, at::kLong) % 10;
  const at::Tensor x1 = at::randn({6, 3, 2}, at::kFloat).narrow(0, 2, 4);
  const at::Tensor y1 = (at::arange(6, at::kLong) * 3 % 10).narrow(0, 2, 4);
  const std::string a = TempPath("tf-0.pt"), b = TempPath("tf-1.pt");
  WriteFile(a, SavedDict(x0, y0));
  WriteFile(b, SavedDict(x1, y1));
  auto index = ShardIndex::Build(TensorFilesSpec({a, b}, 1 << 20));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->size(), 10);
  EXPECT_EQ(index->ShardSizes(), (std::vector<int64_t>{6, 4}));
  const SampleLocation s0 = index->Locate(0), s1 = index->Locate(1), s7 = index->Locate(7);
  EXPECT_EQ(s0.x.size, 3 * 2 * 4);
  EXPECT_EQ(s0.y.size, 8);
  EXPECT_EQ(s1.x.offset, s0.x.offset + 24) << "rows are consecutive";
  EXPECT_EQ(s1.y.offset, s0.y.offset + 8);
  EXPECT_EQ(s7.shard, 1);
  EXPECT_EQ(index->shards()[0].samples.size(), 0u) << "no per-sample index";

  auto reader = ShardReader::Open(TensorFilesSpec({a, b}, 1 << 20), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->probe().x.sizes(), (std::vector<int64_t>{1, 3, 2}));
  (*reader)->Start({9, 0, 7, 5, 2, 6}, 3);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<ShardBatch> batch = (*reader)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    for (int64_t r = 0; r < 3; ++r) {
      const int64_t k = batch->indices[r].item<int64_t>();
      const at::Tensor& x = k < 6 ? x0 : x1;
      const at::Tensor& y = k < 6 ? y0 : y1;
      const int64_t local = k < 6 ? k : k - 6;
      EXPECT_TRUE(at::equal(batch->x[r], x[local])) << "sample " << k;
      EXPECT_EQ(batch->y[r].item<int64_t>(), y[local].item<int64_t>()) << "sample " << k;
    }
  }
  // Only the rank's rows are read: 6 samples (and the probe's) of 32 bytes.
  EXPECT_EQ((*reader)->stats().bytes_read, 7 * 32);

  // Note [Shard fingerprints]: a shard rewritten with its rows elsewhere
  // (here: a slice at another storage offset) is another shard.
  const std::vector<int64_t> before = index->Fingerprints();
  WriteFile(b, SavedDict(at::randn({6, 3, 2}, at::kFloat).narrow(0, 1, 4), y1));
  auto changed = ShardIndex::Build(TensorFilesSpec({a, b}, 1 << 20));
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(changed->Fingerprints()[0], before[0]);
  EXPECT_NE(changed->Fingerprints()[1], before[1]);
  EXPECT_EQ(CheckFingerprints(*changed, before).code(), absl::StatusCode::kFailedPrecondition);
}

// Little-endian `bytes` bytes of `v`.
std::string Le(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}

// `zip` (a stored archive with a plain directory, as torch::pickle_save
// writes it) with the directory a writer makes for members or offsets past
// 4 GiB: every entry's sizes and local header offset 0xffffffff, their
// values in a zip64 extra field, then a zip64 end record, its locator, and
// an end record whose directory size and offset are 0xffffffff.
std::string AsZip64(const std::string& zip) {
  auto le = [&](size_t at, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(zip[at + i]);
    return v;
  };
  const size_t end = zip.rfind(std::string("PK\x05\x06", 4));
  const uint64_t count = le(end + 10, 2), dir_size = le(end + 12, 4), dir_at = le(end + 16, 4);
  std::string dir;
  for (size_t at = dir_at; at < dir_at + dir_size;) {
    const uint64_t name = le(at + 28, 2), extra = le(at + 30, 2), comment = le(at + 32, 2);
    const std::string zip64 = Le(1, 2) + Le(24, 2) + Le(le(at + 24, 4), 8) +
                              Le(le(at + 20, 4), 8) + Le(le(at + 42, 4), 8);
    std::string entry = zip.substr(at, 46);
    entry.replace(20, 8, Le(0xffffffff, 4) + Le(0xffffffff, 4));
    entry.replace(30, 2, Le(extra + zip64.size(), 2));
    entry.replace(42, 4, Le(0xffffffff, 4));
    dir += entry + zip.substr(at + 46, name) + zip64 + zip.substr(at + 46 + name, extra + comment);
    at += 46 + name + extra + comment;
  }
  const uint64_t record = dir_at + dir.size();
  return zip.substr(0, dir_at) + dir + Le(0x06064b50, 4) + Le(44, 8) + Le(45, 2) + Le(45, 2) +
         Le(0, 8) + Le(count, 8) + Le(count, 8) + Le(dir.size(), 8) + Le(dir_at, 8) +
         Le(0x07064b50, 4) + Le(0, 4) + Le(record, 8) + Le(1, 4) + Le(0x06054b50, 4) + Le(0, 4) +
         Le(0xffff, 2) + Le(0xffff, 2) + Le(0xffffffff, 4) + Le(0xffffffff, 4) + Le(0, 2);
}

// A torch.save file past 4 GiB has a zip64 directory (PyTorch's writer
// switches to it there): its members are found through the zip64 records
// and read back as from the plain archive.
TEST(ShardReaderTest, ATensorFileWithAZip64DirectoryReadsAsThePlainOne) {
  const at::Tensor x = at::randn({5, 4}, at::kFloat);
  const at::Tensor y = at::arange(5, at::kLong) % 3;
  const std::string plain = TempPath("plain.pt"), zip64 = TempPath("zip64.pt");
  WriteFile(plain, SavedDict(x, y));
  WriteFile(zip64, AsZip64(SavedDict(x, y)));
  auto a = ShardIndex::Build(TensorFilesSpec({plain}, 1 << 20));
  auto b = ShardIndex::Build(TensorFilesSpec({zip64}, 1 << 20));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->size(), 5);
  EXPECT_EQ(b->Locate(3).x.offset, a->Locate(3).x.offset) << "the same members, in place";
  EXPECT_EQ(b->Locate(3).y.offset, a->Locate(3).y.offset);
  auto reader = ShardReader::Open(TensorFilesSpec({zip64}, 1 << 20), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  (*reader)->Start({4, 0, 2, 1, 3}, 5);
  absl::StatusOr<ShardBatch> batch = (*reader)->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  for (int64_t r = 0; r < 5; ++r) {
    const int64_t k = batch->indices[r].item<int64_t>();
    EXPECT_TRUE(at::equal(batch->x[r], x[k])) << "sample " << k;
    EXPECT_EQ(batch->y[r].item<int64_t>(), y[k].item<int64_t>()) << "sample " << k;
  }
  // A zip64 end record that is not where its locator says is a clear error.
  std::string damaged = AsZip64(SavedDict(x, y));
  damaged[damaged.size() - 22 - 20 - 56] = 'X';
  WriteFile(zip64, damaged);
  auto refused = ShardIndex::Build(TensorFilesSpec({zip64}, 1 << 20));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(zip64 + " is not a torch.save file that is read: its zip64 "
                                         "directory record is damaged"));
}

// The same for a file Python's torch.save wrote (testdata/make_fixtures.py),
// whose pickle differs from torch::pickle_save's.
TEST(ShardReaderTest, APythonTensorFileReadsAsTorchLoadDoes) {
  const std::string path = "worker/train/testdata/tiny_data.pt";
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  const c10::Dict<c10::IValue, c10::IValue> saved = torch::jit::pickle_load(bytes).toGenericDict();
  const at::Tensor x = saved.at("x").toTensor(), y = saved.at("y").toTensor();
  v1::ShardedData spec = TensorFilesSpec({path}, 4096);
  spec.set_num_classes(3);
  auto reader = ShardReader::Open(spec, {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ((*reader)->index().size(), 96);
  std::vector<int64_t> all(96);
  std::iota(all.rbegin(), all.rend(), 0);
  (*reader)->Start(all, 96);
  absl::StatusOr<ShardBatch> batch = (*reader)->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_TRUE(at::equal(batch->x, x.flip(0)));
  EXPECT_TRUE(at::equal(batch->y, y.flip(0)));
}

// What a tensor file shard cannot be read as: an error naming the file and
// what to do.
TEST(ShardReaderTest, AnUnreadableTensorFileIsAnErrorNamingIt) {
  const at::Tensor x = at::randn({4, 3}, at::kFloat);
  const at::Tensor y = at::arange(4, at::kLong);
  c10::Dict<std::string, at::Tensor> only_x;
  only_x.insert("x", x);
  c10::impl::GenericDict string_x(c10::StringType::get(), c10::AnyType::get());
  string_x.insert("x", "pixels");
  string_x.insert("y", y);
  const std::string good = SavedDict(x, y);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {SavedDict(x.t(), y), "'x' is not contiguous"},
      {SavedDict(x, at::arange(5, at::kLong)), "x has 4 samples (first dimension) and y has 5"},
      {Saved(c10::IValue(only_x)), "has keys [x] but a tensor_file shard needs both 'x' and 'y'"},
      {Saved(c10::IValue(string_x)), "'x' is a string, not a tensor"},
      {SavedDict(x.to(at::kHalf), y), "'x' has storage HalfStorage, which is not read"},
      {SavedDict(x, at::scalar_tensor(3, at::kLong)), "'y' is a scalar"},
      {good.substr(0, good.size() - 30), "no zip directory"},
      {NpyBytes(ElementType::kFloat32, {3}, good.data()), "is not a torch.save file"},
      {Saved(c10::IValue(x)), "it holds no dict"}};
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::string path = TempPath(absl::StrCat("bad-tf-", c, ".pt"));
    WriteFile(path, cases[c].first);
    absl::StatusOr<ShardIndex> index = ShardIndex::Build(TensorFilesSpec({path}, 1 << 20));
    ASSERT_FALSE(index.ok()) << "case " << c;
    EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument) << index.status();
    EXPECT_THAT(std::string(index.status().message()), HasSubstr(path)) << "case " << c;
    EXPECT_THAT(std::string(index.status().message()), HasSubstr(cases[c].second)) << "case " << c;
  }
  // A shard whose rows differ from the first's names it.
  const std::string a = TempPath("rows-a.pt"), b = TempPath("rows-b.pt");
  WriteFile(a, good);
  WriteFile(b, SavedDict(at::randn({4, 2}, at::kFloat), y));
  absl::StatusOr<ShardIndex> index = ShardIndex::Build(TensorFilesSpec({a, b}, 1 << 20));
  ASSERT_FALSE(index.ok());
  EXPECT_THAT(std::string(index.status().message()),
              HasSubstr(absl::StrCat(b, ": x is [N, 2] of 4-byte floats, but ", a,
                                     "'s is [N, 3] of 4-byte floats")));
  // The Python fixture with other keys.
  index = ShardIndex::Build(TensorFilesSpec({"worker/train/testdata/bad_keys.pt"}, 1 << 20));
  ASSERT_FALSE(index.ok());
  EXPECT_THAT(std::string(index.status().message()),
              HasSubstr("bad_keys.pt has keys [inputs, labels] but a tensor_file shard needs"));
}

// Damaged bytes anywhere in a tensor file (bounded: 400 seeded damages of
// one to four bytes, or a truncation) are either read within the file or an
// error naming it; never a crash or a range past the end.
TEST(ShardReaderTest, ADamagedTensorFileIsReadWithinItOrNamed) {
  const std::string good = SavedDict(at::randn({4, 3}, at::kFloat), at::arange(4, at::kLong));
  const std::string path = TempPath("damaged.pt");
  std::mt19937 random(5);
  int accepted = 0;
  for (int round = 0; round < 400; ++round) {
    std::string bytes = good;
    if (round % 5 == 0) {
      bytes.resize(random() % bytes.size());
    } else {
      for (int k = 0; k <= static_cast<int>(random() % 4); ++k) {
        bytes[random() % bytes.size()] = static_cast<char>(random());
      }
    }
    WriteFile(path, bytes);
    absl::StatusOr<ShardIndex> index = ShardIndex::Build(TensorFilesSpec({path}, 1 << 20));
    if (!index.ok()) {
      EXPECT_THAT(std::string(index.status().message()), HasSubstr(path)) << "round " << round;
      continue;
    }
    ++accepted;
    for (int64_t i = 0; i < index->size(); ++i) {
      const SampleLocation loc = index->Locate(i);
      for (const ByteRange& r : {loc.x, loc.y}) {
        ASSERT_GE(r.offset, 0) << "round " << round;
        ASSERT_LE(r.end(), static_cast<int64_t>(bytes.size())) << "round " << round;
      }
    }
  }
  EXPECT_GT(accepted, 0) << "damage to the values alone is not seen";
}

}  // namespace
}  // namespace chorus
