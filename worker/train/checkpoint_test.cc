#include "worker/train/checkpoint.h"

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
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
class SlowSink : public CheckpointStorage {
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

// A linear layer and a buffer, enough for TakeSnapshot.
class TinyModel : public Model {
 public:
  TinyModel() {
    torch::manual_seed(3);
    weight_ = torch::randn({300, 200}).requires_grad_();
    bias_ = torch::randn({300}).requires_grad_();
    count_ = torch::zeros({4});
  }
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& input) override {
    return torch::addmm(bias_, input, weight_.t());
  }
  std::vector<NamedTensor> NamedParameters() override {
    return {{"fc.weight", weight_}, {"fc.bias", bias_}};
  }
  std::vector<NamedTensor> NamedBuffers() override { return {{"count", count_}}; }
  void SetTraining(bool) override {}

 private:
  at::Tensor weight_, bias_, count_;
};

TEST(SnapshotTest, TheFirstSnapshotIsCopiedIntoMemoryAllocatedBeforehand) {
  TinyModel model;
  torch::optim::SGD sgd(model.Parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  (*model.Forward(torch::randn({8, 200}))).sum().backward();
  sgd.step();  // the momentum buffers exist from here on
  const std::vector<torch::optim::Optimizer*> optimizers = {&sgd};

  const Snapshot layout = SnapshotLayout(model, optimizers);
  std::vector<std::string> names;
  for (const auto& [name, t] : layout.model) {
    EXPECT_TRUE(t.device().is_meta()) << name;
    names.push_back(name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"fc.weight", "fc.bias", "count"}));
  const Snapshot spare = AllocateLike(layout);
  ASSERT_EQ(spare.model.size(), 3u);
  ASSERT_EQ(spare.train_state.size(), 2u)
      << "the two momentum buffers; step counters are not set aside";
  EXPECT_EQ(spare.train_state[0].first, "optim.0.momentum_buffer");
  EXPECT_EQ(spare.train_state[0].second.sizes(), (std::vector<int64_t>{300, 200}));
  EXPECT_TRUE(spare.train_state[0].second.device().is_cpu());
  EXPECT_EQ(spare.train_state[0].second.abs().sum().item<float>(), 0.0f);

  TrainingPosition position;
  position.step = 1;
  const Snapshot snapshot = TakeSnapshot(model, optimizers, position, &spare);
  std::vector<at::Tensor> live;  // parameters, then buffers, as the snapshot lists them
  for (const NamedTensor& p : model.NamedParameters()) live.push_back(p.tensor.detach());
  for (const NamedTensor& b : model.NamedBuffers()) live.push_back(b.tensor);
  ASSERT_EQ(snapshot.model.size(), live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    EXPECT_EQ(snapshot.model[i].second.data_ptr(), spare.model[i].second.data_ptr())
        << snapshot.model[i].first;
    EXPECT_TRUE(torch::equal(snapshot.model[i].second, live[i])) << snapshot.model[i].first;
  }
  const std::string weight_key = c10::guts::to_string(model.Parameters()[0].unsafeGetTensorImpl());
  const at::Tensor& momentum =
      static_cast<torch::optim::SGDParamState&>(*sgd.state().at(weight_key)).momentum_buffer();
  EXPECT_EQ(snapshot.train_state[0].second.data_ptr(), spare.train_state[0].second.data_ptr());
  EXPECT_TRUE(torch::equal(snapshot.train_state[0].second, momentum));
}

