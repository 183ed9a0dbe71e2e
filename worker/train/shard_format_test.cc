#include "worker/train/shard_format.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/train/shard_writer.h"
#include "worker/train/tar_members.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

// A batch of `n` samples of `shape`, its sample numbers 0..n-1.
ShardBatch EmptyBatch(const BatchShape& shape, int64_t n) {
  std::vector<int64_t> x = {n}, y = {n};
  x.insert(x.end(), shape.x.begin(), shape.x.end());
  y.insert(y.end(), shape.y.begin(), shape.y.end());
  return ShardBatch{at::arange(n, at::kLong), at::zeros(x, shape.x_type),
                    at::zeros(y, shape.y_type)};
}

// A format opened on `spec`'s files, with the index and files it reads.
struct Opened {
  explicit Opened(ShardIndex built) : index(std::move(built)) {}
  ShardIndex index;
  ReadCounts counts;
  std::unique_ptr<ShardFiles> files;
  std::unique_ptr<ShardFormat> format;
};

std::unique_ptr<Opened> OpenFormat(const v1::ShardedData& spec, const ShardReaderOptions& options) {
  absl::StatusOr<ShardIndex> index = ShardIndex::Build(spec);
  EXPECT_TRUE(index.ok()) << index.status();
  if (!index.ok()) return nullptr;
  auto opened = std::make_unique<Opened>(std::move(*index));
  opened->files = std::make_unique<ShardFiles>(opened->index, opened->counts);
  absl::StatusOr<std::unique_ptr<ShardFormat>> format =
      ShardFormat::Open(opened->index, options, *opened->files);
  EXPECT_TRUE(format.ok()) << format.status();
  if (!format.ok()) return nullptr;
  opened->format = std::move(*format);
  return opened;
}

// Note [Samples in file order]: neighbouring numbers are sorted by
// counting, numbers far apart by comparison; equal numbers keep their order
// either way.
TEST(SortPositionsByIndexTest, GivesTheFileOrderOfAGroup) {
  struct Case {
    std::vector<int64_t> indices;
    std::vector<int64_t> order;
  };
  const std::vector<Case> cases = {
      {{}, {}},
      {{7}, {0}},
      {{5, 3, 5, 4}, {1, 3, 0, 2}},                      // by counting
      {{899, 0, 899, 450, 0, 301}, {1, 4, 5, 3, 0, 2}},  // by comparison
      {{12, 11, 10, 13}, {2, 1, 0, 3}},
  };
  std::vector<int64_t> order, counts;
  for (const Case& c : cases) {
    SortPositionsByIndex(c.indices.data(), static_cast<int64_t>(c.indices.size()), order, counts);
    EXPECT_EQ(order, c.order) << ::testing::PrintToString(c.indices);
  }
}

TEST(TarMembersTest, ASuffixsLastExtensionSaysHowTheMemberIsRead) {
  const std::vector<std::pair<std::string, MemberKind>> inputs = {{"x.npy", MemberKind::kNpy},
                                                                  {"npy", MemberKind::kNpy},
                                                                  {"x.pt", MemberKind::kPt},
                                                                  {"pth", MemberKind::kPt},
                                                                  {"x.cls", MemberKind::kNpy}};
  for (const auto& [suffix, kind] : inputs) EXPECT_EQ(InputMemberKind(suffix), kind) << suffix;
  const std::vector<std::pair<std::string, MemberKind>> targets = {
      {"y.npy", MemberKind::kNpy},
      {"y.pth", MemberKind::kPt},
      {"cls", MemberKind::kTextLabel},
      {"label.txt", MemberKind::kTextLabel},
      {"json", MemberKind::kTextLabel}};
  for (const auto& [suffix, kind] : targets) EXPECT_EQ(TargetMemberKind(suffix), kind) << suffix;
}

// Note [.pt members]: the tensor of torch.save's bytes, described as a .npy
// member would be.
TEST(TarMembersTest, APtMemberIsTheSavedTensor) {
  const at::Tensor saved = at::arange(6, at::kDouble).reshape({2, 3});
  const std::vector<char> bytes = torch::jit::pickle_save(saved);
  absl::StatusOr<PtMember> m = ParsePtMember(bytes.data(), static_cast<int64_t>(bytes.size()));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->array.type, ElementType::kFloat64);
  EXPECT_EQ(m->array.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(m->array.data_offset, 0);
  EXPECT_TRUE(at::equal(m->tensor, saved));
  const std::vector<char> list = torch::jit::pickle_save(c10::IValue(std::vector<int64_t>{1, 2}));
  EXPECT_THAT(std::string(ParsePtMember(list.data(), list.size()).status().message()),
              HasSubstr("not a tensor"));
}

