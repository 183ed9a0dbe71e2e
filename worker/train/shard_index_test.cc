#include "worker/train/shard_index.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/train/shard_writer.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A tar of `n` samples KEY.x.npy (float32 [3]: key, key+.25, key+.5) and
// KEY.y.npy (int64 scalar: key % 5), keys numbered from `first`, with a
// member of another kind between the samples.
std::string WriteShard(const std::string& name, int first, int n) {
  const std::string path = absl::StrCat(TempDir(), "/", name);
  auto tar = TarWriter::Create(path);
  EXPECT_TRUE(tar.ok()) << tar.status();
  for (int k = first; k < first + n; ++k) {
    const float x[3] = {static_cast<float>(k), k + 0.25f, k + 0.5f};
    const int64_t y = k % 5;
    const std::string key = absl::StrCat("sample", k);
    EXPECT_TRUE((*tar)->Add(key + ".x.npy", NpyBytes(ElementType::kFloat32, {3}, x)).ok());
    EXPECT_TRUE((*tar)->Add(key + ".json", "{}").ok());
    EXPECT_TRUE((*tar)->Add(key + ".y.npy", NpyBytes(ElementType::kInt64, {}, &y)).ok());
  }
  EXPECT_TRUE((*tar)->Close().ok());
  return path;
}

v1::ShardedData TarSpec(const std::vector<std::string>& paths) {
  v1::ShardedData s;
  s.set_format(v1::ShardedData::TAR);
  for (const std::string& p : paths) s.add_paths(p);
  s.set_input_member("x.npy");
  s.set_target_member("y.npy");
  return s;
}

// The member `r` of `path`, parsed.
NpyArray Member(const std::string& path, const ByteRange& r, std::string& bytes) {
  bytes = ReadAll(path).substr(r.offset, r.size);
  absl::StatusOr<NpyArray> a = ParseNpy(bytes.data(), r.size);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *a : NpyArray{};
}

TEST(ShardIndexTest, NumbersTarSamplesShardAfterShardAndLocatesTheirMembers) {
  const std::string a = WriteShard("a.tar", 0, 4);
  const std::string b = WriteShard("b.tar", 4, 3);
  absl::StatusOr<ShardIndex> index = ShardIndex::Build(TarSpec({a, b}));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->size(), 7);
  EXPECT_EQ(index->ShardSizes(), (std::vector<int64_t>{4, 3}));
  for (int64_t i = 0; i < 7; ++i) {
    const SampleLocation where = index->Locate(i);
    EXPECT_EQ(where.shard, i < 4 ? 0 : 1);
    std::string bytes;
    const NpyArray x = Member(i < 4 ? a : b, where.x, bytes);
    ASSERT_EQ(x.shape, (std::vector<int64_t>{3}));
    float values[3];
    ConvertElements(bytes.data() + x.data_offset, x.type, 3, /*to_float=*/true, values);
    EXPECT_EQ(values[1], i + 0.25f);
    const NpyArray y = Member(i < 4 ? a : b, where.y, bytes);
    EXPECT_TRUE(y.shape.empty());
    int64_t label = -1;
    ConvertElements(bytes.data() + y.data_offset, y.type, 1, /*to_float=*/false, &label);
    EXPECT_EQ(label, i % 5);
  }
}

TEST(ShardIndexTest, ReadsGnuTarAndPaxArchivesWithLongNames) {
  // Written by GNU tar 1.34 (--format=gnu and --format=pax) from samples
  // s0..s2 in a directory whose name is 114 bytes long: x float32 [2]
  // (i, i + 0.5), y int64 i, and an s<i>.json member each.
  for (const char* name : {"gnu.tar", "pax.tar"}) {
    const std::string path = absl::StrCat("worker/train/testdata/shards/", name);
    absl::StatusOr<ShardIndex> index = ShardIndex::Build(TarSpec({path}));
    ASSERT_TRUE(index.ok()) << index.status();
    ASSERT_EQ(index->size(), 3) << name;
    std::string bytes;
    const NpyArray x = Member(path, index->Locate(2).x, bytes);
    float values[2];
    ConvertElements(bytes.data() + x.data_offset, x.type, 2, true, values);
    EXPECT_EQ(values[0], 2.0f) << name;
    EXPECT_EQ(values[1], 2.5f) << name;
  }
}

