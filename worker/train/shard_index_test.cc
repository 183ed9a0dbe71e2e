#include "worker/train/shard_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/train/shard_writer.h"
#include "worker/train/torch_save_file.h"

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
              HasSubstr(absl::StrCat(path,
                                     " at byte offset 1024 (sample 0 of this shard): not a tar "
                                     "header (bad checksum)")));

  WriteAll(path, good.substr(0, 3072 + 512 + 50));  // inside the second sample's x
  index = ShardIndex::Build(TarSpec({path}));
  ASSERT_FALSE(index.ok());
  EXPECT_THAT(
      std::string(index.status().message()),
      HasSubstr("at byte offset 3072 (sample 1 of this shard): member \"sample1.x.npy\" of 140 "
                "bytes runs past "
                "the end of the file (3634 bytes)"));
  EXPECT_THAT(std::string(index.status().message()), HasSubstr(path));

  WriteAll(path, good.substr(0, 3072 + 100));  // a partial header block
  index = ShardIndex::Build(TarSpec({path}));
  ASSERT_FALSE(index.ok());
  EXPECT_THAT(std::string(index.status().message()),
              HasSubstr("at byte offset 3072 (sample 1 of this shard): the file ends inside a "
                        "tar header"));
}

// Overwrites `path` with `bytes` and gives it back the mtime it had.
void RewriteKeepingMtime(const std::string& path, const std::string& bytes) {
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  WriteAll(path, bytes);
  const timeval times[2] = {{st.st_atime, 0}, {st.st_mtime, 0}};
  ASSERT_EQ(::utimes(path.c_str(), times), 0);
}

TEST(ShardIndexTest, AnIndexFileIsReadInsteadOfTheTarHeaders) {
  const std::string path = WriteShard("indexed.tar", 0, 4);
  const absl::StatusOr<ShardIndex> scanned = ShardIndex::Build(TarSpec({path}));
  ASSERT_TRUE(scanned.ok()) << scanned.status();
  ASSERT_TRUE(WriteIndexFile(path, "x.npy", "y.npy").ok());
  EXPECT_EQ(IndexFilePath(path), path + ".idx");
  // Headers no scan could read, same size and mtime: only the index can
  // say where the samples are.
  std::string headless = ReadAll(path);
  for (int64_t at = 0; at < static_cast<int64_t>(headless.size()); at += 1024) {
    headless[at + 148] ^= 0x01;  // every header's checksum (and some data)
  }
  RewriteKeepingMtime(path, headless);
  const absl::StatusOr<ShardIndex> indexed = ShardIndex::Build(TarSpec({path}));
  ASSERT_TRUE(indexed.ok()) << indexed.status();
  ASSERT_EQ(indexed->size(), 4);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(indexed->Locate(i).x.offset, scanned->Locate(i).x.offset);
    EXPECT_EQ(indexed->Locate(i).x.size, scanned->Locate(i).x.size);
    EXPECT_EQ(indexed->Locate(i).y.offset, scanned->Locate(i).y.offset);
    EXPECT_EQ(indexed->Locate(i).y.size, scanned->Locate(i).y.size);
  }
  // Without the index file the same shard is scanned, and is damaged.
  ASSERT_EQ(std::remove(IndexFilePath(path).c_str()), 0);
  EXPECT_FALSE(ShardIndex::Build(TarSpec({path})).ok());
}