// A token file of 21 tokens 100..120 (uint16), windows of 4 + 1: samples
// 0..4.
v1::ShardedData TokenSpec(const std::string& path) {
  std::vector<uint16_t> tokens(21);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(100 + i);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  v1::ShardedData spec;
  spec.set_format(v1::ShardedData::TOKENS);
  spec.add_paths(path);
  spec.set_token_type(v1::ShardedData::UINT16);
  spec.set_sequence_length(4);
  return spec;
}

TEST(TokenFormatTest, ASampleIsAWindowAndItsShiftByOneToken) {
  auto opened = OpenFormat(TokenSpec(TempPath("window.bin")), {/*float_inputs=*/false});
  ASSERT_NE(opened, nullptr);
  const ShardFormat& format = *opened->format;
  EXPECT_EQ(format.batch_shape().x, (std::vector<int64_t>{4}));
  EXPECT_EQ(format.batch_shape().x_type, at::kLong);
  EXPECT_EQ(format.batch_shape().y_type, at::kLong);
  // Sample 2: tokens 8..12, 2 bytes each, read ahead as one range.
  std::vector<ShardRange> stored;
  format.AppendStoredRanges(opened->index.Locate(2), stored);
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].bytes.offset, 16);
  EXPECT_EQ(stored[0].bytes.size, 10);

  ShardBatch batch = EmptyBatch(format.batch_shape(), 2);
  ASSERT_TRUE(format.ReadSample(*opened->files, 2, opened->index.Locate(2), 1, batch).ok());
  EXPECT_TRUE(at::equal(batch.x[1], at::arange(108, 112, at::kLong)));
  EXPECT_TRUE(at::equal(batch.y[1], at::arange(109, 113, at::kLong)));
  EXPECT_EQ(opened->counts.bytes.load(), 10);
  EXPECT_EQ(opened->counts.reads.load(), 1);
}

TEST(TokenFormatTest, ATokenPastTheVocabularyIsNamedAtItsOwnOffset) {
  const std::string path = TempPath("vocab.bin");
  // Vocabulary 112: sample 2's tokens 108..112 hold one past it, its last
  // (y's last), token 12 of the file.
  auto opened = OpenFormat(TokenSpec(path), {false, /*vocab_size=*/112});
  ASSERT_NE(opened, nullptr);
  ShardBatch batch = EmptyBatch(opened->format->batch_shape(), 1);
  EXPECT_TRUE(
      opened->format->ReadSample(*opened->files, 1, opened->index.Locate(1), 0, batch).ok());
  const absl::Status bad =
      opened->format->ReadSample(*opened->files, 2, opened->index.Locate(2), 0, batch);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), absl::StrCat("data.shards: ", path,
                                        " at byte offset 24 (sample 2): token id 112 is not in [0, "
                                        "model.transformer_lm.vocab_size 112)"));
}

// A torch.save({'x': x, 'y': y}) file.
std::string WriteTensorFile(const std::string& name, const at::Tensor& x, const at::Tensor& y) {
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("x", x);
  dict.insert("y", y);
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
  return path;
}

v1::ShardedData TensorFilesSpec(const std::string& path) {
  v1::ShardedData spec;
  spec.set_format(v1::ShardedData::TENSOR_FILES);
  spec.add_paths(path);
  return spec;
}

