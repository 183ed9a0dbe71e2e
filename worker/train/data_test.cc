#include "worker/train/data.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Spec(const std::string& data) {
  auto spec = ParseJobSpec("model { mlp {} } " + data, SpecFormat::kTextProto, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  NormalizeJobSpec(*spec);
  return *spec;
}

TEST(DataTest, FashionMnistFromTheDebianPackage) {
  auto train = LoadDataset(Spec("data { fashion_mnist { train_limit: 500 } }"), Split::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->x.sizes(), (std::vector<int64_t>{500, 1, 28, 28}));
  EXPECT_EQ(train->num_classes, 10);
  EXPECT_EQ(train->y.max().item<int64_t>(), 9);
  // Normalized: roughly zero mean, unit spread.
  EXPECT_NEAR(train->x.mean().item<double>(), 0.0, 0.2);
  auto test = LoadDataset(Spec("data { fashion_mnist { } }"), Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size(), 10000);
}

// Note [Decoded dataset cache]: the first load writes the decoded split,
// the next maps it and gives the same bits; a damaged file is ignored and
// written anew; "off" writes nothing.
TEST(DataTest, DecodedFashionMnistIsCachedAndMappedBitForBit) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/decoded/cache";
  setenv("CHORUS_DATA_CACHE", dir.c_str(), 1);
  EXPECT_EQ(DecodedCacheDir(), dir);
  const v1::JobSpec spec = Spec("data { fashion_mnist { } }");
  auto decoded = LoadDataset(spec, Split::kTest);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->cache_file, "") << "decoded here, then written";
  auto mapped = LoadDataset(spec, Split::kTest);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_THAT(mapped->cache_file, HasSubstr(dir + "/fashion-mnist-t10k-"));
  EXPECT_TRUE(at::equal(mapped->x, decoded->x));
  EXPECT_TRUE(at::equal(mapped->y, decoded->y));
  EXPECT_EQ(mapped->x.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(mapped->num_classes, 10);
  // The mapping is private: a write changes this process's copy only.
  mapped->x.index_put_({0, 0, 0, 0}, 42.0f);
  auto again = LoadDataset(spec, Split::kTest);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(at::equal(again->x, decoded->x));

  // A cut-short file is not used, and is replaced by a whole one.
  const std::string file = mapped->cache_file;
  ASSERT_EQ(truncate(file.c_str(), 1000), 0);
  auto damaged = LoadDataset(spec, Split::kTest);
  ASSERT_TRUE(damaged.ok()) << damaged.status();
  EXPECT_EQ(damaged->cache_file, "");
  EXPECT_TRUE(at::equal(damaged->x, decoded->x));
  auto rewritten = LoadDataset(spec, Split::kTest);
  ASSERT_TRUE(rewritten.ok()) << rewritten.status();
  EXPECT_EQ(rewritten->cache_file, file);

  // train_limit narrows what was mapped.
  auto limited = LoadDataset(Spec("data { fashion_mnist { train_limit: 300 } }"), Split::kTrain);
  ASSERT_TRUE(limited.ok()) << limited.status();
  auto limited_mapped =
      LoadDataset(Spec("data { fashion_mnist { train_limit: 300 } }"), Split::kTrain);
  ASSERT_TRUE(limited_mapped.ok()) << limited_mapped.status();
  EXPECT_NE(limited_mapped->cache_file, "");
  EXPECT_EQ(limited_mapped->size(), 300);
  EXPECT_TRUE(at::equal(limited_mapped->x, limited->x));

  setenv("CHORUS_DATA_CACHE", "off", 1);
  EXPECT_EQ(DecodedCacheDir(), "");
  auto uncached = LoadDataset(spec, Split::kTest);
  ASSERT_TRUE(uncached.ok()) << uncached.status();
  EXPECT_EQ(uncached->cache_file, "");
  unsetenv("CHORUS_DATA_CACHE");
}

