#include "worker/train/checkpoint.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

Snapshot SmallSnapshot() {
  torch::manual_seed(7);
  Snapshot s;
  s.position.step = 12;
  s.model = {{"fc.weight", torch::randn({300, 200})}, {"fc.bias", torch::randn({300})}};
  s.train_state = {{"optim.0.momentum_buffer", torch::randn({300, 200})},
                   {"meta.step", torch::tensor({int64_t{12}}, torch::kLong)}};
  return s;
}

std::string PickleSave(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t);
  std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  return std::string(bytes.begin(), bytes.end());
}

TEST(CheckpointFilesTest, StreamedFilesAreExactlyWhatPickleSaveWrites) {
  const Snapshot snapshot = SmallSnapshot();
  std::vector<CheckpointFileSource> files = StreamFiles(snapshot);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].name, kModelFile);
  EXPECT_EQ(files[1].name, kTrainStateFile);
  absl::StatusOr<CheckpointFileData> model = ReadAll(files[0]);
  absl::StatusOr<CheckpointFileData> state = ReadAll(files[1]);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(model->bytes, PickleSave(snapshot.model));
  EXPECT_EQ(state->bytes, PickleSave(snapshot.train_state));
  // A rank's own files of a per-rank checkpoint carry its number.
  Snapshot other = SmallSnapshot();
  other.rank = 3;
  EXPECT_EQ(StreamFiles(other)[0].name, "model.rank3.pt");
  EXPECT_EQ(StreamFiles(other)[1].name, "train_state.rank3.pt");
}

TEST(CheckpointFilesTest, AConsumerErrorStopsTheFileAndTheSourceCanBeWrittenAgain) {
  const Snapshot snapshot = SmallSnapshot();
  const CheckpointFileSource source = StreamFiles(snapshot)[0];
  int64_t seen = 0;
  int calls = 0;
  absl::Status s = source.write([&](absl::string_view piece) {
    seen += static_cast<int64_t>(piece.size());
    return ++calls == 2 ? absl::ResourceExhaustedError("disk full") : absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("disk full"));
  EXPECT_EQ(calls, 2) << "nothing may be handed out after the consumer failed";
  absl::StatusOr<CheckpointFileData> whole = ReadAll(source);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->bytes, PickleSave(snapshot.model));
  EXPECT_LT(seen, static_cast<int64_t>(whole->bytes.size()));
}

// Stores every file, sleeping in the byte consumer, so the writer's split of
// the time between serializing and storing can be checked.
class SlowSink : public CheckpointSink {
 public:
  absl::Status Store(int64_t step, const std::vector<CheckpointFileSource>& files) override {
    for (const CheckpointFileSource& f : files) {
      bool slept = false;
      absl::Status s = f.write([&](absl::string_view piece) {
        bytes += static_cast<int64_t>(piece.size());
        if (!slept) std::this_thread::sleep_for(std::chrono::milliseconds(150));
        slept = true;
        return absl::OkStatus();
      });
      if (!s.ok()) return s;
    }
    steps.push_back(step);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<CheckpointFileData>> Load(const v1::CheckpointManifest&) override {
    return absl::UnimplementedError("not used");
  }
  int64_t bytes = 0;
  std::vector<int64_t> steps;
};

TEST(CheckpointWriterTest, ReportsSizeAndSplitsTimeBetweenSerializingAndStoring) {
  SlowSink sink;
  {
    CheckpointWriter writer(sink);
    ASSERT_TRUE(writer.Offer(SmallSnapshot()));
    EXPECT_FALSE(writer.Offer(SmallSnapshot())) << "a second checkpoint while one is in flight is dropped";
    ASSERT_TRUE(writer.Drain().ok());
    EXPECT_EQ(writer.stored(), 1);
    EXPECT_EQ(writer.skipped(), 1);
    EXPECT_EQ(writer.last_bytes(), sink.bytes);
    EXPECT_EQ(writer.last_bytes(), static_cast<int64_t>(PickleSave(SmallSnapshot().model).size() +
                                                        PickleSave(SmallSnapshot().train_state).size()));
    // 2 x 150 ms were spent in the sink's consumer: storing, not serializing.
    EXPECT_GE(writer.last_store_seconds(), 0.29);
    EXPECT_LT(writer.last_store_seconds(), 5.0);
    EXPECT_GE(writer.last_serialize_seconds(), 0.0);
    EXPECT_LT(writer.last_serialize_seconds(), 0.25);
  }
  EXPECT_EQ(sink.steps, std::vector<int64_t>{12});
}

}  // namespace
}  // namespace chorus