TEST(TensorFileFormatTest, ASampleIsItsTwoRowsReadAheadApart) {
  const at::Tensor x = at::arange(15, at::kInt).reshape({5, 3});  // converted to float32
  const at::Tensor y = at::arange(5, at::kLong) % 3;
  auto opened = OpenFormat(TensorFilesSpec(WriteTensorFile("rows.pt", x, y)), {});
  ASSERT_NE(opened, nullptr);
  const ShardFormat& format = *opened->format;
  EXPECT_EQ(format.batch_shape().x_type, at::kFloat);
  EXPECT_EQ(format.batch_shape().y_type, at::kLong);
  const SampleLocation loc = opened->index.Locate(4);
  std::vector<ShardRange> stored;
  format.AppendStoredRanges(loc, stored);
  ASSERT_EQ(stored.size(), 2u);
  EXPECT_EQ(stored[0].bytes.offset, loc.x.offset);
  EXPECT_EQ(stored[0].bytes.size, 3 * 4);
  EXPECT_EQ(stored[1].bytes.offset, loc.y.offset);
  EXPECT_EQ(stored[1].bytes.size, 8);

  ShardBatch batch = EmptyBatch(format.batch_shape(), 1);
  ASSERT_TRUE(format.ReadSample(*opened->files, 4, loc, 0, batch).ok());
  EXPECT_TRUE(at::equal(batch.x[0], x[4].to(at::kFloat)));
  EXPECT_EQ(batch.y[0].item<int64_t>(), 1);
  EXPECT_EQ(opened->counts.reads.load(), 2) << "a read for each row";
}

TEST(TensorFileFormatTest, ClassesAndTokensAreCheckedWithTheirRowsPlace) {
  const at::Tensor x = at::arange(12, at::kLong).reshape({4, 3});
  const at::Tensor y = at::arange(4, at::kLong);
  const std::string path = WriteTensorFile("checked.pt", x, y);
  auto classes = OpenFormat(TensorFilesSpec(path), {true, 0, /*num_classes=*/3});
  ASSERT_NE(classes, nullptr);
  ShardBatch batch = EmptyBatch(classes->format->batch_shape(), 1);
  const SampleLocation loc = classes->index.Locate(3);
  EXPECT_EQ(classes->format->ReadSample(*classes->files, 3, loc, 0, batch).message(),
            absl::StrCat("data.shards: ", path, " at byte offset ", loc.y.offset,
                         " (sample 3): class 3 is outside [0, data.shards.num_classes 3)"));

  // Note [Token samples]: x 9, 10, 11 of sample 3, a vocabulary of 10.
  auto tokens = OpenFormat(TensorFilesSpec(path), {false, /*vocab_size=*/10});
  ASSERT_NE(tokens, nullptr);
  batch = EmptyBatch(tokens->format->batch_shape(), 1);
  batch.indices[0].fill_(3);
  ASSERT_TRUE(tokens->format->ReadSample(*tokens->files, 3, loc, 0, batch).ok());
  EXPECT_EQ(tokens->format->CheckBatch(batch).message(),
            absl::StrCat("data.shards: ", path, " at byte offset ", loc.x.offset + 8,
                         " (sample 3, element 1 of its x row): input token id 10 is not in [0, "
                         "model.transformer_lm.vocab_size 10)"));
}

// A tar of `n` samples KEY.x.npy (`x_type` [4], values k * 10 + j) and
// KEY.y.npy (int64 k).
std::string WriteTar(const std::string& name, int n, ElementType x_type) {
  const std::string path = TempPath(name);
  auto tar = TarWriter::Create(path);
  EXPECT_TRUE(tar.ok()) << tar.status();
  for (int k = 0; k < n; ++k) {
    std::vector<float> f(4);
    std::vector<double> d(4);
    for (int j = 0; j < 4; ++j) f[j] = d[j] = k * 10 + j;
    const int64_t y = k;
    const std::string key = absl::StrCat("s", k);
    const void* x = x_type == ElementType::kFloat32 ? static_cast<const void*>(f.data()) : d.data();
    EXPECT_TRUE((*tar)->Add(key + ".x.npy", NpyBytes(x_type, {4}, x)).ok());
    EXPECT_TRUE((*tar)->Add(key + ".y.npy", NpyBytes(ElementType::kInt64, {}, &y)).ok());
  }
  EXPECT_TRUE((*tar)->Close().ok());
  return path;
}

v1::ShardedData TarSpec(const std::string& path) {
  v1::ShardedData spec;
  spec.set_format(v1::ShardedData::TAR);
  spec.add_paths(path);
  spec.set_input_member("x.npy");
  spec.set_target_member("y.npy");
  return spec;
}

