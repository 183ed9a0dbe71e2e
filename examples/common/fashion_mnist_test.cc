#include "examples/common/fashion_mnist.h"

#include <ATen/ATen.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "chorus/v1/job.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/train/data.h"

namespace examples {
namespace {

using ::testing::HasSubstr;

// A uint8 IDX file of `shape` holding `values`, gzip-compressed.
void WriteIdx(const std::string& path, const std::vector<uint8_t>& shape_bytes,
              const std::vector<uint8_t>& values) {
  std::vector<uint8_t> bytes = {0, 0, 0x08, static_cast<uint8_t>(shape_bytes.size() / 4)};
  bytes.insert(bytes.end(), shape_bytes.begin(), shape_bytes.end());
  bytes.insert(bytes.end(), values.begin(), values.end());
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

class FashionMnistTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ =
        std::string(tmp != nullptr ? tmp : "/tmp") + "/fashion-mnist-" + std::to_string(::getpid());
    ASSERT_EQ(std::system(("mkdir -p " + dir_).c_str()), 0);
    // Three 28x28 images with every pixel value somewhere, and their labels.
    std::vector<uint8_t> pixels(3 * 28 * 28);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7 % 256);
    WriteIdx(dir_ + "/t10k-images-idx3-ubyte.gz", {0, 0, 0, 3, 0, 0, 0, 28, 0, 0, 0, 28}, pixels);
    WriteIdx(dir_ + "/t10k-labels-idx1-ubyte.gz", {0, 0, 0, 3}, {9, 0, 4});
  }
  std::string dir_;
};

TEST_F(FashionMnistTest, ReadsWhatTheBuiltInTrainerReadsBitForBit) {
  absl::StatusOr<FashionMnist> mine = LoadFashionMnist(dir_, Split::kTest);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->size(), 3);
  EXPECT_EQ(mine->x.sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
  EXPECT_EQ(mine->x.scalar_type(), at::kFloat);
  EXPECT_EQ(mine->y.scalar_type(), at::kLong);
  EXPECT_EQ(mine->y[0].item<int64_t>(), 9);
  EXPECT_EQ(mine->y[2].item<int64_t>(), 4);

  ::setenv("CHORUS_DATA_CACHE", "off", 1);
  chorus::v1::JobSpec spec;
  spec.mutable_data()->mutable_fashion_mnist()->set_dir(dir_);
  absl::StatusOr<chorus::Dataset> trainers = chorus::LoadDataset(spec, chorus::Split::kTest);
  ASSERT_TRUE(trainers.ok()) << trainers.status();
  EXPECT_TRUE(mine->x.equal(trainers->x)) << "the same normalized pixels, bit for bit";
  EXPECT_TRUE(mine->y.equal(trainers->y));
}

TEST_F(FashionMnistTest, ErrorsNameTheFile) {
  absl::StatusOr<FashionMnist> missing = LoadFashionMnist(dir_, Split::kTrain);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("train-images-idx3-ubyte.gz"));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("dataset-fashion-mnist"));

  WriteIdx(dir_ + "/t10k-labels-idx1-ubyte.gz", {0, 0, 0, 2}, {1, 2});
  absl::StatusOr<FashionMnist> unmatched = LoadFashionMnist(dir_, Split::kTest);
  EXPECT_EQ(unmatched.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unmatched.status().message()), HasSubstr("3 images but"));

  WriteIdx(dir_ + "/t10k-labels-idx1-ubyte.gz", {0, 0, 0, 5}, {1, 2});
  absl::StatusOr<FashionMnist> truncated = LoadFashionMnist(dir_, Split::kTest);
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(truncated.status().message()),
              HasSubstr("t10k-labels-idx1-ubyte.gz holds 2 values where its header says 5"));
}

}  // namespace
}  // namespace examples