TEST(DataTest, MissingAndMalformedFilesNameThePathAndThePackage) {
  auto missing =
      LoadDataset(Spec("data { fashion_mnist { dir: '/nonexistent/fm' } }"), Split::kTrain);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/fm/train-images-idx3-ubyte.gz"));
  EXPECT_THAT(missing.status().message(), HasSubstr("dataset-fashion-mnist"));

  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/bad_fm";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  std::ofstream(dir + "/train-images-idx3-ubyte.gz") << "not an idx file at all";
  auto bad = LoadDataset(Spec("data { fashion_mnist { dir: '" + dir + "' } }"), Split::kTrain);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("bad magic number"));
}

TEST(DataTest, SyntheticIsDeterministicAndLearnable) {
  v1::JobSpec spec =
      Spec("data { synthetic { num_samples: 256 input_shape: [6] num_classes: 3 seed: 9 } }");
  auto a = LoadDataset(spec, Split::kTrain);
  auto b = LoadDataset(spec, Split::kTrain);
  auto test = LoadDataset(spec, Split::kTest);
  ASSERT_TRUE(a.ok() && b.ok() && test.ok());
  EXPECT_TRUE(at::equal(a->x, b->x));
  EXPECT_TRUE(at::equal(a->y, b->y));
  EXPECT_FALSE(at::equal(a->x.narrow(0, 0, test->size()), test->x));
  EXPECT_EQ(a->y.max().item<int64_t>(), 2);
}

TEST(DataTest, SyntheticTokensAreShiftedSequencesFromAFixedChain) {
  auto spec = ParseJobSpec(
      "model { transformer_lm { vocab_size: 16 context_length: 8 } } "
      "data { synthetic { kind: TOKENS num_samples: 64 seed: 3 } }",
      SpecFormat::kTextProto, "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  NormalizeJobSpec(*spec);
  auto d = LoadDataset(*spec, Split::kTrain);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->x.sizes(), (std::vector<int64_t>{64, 8}));
  EXPECT_EQ(d->x.scalar_type(), at::kLong);
  EXPECT_EQ(d->num_classes, 16);
  EXPECT_TRUE(at::equal(d->x.narrow(1, 1, 7), d->y.narrow(1, 0, 7))) << "y is x shifted by one";
  EXPECT_LT(d->y.max().item<int64_t>(), 16);
  EXPECT_GE(d->x.min().item<int64_t>(), 0);
  auto again = LoadDataset(*spec, Split::kTrain);
  EXPECT_TRUE(at::equal(d->x, again->x));
  // Each token has at most four successors.
  at::Tensor pairs = d->x.narrow(1, 0, 7).reshape({-1}) * 16 + d->x.narrow(1, 1, 7).reshape({-1});
  at::Tensor seen = at::zeros({16 * 16}, at::kLong).index_fill_(0, pairs, 1).reshape({16, 16});
  EXPECT_LE(seen.sum(1).max().item<int64_t>(), 4);
}

TEST(DataTest, TensorFileFromPythonTorchSave) {
  v1::JobSpec spec = Spec(
      "data { tensor_file { path: 'worker/train/testdata/tiny_data.pt' "
      "eval_path: 'worker/train/testdata/tiny_eval.pt' } }");
  auto train = LoadDataset(spec, Split::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->x.sizes(), (std::vector<int64_t>{96, 8}));
  EXPECT_EQ(train->x.scalar_type(), at::kFloat);
  EXPECT_EQ(train->y.scalar_type(), at::kLong);
  EXPECT_EQ(train->num_classes, 3);
  auto test = LoadDataset(spec, Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size(), 32);

  v1::JobSpec no_eval = Spec("data { tensor_file { path: 'worker/train/testdata/tiny_data.pt' } }");
  auto none = LoadDataset(no_eval, Split::kTest);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->size(), 0) << "no eval_path means no test split";
}