TEST(CheckpointWriterTest, ReportsSizeAndSplitsTimeBetweenSerializingAndStoring) {
  SlowSink sink;
  {
    CheckpointWriter writer(sink);
    ASSERT_TRUE(writer.Offer(SmallSnapshot()));
    EXPECT_FALSE(writer.Offer(SmallSnapshot()))
        << "a second checkpoint while one is in flight is dropped";
    ASSERT_TRUE(writer.Drain().ok());
    EXPECT_EQ(writer.stored(), 1);
    EXPECT_EQ(writer.skipped(), 1);
    EXPECT_EQ(writer.last_bytes(), sink.bytes);
    EXPECT_EQ(writer.last_bytes(),
              static_cast<int64_t>(PickleSave(SmallSnapshot().model).size() +
                                   PickleSave(SmallSnapshot().train_state).size()));
    // 2 x 150 ms were spent in the sink's consumer: storing, not serializing.
    EXPECT_GE(writer.last_store_seconds(), 0.29);
    EXPECT_LT(writer.last_store_seconds(), 5.0);
    EXPECT_GE(writer.last_serialize_seconds(), 0.0);
    EXPECT_LT(writer.last_serialize_seconds(), 0.25);
  }
  EXPECT_EQ(sink.steps, std::vector<int64_t>{12});
}

