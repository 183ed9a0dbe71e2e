#include "worker/train/dataset_pack.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/train/data.h"
#include "worker/train/shard_reader.h"
#include "worker/train/shard_writer.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

v1::ShardedData Shards(const std::string& glob, int num_classes) {
  v1::ShardedData s;
  s.set_format(v1::ShardedData::TAR);
  s.add_paths(glob);
  s.set_input_member("x.npy");
  s.set_target_member("y.npy");
  s.set_num_classes(num_classes);
  s.set_read_ahead_bytes(1 << 16);
  return s;
}

TEST(DatasetPackTest, ATensorFilePacksIntoShardsThatReadBackAsTheSameSamples) {
  const std::string from = "worker/train/testdata/tiny_data.pt";
  v1::JobSpec spec;
  spec.mutable_data()->mutable_tensor_file()->set_path(from);
  absl::StatusOr<Dataset> original = LoadDataset(spec, Split::kTrain);
  ASSERT_TRUE(original.ok()) << original.status();
  const int64_t n = original->size();
  ASSERT_GT(n, 7);

  absl::StatusOr<PackResult> packed = PackDataset({from, TempPath("tiny"), 7});
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->samples, n);
  EXPECT_EQ(packed->shards, (n + 6) / 7);
  EXPECT_EQ(packed->paths_glob, TempPath("tiny") + "-*.tar");
  for (int64_t s = 0; s < packed->shards; ++s) {  // Note [Index files]: one beside each shard
    const std::string idx = absl::StrFormat("%s-%06d.tar.idx", TempPath("tiny"), s);
    EXPECT_EQ(::access(idx.c_str(), R_OK), 0) << idx;
  }

  auto reader = ShardReader::Open(Shards(packed->paths_glob, original->num_classes), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ((*reader)->index().size(), n);
  std::vector<int64_t> all(n);
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  (*reader)->Start(all, n);
  absl::StatusOr<ShardBatch> batch = (*reader)->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_TRUE(at::equal(batch->x, original->x.to(batch->x.scalar_type())));
  EXPECT_TRUE(at::equal(batch->y, original->y));
}

TEST(DatasetPackTest, AFolderOfNpyPairsPacksInKeyOrderAndAMissingTargetIsNamed) {
  const std::string dir = TempPath("npy_folder");
  ::mkdir(dir.c_str(), 0755);
  for (int k : {2, 0, 1}) {
    const float x[2] = {static_cast<float>(k), 0.5f};
    const int64_t y = k;
    std::ofstream(absl::StrCat(dir, "/k", k, ".x.npy"), std::ios::binary)
        << NpyBytes(ElementType::kFloat32, {2}, x);
    std::ofstream(absl::StrCat(dir, "/k", k, ".y.npy"), std::ios::binary)
        << NpyBytes(ElementType::kInt64, {}, &y);
  }
  absl::StatusOr<PackResult> packed = PackDataset({dir, TempPath("folder"), 2});
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->samples, 3);
  EXPECT_EQ(packed->shards, 2);
  auto reader = ShardReader::Open(Shards(packed->paths_glob, 3), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  (*reader)->Start({0, 1, 2}, 3);
  absl::StatusOr<ShardBatch> batch = (*reader)->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(batch->x[i][0].item<float>(), i) << "sample " << i << " is key k" << i;
    EXPECT_EQ(batch->y[i].item<int64_t>(), i);
  }

  std::ofstream(absl::StrCat(dir, "/k3.x.npy"), std::ios::binary)
      << NpyBytes(ElementType::kFloat32, {2}, std::vector<float>{3, 3}.data());
  packed = PackDataset({dir, TempPath("broken"), 2});
  ASSERT_FALSE(packed.ok());
  EXPECT_THAT(std::string(packed.status().message()),
              HasSubstr(absl::StrCat(dir,
                                     "/k3.y.npy is missing: every KEY.x.npy needs its "
                                     "KEY.y.npy")));
}

}  // namespace
}  // namespace chorus