TEST(DataTest, BadTensorFilesNameTheFieldThePathAndTheExpectedFormat) {
  auto missing =
      LoadDataset(Spec("data { tensor_file { path: '/nonexistent/d.pt' } }"), Split::kTrain);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("data.tensor_file.path: cannot open /nonexistent/d.pt"));

  auto keys = LoadDataset(
      Spec("data { tensor_file { path: 'worker/train/testdata/bad_keys.pt' } }"), Split::kTrain);
  EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(keys.status().message(),
              HasSubstr("has keys [inputs, labels] but needs both 'x' and 'y'"));

  const std::string garbage = std::string(std::getenv("TEST_TMPDIR")) + "/garbage.pt";
  std::ofstream(garbage) << "this is not a zip archive";
  auto bad = LoadDataset(
      Spec("data { tensor_file { path: 'worker/train/testdata/tiny_data.pt' eval_path: '" +
           garbage + "' } }"),
      Split::kTest);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("data.tensor_file.eval_path: " + garbage + " is not a torch.save file"));
}

// An IDX file: magic for uint8, the sizes big-endian, then `data`.
std::string Idx(const std::vector<uint32_t>& sizes, const std::string& data) {
  std::string out = {0, 0, 0x08, static_cast<char>(sizes.size())};
  for (uint32_t s : sizes) {
    for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((s >> shift) & 0xff);
  }
  return out + data;
}

// Found writing //worker/train:idx_fuzzer (its input overflow_dims replays
// it): sizes whose product wraps around 64
// bits matched a file with no data, and the tensor allocation then threw
// (an exception escaping the loader ends the rank).
TEST(DataTest, IdxSizesThatOverflowAreRefused) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/overflow.idx";
  std::ofstream(path, std::ios::binary) << Idx({65536, 65536, 65536, 65536}, "");
  auto t = ReadIdx(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr(path));
  EXPECT_THAT(t.status().message(), HasSubstr("truncated"));

  std::ofstream(path, std::ios::binary) << Idx({2, 3}, "abcdef");
  auto ok = ReadIdx(path);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ok->index({1, 2}).item<uint8_t>(), 'f');

  // Found by //worker/train:idx_fuzzer under UBSan (input zero_dim): an
  // empty tensor's null data pointer went to memcpy.
  std::ofstream(path, std::ios::binary) << Idx({0, 3}, "");
  auto empty = ReadIdx(path);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->sizes(), (std::vector<int64_t>{0, 3}));
}

// Found writing //worker/train:idx_fuzzer (it checks every label is a
// class): a labels file with a value past 9 was
// accepted as Fashion-MNIST; the loss then fails (or reads out of bounds)
// far from the file.
TEST(DataTest, FashionMnistLabelsMustBeClasses) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/labels_fm";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  std::ofstream(dir + "/train-images-idx3-ubyte.gz", std::ios::binary)
      << Idx({2, 2, 2}, std::string(8, 'x'));
  std::ofstream(dir + "/train-labels-idx1-ubyte.gz", std::ios::binary)
      << Idx({2}, std::string{3, 10});
  auto bad = LoadDataset(Spec("data { fashion_mnist { dir: '" + dir + "' } }"), Split::kTrain);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("train-labels-idx1-ubyte.gz"));
  EXPECT_THAT(bad.status().message(), HasSubstr("label 10"));
}

// Found writing //worker/train:tensor_file_fuzzer (it checks labels against
// num_classes): class ids past the int range
// made num_classes wrap to a negative number.
TEST(DataTest, TensorFileClassIdsMustFitTheClassCount) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/big_classes.pt";
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("x", at::zeros({2, 3}));
  dict.insert("y", at::tensor({int64_t{1}, int64_t{1} << 40}, at::kLong));
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  auto bad = LoadDataset(Spec("data { tensor_file { path: '" + path + "' } }"), Split::kTrain);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("class id 1099511627776"));
}

}  // namespace
}  // namespace chorus
