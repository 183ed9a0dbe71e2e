#include "worker/train/data.h"

#include <cstdlib>
#include <fstream>

#include <ATen/ATen.h>

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

TEST(DataTest, MissingAndMalformedFilesNameThePathAndThePackage) {
  auto missing = LoadDataset(Spec("data { fashion_mnist { dir: '/nonexistent/fm' } }"), Split::kTrain);
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
  v1::JobSpec spec = Spec("data { synthetic { num_samples: 256 input_shape: [6] num_classes: 3 seed: 9 } }");
  auto a = LoadDataset(spec, Split::kTrain);
  auto b = LoadDataset(spec, Split::kTrain);
  auto test = LoadDataset(spec, Split::kTest);
  ASSERT_TRUE(a.ok() && b.ok() && test.ok());
  EXPECT_TRUE(at::equal(a->x, b->x));
  EXPECT_TRUE(at::equal(a->y, b->y));
  EXPECT_FALSE(at::equal(a->x.narrow(0, 0, test->size()), test->x));
  EXPECT_EQ(a->y.max().item<int64_t>(), 2);
}

}  // namespace
}  // namespace chorus
