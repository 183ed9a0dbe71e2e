#include "worker/train/cold_read_advisor.h"

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Note [Cold reads]: the window is the read-ahead buffer's samples as
// stored, at least 64 MiB of them and at most 65536, and at least two
// groups.
TEST(AdviseWindowTest, IsTheBuffersSamplesWithinItsBounds) {
  struct Case {
    int64_t read_ahead_bytes, sample_bytes, group_samples, window;
  };
  const std::vector<Case> cases = {
      {256 * kMiB, 16 << 10, 64, 16384},  // the buffer's samples
      {16 * kMiB, 16 << 10, 64, 4096},    // at least 64 MiB of them
      {64 * kMiB, 512, 64, 65536},        // at most 65536
      {64 * kMiB, 16 << 10, 4096, 8192},  // at least two groups
      {64 * kMiB, 0, 1, 65536},           // no bytes stored: the most
      {1, 64 * kMiB, 1, 2},               // samples larger than the window
  };
  for (const Case& c : cases) {
    EXPECT_EQ(AdviseWindow(c.read_ahead_bytes, c.sample_bytes, c.group_samples), c.window)
        << c.read_ahead_bytes << " bytes ahead, " << c.sample_bytes << " a sample, groups of "
        << c.group_samples;
  }
}

// Note [Cold reads]: ranges at most 1 MiB apart in one shard are read ahead
// as one.
TEST(MergeReadAheadTest, JoinsRangesAtMostAMebibyteApartInAShard) {
  struct Case {
    std::string name;
    std::vector<ShardRange> stored, merged;
  };
  const std::vector<Case> cases = {
      {"none", {}, {}},
      {"neighbours", {{0, {0, 100}}, {0, {612, 100}}}, {{0, {0, 712}}}},
      {"a mebibyte apart", {{0, {0, 100}}, {0, {100 + kMiB, 10}}}, {{0, {0, 110 + kMiB}}}},
      {"farther", {{0, {0, 100}}, {0, {101 + kMiB, 10}}}, {{0, {0, 100}}, {0, {101 + kMiB, 10}}}},
      {"other shards", {{0, {0, 100}}, {1, {100, 100}}}, {{0, {0, 100}}, {1, {100, 100}}}},
      {"overlapping windows", {{2, {0, 10}}, {2, {8, 10}}, {2, {16, 10}}}, {{2, {0, 26}}}},
      {"one within another", {{2, {0, 100}}, {2, {10, 10}}}, {{2, {0, 100}}}},
  };
  std::vector<ShardRange> merged;
  for (const Case& c : cases) {
    MergeReadAhead(c.stored, merged);
    ASSERT_EQ(merged.size(), c.merged.size()) << c.name;
    for (size_t i = 0; i < merged.size(); ++i) {
      EXPECT_EQ(merged[i].shard, c.merged[i].shard) << c.name << " " << i;
      EXPECT_EQ(merged[i].bytes.offset, c.merged[i].bytes.offset) << c.name << " " << i;
      EXPECT_EQ(merged[i].bytes.size, c.merged[i].bytes.size) << c.name << " " << i;
    }
  }
}

// Reading threads that move as a script says: AwaitWindow returns where
// the window ends once the script's next claim is made, and the advisor's
// reports are kept.
class ScriptedReading : public ReadingProgress {
 public:
  ScriptedReading(int64_t count, std::vector<int64_t> claimed)
      : count_(count), claimed_(std::move(claimed)) {}

  std::optional<int64_t> AwaitWindow(int64_t window, int64_t at_least) override {
    waits_.push_back(at_least);
    for (; next_ < claimed_.size(); ++next_) {
      const int64_t end = std::min(count_, claimed_[next_] + window);
      if (end >= at_least) return end;
    }
    return std::nullopt;  // the script ran out: reading stops
  }
  void Advised(int64_t advised) override { advised_.push_back(advised); }

  // What each AwaitWindow waited for, and each Advised() reported.
  const std::vector<int64_t>& waits() const { return waits_; }
  const std::vector<int64_t>& advised() const { return advised_; }

 private:
  const int64_t count_;
  const std::vector<int64_t> claimed_;  // the first sample not claimed, as reading moves
  size_t next_ = 0;
  std::vector<int64_t> waits_, advised_;
};

// A token file of 2 + 2 * 100 tokens: 100 samples of 2 + 1 tokens, sample
// i's bytes [4 i, 4 i + 6).
v1::ShardedData TokenSpec() {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp", "/ahead.bin");
  const std::vector<uint16_t> tokens(201, 7);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  v1::ShardedData spec;
  spec.set_format(v1::ShardedData::TOKENS);
  spec.add_paths(path);
  spec.set_sequence_length(2);
  return spec;
}

// The advisor moves in steps of a quarter window as reading moves, draws
// each sample once, in order, and stops when reading does.
TEST(ColdReadAdvisorTest, AdvisesInQuarterWindowStepsAsReadingMoves) {
  absl::StatusOr<ShardIndex> index = ShardIndex::Build(TokenSpec());
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->size(), 100);
  ReadCounts counts;
  ShardFiles files(*index, counts);
  absl::StatusOr<std::unique_ptr<ShardFormat>> format = ShardFormat::Open(*index, {}, files);
  ASSERT_TRUE(format.ok()) << format.status();
  const ColdReadAdvisor advisor(*index, **format, /*read_ahead_bytes=*/1);
  // 64 MiB of 6-byte samples: the most, 65536; two groups of 40000.
  EXPECT_EQ(advisor.Window(100), 65536);
  EXPECT_EQ(advisor.Window(40000), 80000);

  // A window of 40 samples, steps of 10, over 100 samples, with reading at
  // 0, then 15, 30 and 70: each wait is for the next step past what was
  // advised, and ends where the window does.
  ScriptedReading reading(100, {0, 15, 30, 70});
  int64_t drawn = 0;
  advisor.Run(
      100, [&drawn] { return drawn++; }, 40, reading);
  EXPECT_EQ(reading.waits(), (std::vector<int64_t>{10, 50, 65, 80}));
  EXPECT_EQ(reading.advised(), (std::vector<int64_t>{40, 55, 70, 100}));
  EXPECT_EQ(drawn, 100);

  // Reading that stops before the end: the advisor stops too.
  ScriptedReading stopped(100, {0});
  drawn = 0;
  advisor.Run(
      100, [&drawn] { return drawn++; }, 40, stopped);
  EXPECT_EQ(stopped.advised(), (std::vector<int64_t>{40}));
  EXPECT_EQ(drawn, 40);
}

}  // namespace
}  // namespace chorus
