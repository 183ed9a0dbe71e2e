// The trainer across the generations of an elastic job, its ranks as
// threads of this process: a generation in which no member holds training
// state starts from the job's starting point (Note [Starting over] in
// trainer.cc).
#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"
#include "worker/train/data.h"
#include "worker/train/memory_sink.h"
#include "worker/train/model.h"
#include "worker/train/sample_trace.h"
#include "worker/train/trainer.h"

namespace chorus {
namespace {

constexpr int kRanks = 3;

// 480 samples, 3 ranks x 8 a step: 20 steps an epoch, 40 in all.
v1::JobSpec Spec() {
  auto spec = ParseJobSpec(R"pb(
                             model { mlp { hidden_sizes: [ 16 ] } }
                             data {
                               synthetic {
                                 num_samples: 480
                                 input_shape: [ 8 ]
                                 num_classes: 3
                                 seed: 4
                               }
                             }
                             training { batch_size_per_rank: 8 epochs: 2 seed: 7 }
                             optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
                             checkpoint { every_steps: 10 keep_last: 0 }
                             resources { min_ranks: 3 max_ranks: 3 }
                             elastic {}
                           )pb",
                           SpecFormat::kTextProto, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  NormalizeJobSpec(*spec);
  EXPECT_TRUE(CheckJobSpec(*spec, "test").ok());
  return *spec;
}

// Shared memory for every all-reduce, never timed against TCP: sums add up
// in the same order in every run and generation, so parameters compare bit
// for bit.
GlooOptions Options(int rank) {
  GlooOptions options;
  options.rank = rank;
  options.size = kRanks;
  options.measure_transport = false;
  options.connect_timeout = absl::Seconds(30);
  return options;
}

std::string TraceDir(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::filesystem::create_directories(dir);
  return dir;
}

// The "state" and "final" lines of the sample trace in `dir` (one file: the
// ranks are threads of one process), split into fields.
std::vector<std::vector<std::string>> TraceLines(const std::string& dir, const std::string& kind) {
  std::vector<std::vector<std::string>> out;
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(file.path());
    for (std::string line; std::getline(in, line);) {
      std::vector<std::string> fields = absl::StrSplit(line, ' ');
      if (fields[0] == kind) out.push_back(std::move(fields));
    }
  }
  return out;
}

// An undisturbed run of the spec.
std::vector<absl::StatusOr<v1::Metrics>> TrainUndisturbed(const v1::JobSpec& spec,
                                                          MemorySink& sink,
                                                          const std::string& trace_dir) {
  MemoryStore store;
  std::vector<absl::StatusOr<v1::Metrics>> results(kRanks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto comm = CreateGlooCommunicator(Options(r), store);
      ASSERT_TRUE(comm.ok()) << comm.status();
      TrainOptions options;
      options.checkpoints = &sink;
      options.sample_trace_dir = trace_dir;
      results[r] = Train(spec, **comm, [](const v1::Metrics&) {}, nullptr, options);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// Rank 2 is lost before any rank trained a step: ranks 0 and 1 hear of
// generation 2 while they are still setting up (their first collective,
// the strategy's parameter broadcast, fails) and join it holding nothing,
// with rank 2's newcomer. The coordinator names `resume` for generation 2.
std::vector<absl::StatusOr<v1::Metrics>> LoseARankBeforeAnyStep(
    const v1::JobSpec& spec, MemorySink& sink, const v1::CheckpointManifest& resume,
    const std::string& trace_dir, std::vector<absl::Status>& failures) {
  MemoryStore first, second;
  std::vector<absl::StatusOr<v1::Metrics>> results(kRanks, absl::UnknownError("not run"));
  std::vector<std::shared_ptr<Communicator>> joined(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto lost = CreateGlooCommunicator(Options(r), first);
      ASSERT_TRUE(lost.ok()) << lost.status();
      (*lost)->Abort("generation 2 formed: rank 2 was lost");
      TrainOptions options;
      options.checkpoints = &sink;
      options.sample_trace_dir = trace_dir;
      options.rejoin = [&, r](const absl::Status& failure) -> absl::StatusOr<Generation> {
        failures[r] = failure;
        if (joined[r] != nullptr) return absl::AbortedError("only generation 2 forms");
        auto comm = CreateGlooCommunicator(Options(r), second);
        if (!comm.ok()) return comm.status();
        joined[r] = *comm;
        return Generation{joined[r].get(), &sink, 2, resume};
      };
      if (r != 2) {
        results[r] = Train(spec, **lost, [](const v1::Metrics&) {}, nullptr, options);
        return;
      }
      // Its newcomer, started for generation 2.
      auto comm = CreateGlooCommunicator(Options(r), second);
      ASSERT_TRUE(comm.ok()) << comm.status();
      joined[r] = *comm;
      options.generation = 2;
      options.resume = resume;
      results[r] = Train(spec, *joined[r], [](const v1::Metrics&) {}, nullptr, options);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

uint32_t SeededModelFingerprint(const v1::JobSpec& spec) {
  absl::StatusOr<Dataset> train = LoadDataset(spec, Split::kTrain);
  EXPECT_TRUE(train.ok()) << train.status();
  absl::StatusOr<std::unique_ptr<Model>> built;
  WithSeed(spec.training().seed(), [&] { built = Model::Build(spec.model(), *train); });
  EXPECT_TRUE(built.ok()) << built.status();
  return SampleTrace::Fingerprint(**built);
}

void ExpectSameModels(MemorySink& a, MemorySink& b, int64_t step) {
  const std::map<std::string, at::Tensor> x = a.Model(step);
  const std::map<std::string, at::Tensor> y = b.Model(step);
  ASSERT_EQ(x.size(), y.size()) << "step " << step;
  for (const auto& [name, tensor] : x) {
    EXPECT_TRUE(at::equal(tensor, y.at(name))) << name << " differs at step " << step;
  }
}

// The trace of a run that started generation 2 over at `step`: every member
// started from the same model, and all end with `final_crc`. Returns the
// model's fingerprint.
std::string ExpectStartedOverTogether(const std::string& trace_dir, int64_t step,
                                      const std::string& final_crc) {
  const std::vector<std::vector<std::string>> states = TraceLines(trace_dir, "state");
  EXPECT_EQ(states.size(), static_cast<size_t>(kRanks));
  std::string model;
  for (const std::vector<std::string>& s : states) {
    // state GENERATION RANK source SOURCE step STEP had HELD model CRC
    EXPECT_EQ(s.size(), 11u);
    if (s.size() != 11u) continue;
    EXPECT_EQ(s[1], "2");
    EXPECT_EQ(s[4], "-1") << "rank " << s[2] << " received nobody's state";
    EXPECT_EQ(s[6], absl::StrCat(step)) << "rank " << s[2];
    EXPECT_EQ(s[8], "-1") << "rank " << s[2] << " held nothing";
    if (model.empty()) model = s[10];
    EXPECT_EQ(s[10], model) << "rank " << s[2] << " starts from another model";
  }
  const std::vector<std::vector<std::string>> finals = TraceLines(trace_dir, "final");
  EXPECT_EQ(finals.size(), static_cast<size_t>(kRanks));
  for (const std::vector<std::string>& f : finals) {
    EXPECT_EQ(f.size(), 5u);
    if (f.size() != 5u) continue;
    EXPECT_EQ(f[1], "2");
    EXPECT_EQ(f[3], "40");
    EXPECT_EQ(f[4], final_crc) << "rank " << f[2] << "'s final parameters";
  }
  return model;
}

TEST(TrainerElasticTest, AGenerationThatHoldsNothingStartsFromTheSeededModelAsAnUndisturbedRun) {
  const v1::JobSpec spec = Spec();
  MemorySink reference;
  const std::string reference_trace = TraceDir("seeded_reference");
  auto undisturbed = TrainUndisturbed(spec, reference, reference_trace);
  for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(undisturbed[r].ok()) << undisturbed[r].status();
  ASSERT_EQ(TraceLines(reference_trace, "final").size(), static_cast<size_t>(kRanks));
  const std::string final_crc = TraceLines(reference_trace, "final")[0][4];

  MemorySink sink;
  const std::string trace = TraceDir("seeded");
  std::vector<absl::Status> failures(kRanks);
  auto results = LoseARankBeforeAnyStep(spec, sink, v1::CheckpointManifest(), trace, failures);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(results[r]->step(), 40);
    EXPECT_EQ(results[r]->eval_loss(), undisturbed[r]->eval_loss()) << "rank " << r;
  }
  for (int r : {0, 1}) EXPECT_FALSE(failures[r].ok()) << "rank " << r << " joined generation 2";
  EXPECT_TRUE(failures[2].ok()) << "the newcomer never left generation 2: " << failures[2];
  const std::string started = ExpectStartedOverTogether(trace, 0, final_crc);
  EXPECT_EQ(started, absl::StrFormat("%08x", SeededModelFingerprint(spec)))
      << "generation 2 starts from the model the seed builds";
  EXPECT_EQ(sink.Steps(), (std::vector<int64_t>{10, 20, 30, 40}));
  for (int64_t step : {10, 40}) ExpectSameModels(reference, sink, step);
}

TEST(TrainerElasticTest, AGenerationThatHoldsNothingStartsFromTheCheckpointItIsGiven) {
  const v1::JobSpec spec = Spec();
  MemorySink reference;
  const std::string reference_trace = TraceDir("checkpoint_reference");
  auto undisturbed = TrainUndisturbed(spec, reference, reference_trace);
  for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(undisturbed[r].ok()) << undisturbed[r].status();
  ASSERT_EQ(reference.Steps(), (std::vector<int64_t>{10, 20, 30, 40}));
  const std::string final_crc = TraceLines(reference_trace, "final")[0][4];

  // The job's newest committed checkpoint when generation 2 formed: step 20
  // (the first generation of these processes had none to start from).
  MemorySink sink;
  ASSERT_TRUE(sink.Put(20, *reference.Load(At(20))).ok());
  const std::string trace = TraceDir("checkpoint");
  std::vector<absl::Status> failures(kRanks);
  auto results = LoseARankBeforeAnyStep(spec, sink, At(20), trace, failures);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(results[r]->step(), 40);
    EXPECT_EQ(results[r]->eval_loss(), undisturbed[r]->eval_loss()) << "rank " << r;
  }
  const std::string started = ExpectStartedOverTogether(trace, 20, final_crc);
  EXPECT_NE(started, absl::StrFormat("%08x", SeededModelFingerprint(spec)))
      << "the checkpoint's model, not the seed's";
  EXPECT_EQ(sink.Steps(), (std::vector<int64_t>{20, 30, 40}));
  for (int64_t step : {30, 40}) ExpectSameModels(reference, sink, step);
}

}  // namespace
}  // namespace chorus