TEST(ShardIndexTest, AStaleIndexFileIsIgnoredAndTheShardScanned) {
  const std::string path = WriteShard("stale.tar", 0, 4);
  ASSERT_TRUE(WriteIndexFile(path, "x.npy", "y.npy").ok());
  // Rewritten with 6 samples: another size.
  const std::string six = ReadAll(WriteShard("six.tar", 0, 6));
  RewriteKeepingMtime(path, six);
  absl::StatusOr<ShardIndex> index = ShardIndex::Build(TarSpec({path}));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->size(), 6);
  // The same size, another mtime.
  ASSERT_TRUE(WriteIndexFile(path, "x.npy", "y.npy").ok());
  const timeval later[2] = {{1, 0}, {2, 0}};
  ASSERT_EQ(::utimes(path.c_str(), later), 0);
  std::string shifted = six;
  shifted.replace(0, 3072, six.substr(3072, 3072));  // sample 1's members first, twice
  WriteAll(path, shifted);
  ASSERT_EQ(::utimes(path.c_str(), later), 0);
  index = ShardIndex::Build(TarSpec({path}));
  ASSERT_FALSE(index.ok());  // scanned: sample1 has its members twice
  EXPECT_THAT(std::string(index.status().message()),
              HasSubstr("at byte offset 3072 (sample 0 of this shard): sample \"sample1\" has "
                        "a second x.npy member"));
  // An index written for other members does not apply to this spec.
  WriteAll(path, six);
  ASSERT_TRUE(WriteIndexFile(path, "json", "y.npy").ok());
  index = ShardIndex::Build(TarSpec({path}));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->Locate(5).x.size, 140);  // the .x.npy member, not the .json one
}

TEST(ShardIndexTest, ADamagedIndexFileIsAnErrorNamingIt) {
  const std::string path = WriteShard("badindex.tar", 0, 3);
  ASSERT_TRUE(WriteIndexFile(path, "x.npy", "y.npy").ok());
  const std::string idx = IndexFilePath(path);
  const std::string good = ReadAll(idx);
  WriteAll(idx, good.substr(0, good.size() - 5));
  absl::StatusOr<ShardIndex> index = ShardIndex::Build(TarSpec({path}));
  ASSERT_FALSE(index.ok());
  EXPECT_THAT(std::string(index.status().message()),
              HasSubstr(absl::StrCat("the index file ", idx, " is damaged")));
  std::string outside = good;
  outside[good.size() - 24] = '\x7f';  // the last sample's x_offset, past the end
  outside[good.size() - 20] = '\x7f';
  WriteAll(idx, outside);
  index = ShardIndex::Build(TarSpec({path}));
  ASSERT_FALSE(index.ok());
  EXPECT_THAT(std::string(index.status().message()),
              HasSubstr("(sample 2's record at byte offset 98 lies outside the shard's 10240 "
                        "bytes)"));
  std::string huge = good;  // a sample count whose bytes overflow 64 bits
  const int64_t count = int64_t{1} << 62;
  std::memcpy(huge.data() + 24, &count, sizeof(count));
  WriteAll(idx, huge.substr(0, 40 + 10));  // the header and the members' names, no samples
  EXPECT_THAT(std::string(ShardIndex::Build(TarSpec({path})).status().message()),
              HasSubstr("50 bytes do not hold its 4611686018427387904 samples"));
  WriteAll(idx, "not an index");
  EXPECT_THAT(std::string(ShardIndex::Build(TarSpec({path})).status().message()),
              HasSubstr("no CHORUSI1 header"));
}