std::vector<Placement> InFileOrder(const ShardIndex& index, int64_t n) {
  std::vector<Placement> order;
  for (int64_t k = 0; k < n; ++k) order.push_back(Placement{k, index.Locate(k)});
  return order;
}

// Note [Grouped reads]: inputs stored as they are trained are read straight
// into their rows, neighbours with one call; converted ones one by one.
TEST(TarFormatTest, NeighboursStoredAsTrainedAreReadAsOneRun) {
  auto opened = OpenFormat(TarSpec(WriteTar("run.tar", 6, ElementType::kFloat32)), {});
  ASSERT_NE(opened, nullptr);
  const ShardFormat& format = *opened->format;
  const std::vector<Placement> order = InFileOrder(opened->index, 6);
  ASSERT_EQ(format.RunEnd(order, 0), 6u);
  ASSERT_EQ(format.RunEnd(order, 4), 6u);
  // Two batches of three: sample k in batch k / 3, row k % 3.
  std::vector<ShardBatch> batches = {EmptyBatch(format.batch_shape(), 3),
                                     EmptyBatch(format.batch_shape(), 3)};
  const std::vector<int64_t> indices = {0, 1, 2, 3, 4, 5};
  std::vector<int64_t> failed;
  ASSERT_TRUE(format.ReadRun(*opened->files, indices.data(), order.data(), 6, 3, batches,
                             [&](int64_t at, absl::Status) { failed.push_back(at); }));
  EXPECT_TRUE(failed.empty());
  EXPECT_EQ(opened->counts.reads.load(), 1);
  for (int64_t k = 0; k < 6; ++k) {
    EXPECT_EQ(batches[k / 3].x[k % 3][3].item<float>(), k * 10 + 3) << "sample " << k;
    EXPECT_EQ(batches[k / 3].y[k % 3].item<int64_t>(), k) << "sample " << k;
  }

  auto converted = OpenFormat(TarSpec(WriteTar("converted.tar", 6, ElementType::kFloat64)), {});
  ASSERT_NE(converted, nullptr);
  EXPECT_EQ(converted->format->RunEnd(InFileOrder(converted->index, 6), 0), 1u);
  ShardBatch one = EmptyBatch(converted->format->batch_shape(), 1);
  ASSERT_TRUE(
      converted->format->ReadSample(*converted->files, 5, converted->index.Locate(5), 0, one).ok());
  EXPECT_EQ(one.x.scalar_type(), at::kFloat);
  EXPECT_EQ(one.x[0][2].item<float>(), 52.0f);
}

TEST(TarFormatTest, AMemberUnlikeTheFirstSamplesNamesItsPlace) {
  const std::string path = WriteTar("unlike.tar", 3, ElementType::kFloat64);
  auto opened = OpenFormat(TarSpec(path), {});
  ASSERT_NE(opened, nullptr);
  // Sample 1 with sample 0's y member as its x: a .npy int64 scalar where
  // every sample's is float64 (4).
  SampleLocation loc = opened->index.Locate(1);
  loc.x = opened->index.Locate(0).y;
  ShardBatch batch = EmptyBatch(opened->format->batch_shape(), 1);
  const absl::Status bad = opened->format->ReadSample(*opened->files, 1, loc, 0, batch);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(),
            absl::StrCat("data.shards: ", path, " at byte offset ", loc.x.offset,
                         " (sample 1, member \"s0.y.npy\"): this member holds int64 of shape (), "
                         "the first sample's float64 of shape (4): its type and shape differ; "
                         "every sample's member must have the same"));
}

TEST(ShardFormatTest, AFormatThatIsNotReadIsAnError) {
  // The index reads an unset format's files as tokens; no format reads them.
  v1::ShardedData spec = TokenSpec(TempPath("unset.bin"));
  spec.clear_format();
  absl::StatusOr<ShardIndex> index = ShardIndex::Build(spec);
  ASSERT_TRUE(index.ok()) << index.status();
  ReadCounts counts;
  ShardFiles files(*index, counts);
  const absl::StatusOr<std::unique_ptr<ShardFormat>> format = ShardFormat::Open(*index, {}, files);
  EXPECT_EQ(format.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(format.status().message(),
            "data.shards.format: must be TAR, TOKENS or TENSOR_FILES, got 0");
}

}  // namespace
}  // namespace chorus