TEST(ShardIndexTest, ADamagedShardIsAnErrorNamingTheFileAndOffset) {
  const std::string good = ReadAll(WriteShard("good.tar", 0, 3));
  const std::string path = absl::StrCat(TempDir(), "/damaged.tar");
  // A sample is 3 members of one header block and one data block each:
  // 3072 bytes. The second member's header is at 1024.
  std::string bad = good;
  bad[1024 + 10] ^= 0x40;
  WriteAll(path, bad);
  absl::StatusOr<ShardIndex> index = ShardIndex::Build(TarSpec({path}));
  ASSERT_FALSE(index.ok());
  EXPECT_THAT(std::string(index.status().message()),
              HasSubstr(absl::StrCat(path, " at byte offset 1024: not a tar header")));

  WriteAll(path, good.substr(0, 3072 + 512 + 50));  // inside the second sample's x
  index = ShardIndex::Build(TarSpec({path}));
  ASSERT_FALSE(index.ok());
  EXPECT_THAT(std::string(index.status().message()),
              HasSubstr("at byte offset 3072: member \"sample1.x.npy\" of 140 bytes runs past "
                        "the end of the file (3634 bytes)"));
  EXPECT_THAT(std::string(index.status().message()), HasSubstr(path));

  WriteAll(path, good.substr(0, 3072 + 100));  // a partial header block
  index = ShardIndex::Build(TarSpec({path}));
  ASSERT_FALSE(index.ok());
  EXPECT_THAT(std::string(index.status().message()), HasSubstr("ends inside a tar header"));
}

TEST(ShardIndexTest, ASampleWithoutItsTargetIsAnError) {
  const std::string path = absl::StrCat(TempDir(), "/lonely.tar");
  auto tar = TarWriter::Create(path);
  ASSERT_TRUE(tar.ok());
  const float x = 1;
  ASSERT_TRUE((*tar)->Add("k1.x.npy", NpyBytes(ElementType::kFloat32, {1}, &x)).ok());
  ASSERT_TRUE((*tar)->Add("k2.x.npy", NpyBytes(ElementType::kFloat32, {1}, &x)).ok());
  ASSERT_TRUE((*tar)->Close().ok());
  absl::StatusOr<ShardIndex> index = ShardIndex::Build(TarSpec({path}));
  ASSERT_FALSE(index.ok());
  EXPECT_THAT(
      std::string(index.status().message()),
      HasSubstr(absl::StrCat(path, " at byte offset 0: sample \"k1\" has no y.npy member")));
}

TEST(ShardIndexTest, TokenFilesHoldOverlappingWindowsOfSequenceLengthPlusOne) {
  const std::string path = absl::StrCat(TempDir(), "/train.bin");
  std::string tokens(2 * 1001, '\0');  // 1001 uint16 tokens
  WriteAll(path, tokens);
  v1::ShardedData s;
  s.set_format(v1::ShardedData::TOKENS);
  s.add_paths(path);
  s.set_sequence_length(10);
  s.set_token_type(v1::ShardedData::UINT16);
  absl::StatusOr<ShardIndex> index = ShardIndex::Build(s);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->size(), 100);
  const SampleLocation where = index->Locate(99);
  EXPECT_EQ(where.x.offset, 99 * 10 * 2);
  EXPECT_EQ(where.x.end(), 2 * 1001) << "the last sample ends at the last token";

  WriteAll(path, tokens + "x");
  index = ShardIndex::Build(s);
  ASSERT_FALSE(index.ok());
  EXPECT_THAT(std::string(index.status().message()),
              HasSubstr("not a whole number of 2-byte tokens"));
}

TEST(ShardIndexTest, GlobsExpandSortedAndAGlobMatchingNothingIsNotFound) {
  const std::string dir = absl::StrCat(TempDir(), "/glob");
  ::mkdir(dir.c_str(), 0755);
  for (const char* name : {"part-2.bin", "part-0.bin", "part-1.bin", "other.bin"}) {
    WriteAll(absl::StrCat(dir, "/", name), "");
  }
  v1::ShardedData s;
  s.add_paths(dir + "/part-*.bin");
  absl::StatusOr<std::vector<std::string>> paths = ExpandShardPaths(s);
  ASSERT_TRUE(paths.ok()) << paths.status();
  EXPECT_EQ(*paths, (std::vector<std::string>{dir + "/part-0.bin", dir + "/part-1.bin",
                                              dir + "/part-2.bin"}));
  s.add_paths(dir + "/nothing-*.bin");
  paths = ExpandShardPaths(s);
  ASSERT_FALSE(paths.ok());
  EXPECT_EQ(paths.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(paths.status().message()), HasSubstr("data.shards.paths[1]"));
}

TEST(ShardIndexTest, ParseNpySaysWhatIsWrong) {
  const float v[2] = {1, 2};
  std::string good = NpyBytes(ElementType::kFloat32, {2}, v);
  EXPECT_TRUE(ParseNpy(good.data(), good.size()).ok());
  EXPECT_THAT(ParseNpy(good.data(), good.size() - 1).status().message(),
              HasSubstr("needs 8 bytes of values, the member has 7"));
  std::string big_endian = good;
  big_endian.replace(big_endian.find("<f4"), 3, ">f4");
  EXPECT_THAT(ParseNpy(big_endian.data(), big_endian.size()).status().message(),
              HasSubstr("type '>f4' is not read"));
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_THAT(ParseNpy(fortran.data(), fortran.size()).status().message(),
              HasSubstr("Fortran order"));
  EXPECT_THAT(ParseNpy("PK\3\4 not npy", 12).status().message(), HasSubstr("not a .npy file"));
}

}  // namespace
}  // namespace chorus