TEST(ShardIndexTest, FingerprintsChangeWithAShardsNameCountOrLayoutAndNameTheShard) {
  const std::string a = WriteShard("fp-a.tar", 0, 4);
  const std::string b = WriteShard("fp-b.tar", 4, 3);
  const absl::StatusOr<ShardIndex> index = ShardIndex::Build(TarSpec({a, b}));
  ASSERT_TRUE(index.ok()) << index.status();
  const std::vector<int64_t> saved = index->Fingerprints();
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_NE(saved[0], saved[1]);
  EXPECT_TRUE(CheckFingerprints(*index, saved).ok());
  EXPECT_TRUE(CheckFingerprints(*index, {}).ok()) << "a checkpoint without fingerprints";
  // The same files in another directory: the same fingerprints.
  const std::string moved = absl::StrCat(TempDir(), "/fp-moved");
  ::mkdir(moved.c_str(), 0755);
  WriteAll(moved + "/fp-a.tar", ReadAll(a));
  WriteAll(moved + "/fp-b.tar", ReadAll(b));
  const absl::StatusOr<ShardIndex> there =
      ShardIndex::Build(TarSpec({moved + "/fp-a.tar", moved + "/fp-b.tar"}));
  ASSERT_TRUE(there.ok()) << there.status();
  EXPECT_EQ(there->Fingerprints(), saved);
  // fp-b.tar with another sample: named.
  WriteShard("fp-b.tar", 4, 4);
  const absl::StatusOr<ShardIndex> changed = ShardIndex::Build(TarSpec({a, b}));
  ASSERT_TRUE(changed.ok()) << changed.status();
  absl::Status check = CheckFingerprints(*changed, saved);
  EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(check.message()),
              HasSubstr(absl::StrCat("shard 1 (", b, ", 4 samples) is not the shard")));
  // A shard more, and a shard fewer.
  const std::string c = WriteShard("fp-c.tar", 0, 2);
  WriteShard("fp-b.tar", 4, 3);
  const absl::StatusOr<ShardIndex> more = ShardIndex::Build(TarSpec({a, b, c}));
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_THAT(std::string(CheckFingerprints(*more, saved).message()),
              HasSubstr(absl::StrCat("gives 3 shard files, the checkpoint was trained on 2 (", c,
                                     " is new)")));
  const absl::StatusOr<ShardIndex> fewer = ShardIndex::Build(TarSpec({a}));
  ASSERT_TRUE(fewer.ok()) << fewer.status();
  EXPECT_THAT(std::string(CheckFingerprints(*fewer, saved).message()),
              HasSubstr("its shard 1 and after are missing"));
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
      HasSubstr(absl::StrCat(path,
                             " at byte offset 0 (sample 0 of this shard): sample \"k1\" has no "
                             "y.npy member")));
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
  for (const char* name :
       {"part-2.bin", "part-0.bin", "part-1.bin", "part-1.bin.idx", "other.bin"}) {
    WriteAll(absl::StrCat(dir, "/", name), "");
  }
  v1::ShardedData s;
  s.add_paths(dir + "/part-*");  // not the index file part-1.bin.idx
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
  // A header without its shape is quoted on one line: it ends in a newline.
  std::string no_shape = good;
  no_shape.replace(no_shape.find("'shape'"), 7, "'shapf'");
  const std::string header = no_shape.substr(10, no_shape.size() - 10 - 8);  // 8: the values
  ASSERT_EQ(header.back(), '\n');
  EXPECT_EQ(ParseNpy(no_shape.data(), no_shape.size()).status().message(),
            absl::StrCat(".npy header \"", header.substr(0, header.size() - 1),
                         "\\n\" lacks descr, fortran_order or shape"));
  EXPECT_THAT(header, ::testing::StartsWith("{'descr': '<f4', 'fortran_order': False, 'shapf'"));
}

// --- torch.save files (torch_save_file.h), written here byte by byte.

std::string Le(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}

// A zip archive of `members` (name, data), stored as torch.save stores them.
std::string StoredZip(const std::vector<std::pair<std::string, std::string>>& members) {
  std::string local, directory;
  for (const auto& [name, data] : members) {
    const std::string sizes = Le(0, 4) + Le(data.size(), 4) + Le(data.size(), 4);  // crc unchecked
    directory += Le(0x02014b50, 4) + Le(20, 2) + Le(20, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) +
                 sizes + Le(name.size(), 2) + Le(0, 2) + Le(0, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) +
                 Le(local.size(), 4) + name;
    local += Le(0x04034b50, 4) + Le(20, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) + sizes +
             Le(name.size(), 2) + Le(0, 2) + name + data;
  }
  return local + directory + Le(0x06054b50, 4) + Le(0, 4) + Le(members.size(), 2) +
         Le(members.size(), 2) + Le(directory.size(), 4) + Le(local.size(), 4) + Le(0, 2);
}

std::string PickleString(const std::string& s) { return "X" + Le(s.size(), 4) + s; }

std::string PickleInt(int64_t i) { return "\x8a\x08" + Le(static_cast<uint64_t>(i), 8); }

std::string PickleInts(const std::vector<int64_t>& v) {
  std::string out = "(";
  for (int64_t i : v) out += PickleInt(i);
  return out + "t";
}

