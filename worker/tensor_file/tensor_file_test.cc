#include "worker/tensor_file/tensor_file.h"

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

std::vector<std::pair<std::string, at::Tensor>> SomeTensors() {
  torch::manual_seed(5);
  return {{"fc.weight", torch::randn({30, 20})},
          {"fc.bias", torch::randn({30}, torch::kDouble)},
          {"meta.step", torch::tensor({int64_t{7}}, torch::kLong)}};
}

std::string PickleSave(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t);
  std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  return std::string(bytes.begin(), bytes.end());
}

TEST(TensorFileTest, WritesExactlyWhatPickleSaveWritesAndReadsItBack) {
  const auto tensors = SomeTensors();
  const CheckpointFileSource source = TensorFileSource("model.pt", tensors);
  EXPECT_EQ(source.name, "model.pt");
  absl::StatusOr<CheckpointFileData> file = ReadAll(source);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->bytes, PickleSave(tensors));
  absl::StatusOr<CheckpointFileData> again = ReadAll(source);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->bytes, file->bytes) << "every write produces the same bytes";

  absl::StatusOr<std::map<std::string, at::Tensor>> read = ReadTensorFile(*file);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_EQ(read->count(name), 1u) << name;
    EXPECT_EQ(read->at(name).scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(read->at(name).equal(t)) << name;
  }
}

TEST(TensorFileTest, DamagedOrForeignFilesAreDataLossNamingTheFile) {
  absl::StatusOr<std::map<std::string, at::Tensor>> garbage =
      ReadTensorFile({"train_state.pt", "not a zip archive"});
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(garbage.status().message()), HasSubstr("train_state.pt"));

  std::vector<char> list = torch::jit::pickle_save(c10::IValue(c10::List<int64_t>({1, 2})));
  absl::StatusOr<std::map<std::string, at::Tensor>> not_dict =
      ReadTensorFile({"model.pt", std::string(list.begin(), list.end())});
  EXPECT_EQ(not_dict.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(not_dict.status().message()), HasSubstr("not a dict of tensors"));

  c10::Dict<std::string, int64_t> numbers;
  numbers.insert("meta.step", 3);
  std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(numbers));
  absl::StatusOr<std::map<std::string, at::Tensor>> not_tensors =
      ReadTensorFile({"model.pt", std::string(bytes.begin(), bytes.end())});
  EXPECT_EQ(not_tensors.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(not_tensors.status().message()), HasSubstr("non-tensor entry"));
}

TEST(TensorFileTest, AConsumerErrorStopsTheFile) {
  const auto tensors = SomeTensors();
  const CheckpointFileSource source = TensorFileSource("model.pt", tensors);
  int calls = 0;
  absl::Status s = source.write([&](absl::string_view) {
    return ++calls == 1 ? absl::ResourceExhaustedError("disk full") : absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(calls, 1) << "nothing may be handed out after the consumer failed";
}

}  // namespace
}  // namespace chorus