// A coordinator that is away (restarting) until `down_until` on the fake
// clock: every Store before then fails as a cut upload does; after it,
// stores succeed. `refusal`, when set, is answered instead of storing.
class RestartingCoordinator : public CheckpointStorage {
 public:
  RestartingCoordinator(FakeClock& clock, absl::Time down_until)
      : clock_(clock), down_until_(down_until) {}
  absl::Status Store(int64_t step, const std::vector<CheckpointFileSource>& files) override {
    absl::MutexLock lock(&mu_);
    ++attempts_;
    if (!refusal_.ok()) return refusal_;
    for (const CheckpointFileSource& f : files) {
      absl::StatusOr<CheckpointFileData> data = ReadAll(f);
      if (!data.ok()) return data.status();
    }
    if (clock_.Now() < down_until_) {
      return absl::UnavailableError(
          absl::StrCat("uploading checkpoint step ", step, ": Socket closed"));
    }
    steps_.push_back(step);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<CheckpointFileData>> Load(const v1::CheckpointManifest&) override {
    return absl::UnimplementedError("not used");
  }
  void Refuse(absl::Status refusal) {
    absl::MutexLock lock(&mu_);
    refusal_ = std::move(refusal);
  }
  std::vector<int64_t> steps() {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  int attempts() {
    absl::MutexLock lock(&mu_);
    return attempts_;
  }

 private:
  FakeClock& clock_;
  const absl::Time down_until_;
  absl::Mutex mu_;
  absl::Status refusal_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> steps_ ABSL_GUARDED_BY(mu_);
  int attempts_ ABSL_GUARDED_BY(mu_) = 0;
};

Snapshot SnapshotAt(int64_t step) {
  Snapshot s = SmallSnapshot();
  s.position.step = step;
  return s;
}

CheckpointWriterOptions WithBounds(FakeClock& clock, absl::Duration periodic,
                                   absl::Duration final) {
  CheckpointWriterOptions options;
  options.periodic_give_up_after = periodic;
  options.final_give_up_after = final;
  options.clock = &clock;
  return options;
}

// The case: the coordinator restarts while a periodic checkpoint is
// being uploaded, and is back a few seconds later.
TEST(CheckpointWriterTest, APeriodicCheckpointIsRetriedUntilTheCoordinatorIsBack) {
  FakeClock clock;
  RestartingCoordinator coordinator(clock, clock.Now() + absl::Seconds(3));
  CheckpointWriter writer(coordinator, WithBounds(clock, absl::Minutes(1), absl::Minutes(1)));
  ASSERT_TRUE(writer.Offer(SnapshotAt(1000)));
  absl::Status s = writer.Drain();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(coordinator.steps(), std::vector<int64_t>{1000});
  EXPECT_EQ(writer.stored(), 1);
  EXPECT_EQ(writer.skipped_unreachable(), 0);
  EXPECT_GT(writer.store_retries(), 0);
  EXPECT_EQ(writer.store_retries(), coordinator.attempts() - 1);
}

TEST(CheckpointWriterTest, APeriodicCheckpointIsSkippedWhenTheCoordinatorStaysAway) {
  FakeClock clock;
  RestartingCoordinator coordinator(clock, clock.Now() + absl::Minutes(5));
  CheckpointWriter writer(coordinator, WithBounds(clock, absl::Seconds(10), absl::Minutes(10)));
  ASSERT_TRUE(writer.Offer(SnapshotAt(20)));
  absl::Status s = writer.Drain();
  EXPECT_TRUE(s.ok()) << "a skipped periodic checkpoint must not fail training: " << s;
  EXPECT_EQ(writer.skipped_unreachable(), 1);
  EXPECT_EQ(writer.stored(), 0);
  EXPECT_TRUE(coordinator.steps().empty());
  // The writer takes the next one; the final one waits for the coordinator
  // (back at 5 min, within its 10 min) and is stored.
  ASSERT_TRUE(writer.Offer(SnapshotAt(40), /*final=*/true));
  s = writer.Drain();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(coordinator.steps(), std::vector<int64_t>{40});
  EXPECT_EQ(writer.stored(), 1);
  EXPECT_EQ(writer.skipped_unreachable(), 1);
}

TEST(CheckpointWriterTest, TheFinalCheckpointFailsWhenTheCoordinatorNeverComesBack) {
  FakeClock clock;
  RestartingCoordinator coordinator(clock, absl::InfiniteFuture());
  CheckpointWriter writer(coordinator, WithBounds(clock, absl::Seconds(10), absl::Minutes(1)));
  ASSERT_TRUE(writer.Offer(SnapshotAt(90), /*final=*/true));
  absl::Status s = writer.Drain();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("uploading checkpoint step 90: Socket closed"));
  EXPECT_THAT(s.message(), HasSubstr("could not be reached for 1m"));
  EXPECT_EQ(writer.skipped_unreachable(), 0);
}

// Note [A final checkpoint already committed]: a generation formed after the
// last step stores the final checkpoint an earlier one committed.
TEST(CheckpointWriterTest, AFinalCheckpointAlreadyCommittedIsNotAnError) {
  FakeClock clock;
  RestartingCoordinator coordinator(clock, clock.Now());
  coordinator.Refuse(
      absl::AlreadyExistsError("checkpoint job-000001 step 512 is already committed"));
  CheckpointWriter writer(coordinator, WithBounds(clock, absl::Minutes(1), absl::Minutes(1)));
  ASSERT_TRUE(writer.Offer(SnapshotAt(512), /*final=*/true));
  absl::Status s = writer.Drain();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(coordinator.attempts(), 1);
  EXPECT_EQ(writer.stored(), 0) << "it stored nothing itself";
}

// A periodic one is another matter: no generation stores a step twice.
TEST(CheckpointWriterTest, APeriodicCheckpointAlreadyCommittedFailsTheRun) {
  FakeClock clock;
  RestartingCoordinator coordinator(clock, clock.Now());
  coordinator.Refuse(
      absl::AlreadyExistsError("checkpoint job-000001 step 20 is already committed"));
  CheckpointWriter writer(coordinator, WithBounds(clock, absl::Minutes(1), absl::Minutes(1)));
  ASSERT_TRUE(writer.Offer(SnapshotAt(20)));
  absl::Status s = writer.Drain();
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
}

TEST(CheckpointWriterTest, APermanentErrorStillFailsTheRun) {
  FakeClock clock;
  RestartingCoordinator coordinator(clock, clock.Now());
  coordinator.Refuse(absl::FailedPreconditionError(
      "checkpoint upload from generation 1 of job-000001, whose current generation is 2"));
  CheckpointWriter writer(coordinator, WithBounds(clock, absl::Minutes(1), absl::Minutes(1)));
  ASSERT_TRUE(writer.Offer(SnapshotAt(20)));
  absl::Status s = writer.Drain();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(coordinator.attempts(), 1);
  EXPECT_EQ(writer.skipped_unreachable(), 0);
}

}  // namespace
}  // namespace chorus