// _rebuild_tensor_v2 of storage `key` (FloatStorage of `numel`) as torch.save pickles it.
std::string PickledTensor(const std::string& key, int64_t numel, const std::vector<int64_t>& sizes,
                          const std::vector<int64_t>& strides) {
  return "ctorch._utils\n_rebuild_tensor_v2\n((" + PickleString("storage") +
         "ctorch\nFloatStorage\n" + PickleString(key) + PickleString("cpu") + PickleInt(numel) +
         "tQ" + PickleInt(0) + PickleInts(sizes) + PickleInts(strides) + "\x89" +
         "ccollections\nOrderedDict\n)R" + "tR";
}

absl::StatusOr<std::vector<SavedTensor>> ReadSaved(const std::string& name,
                                                   const std::string& bytes) {
  const std::string path = absl::StrCat(TempDir(), "/", name);
  WriteAll(path, bytes);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  auto saved = ReadTorchSaveDict(fd, path, static_cast<int64_t>(bytes.size()));
  ::close(fd);
  return saved;
}

// Note [Pickle values] in torch_save_file.cc: values nested as deep as the
// pickle is long were freed recursively, past the end of the stack.
TEST(TorchSaveFileTest, AValueNestedDeepIsReadWithoutRecursing) {
  // 150000 levels: within what values may take, far past what a stack holds.
  const std::string pickle = std::string("\x80\x02]") + std::string(150000, '\x85') + ".";
  const std::string path = absl::StrCat(TempDir(), "/deep.pt");
  auto saved = ReadSaved("deep.pt", StoredZip({{"archive/data.pkl", pickle}}));
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(std::string(saved.status().message()), HasSubstr(path + " is not a torch.save"));
  EXPECT_THAT(std::string(saved.status().message()), HasSubstr("it holds no dict"));
}

// Note [Pickle values]: a few bytes of pickle that reuse a long string from
// the memo copied it each time, without bound.
TEST(TorchSaveFileTest, APickleCopyingALongStringManyTimesIsRefused) {
  const std::string long_string(1 << 20, 'k');
  // {KEY: None, KEY: None, ...}: 80 entries of the memo's 1 MiB key.
  std::string entries;
  for (int i = 0; i < 80; ++i) entries += std::string("h\x00h\x01", 4);
  const std::string keys =
      "\x80\x02}(" + PickleString(long_string) + std::string("q\x00Nq\x01", 5) + entries + "u.";
  auto saved = ReadSaved("long_keys.pt", StoredZip({{"archive/data.pkl", keys}}));
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(std::string(saved.status().message()),
              HasSubstr("its dict's entries take more than 64 MiB"));
  // 80 globals named by the memo's 1 MiB string twice each.
  std::string globals = "\x80\x02" + PickleString(long_string) + std::string("q\x00", 2);
  for (int i = 0; i < 80; ++i) globals += std::string("h\x00h\x00\x93", 5);
  globals += "}.";
  saved = ReadSaved("long_globals.pt", StoredZip({{"archive/data.pkl", globals}}));
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(std::string(saved.status().message()), HasSubstr("its values take more than 64 MiB"));
}

TEST(TorchSaveFileTest, ATensorWithANegativeSizeIsNotIndexed) {
  // [4, -2, -3] with C-contiguous strides: 24 elements, rows of (-2) * (-3) = 6.
  const std::string pickle = "\x80\x02}(" + PickleString("x") +
                             PickledTensor("0", 24, {4, -2, -3}, {6, -3, 1}) + PickleString("y") +
                             PickledTensor("1", 4, {4}, {1}) + "u.";
  const std::string path = absl::StrCat(TempDir(), "/negative.pt");
  WriteAll(path, StoredZip({{"archive/data.pkl", pickle},
                            {"archive/data/0", std::string(96, '\0')},
                            {"archive/data/1", std::string(16, '\0')}}));
  v1::ShardedData spec;
  spec.set_format(v1::ShardedData::TENSOR_FILES);
  spec.add_paths(path);
  absl::StatusOr<ShardIndex> index = ShardIndex::Build(spec);
  ASSERT_FALSE(index.ok()) << "indexed with rows of shape ["
                           << absl::StrJoin(index->shards()[0].x_rows.shape, ", ") << "]";
  EXPECT_THAT(std::string(index.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(index.status().message()), HasSubstr("a tensor with a negative size"));
}

}  // namespace
}  // namespace chorus
