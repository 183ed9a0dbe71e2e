#include "worker/train/trainer.h"

#include <thread>
#include <vector>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Spec(const std::string& text) {
  auto spec = ParseJobSpec(text, SpecFormat::kTextProto, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  NormalizeJobSpec(*spec);
  EXPECT_TRUE(CheckJobSpec(*spec, "test").ok());
  return *spec;
}

std::vector<absl::StatusOr<v1::Metrics>> TrainOnRanks(const v1::JobSpec& spec, int n,
                                                     std::vector<int>* reports = nullptr) {
  MemoryStore store;
  std::vector<absl::StatusOr<v1::Metrics>> results(n, absl::UnknownError("not run"));
  std::vector<int> counts(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions options;
      options.rank = r;
      options.size = n;
      auto comm = CreateGlooCommunicator(options, store);
      ASSERT_TRUE(comm.ok()) << comm.status();
      results[r] = Train(spec, **comm, [&](const v1::Metrics&) { ++counts[r]; });
    });
  }
  for (auto& t : threads) t.join();
  if (reports) *reports = counts;
  return results;
}

TEST(TrainerTest, TwoRanksLearnSyntheticClassesAndAgreeOnMetrics) {
  v1::JobSpec spec = Spec(R"pb(
    model { mlp { hidden_sizes: [32] } }
    data { synthetic { num_samples: 1024 input_shape: [8] num_classes: 3 seed: 4 } }
    training { batch_size_per_rank: 32 epochs: 4 seed: 2 log_every_steps: 8 }
    optimizer { kind: SGD lr: 0.1 momentum: 0.9 }
    lr_schedule { cosine { warmup_steps: 4 } }
  )pb");
  std::vector<int> reports;
  auto results = TrainOnRanks(spec, 2, &reports);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r].ok()) << results[r].status();
  EXPECT_EQ(results[0]->step(), 4 * (1024 / 64));
  EXPECT_GT(results[0]->eval_accuracy(), 0.8) << "a linear teacher is easy to learn";
  EXPECT_DOUBLE_EQ(results[0]->eval_accuracy(), results[1]->eval_accuracy());
  EXPECT_DOUBLE_EQ(results[0]->eval_loss(), results[1]->eval_loss());
  EXPECT_GT(results[0]->samples_per_second(), 0);
  EXPECT_EQ(reports[0], 64 / 8 + 1);  // every 8 steps, plus the final report
}

TEST(TrainerTest, CnnOnAFashionMnistSubsetRunsAndMaxStepsStops) {
  v1::JobSpec spec = Spec(R"pb(
    model { cnn { channels: [4, 8] fc_hidden: 16 } }
    data { fashion_mnist { train_limit: 256 } }
    training { batch_size_per_rank: 16 max_steps: 5 }
    optimizer { kind: ADAM lr: 0.001 }
    eval { max_batches: 2 }
  )pb");
  auto results = TrainOnRanks(spec, 2);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r].ok()) << results[r].status();
  EXPECT_EQ(results[0]->step(), 5);
  EXPECT_GT(results[0]->eval_loss(), 0);
}

TEST(TrainerTest, TransformerLmLearnsTheTokenChain) {
  // The chain's best possible next-token accuracy is about 0.7; unigram
  // guessing gets about 1/16.
  v1::JobSpec spec = Spec(R"pb(
    model { transformer_lm { vocab_size: 16 context_length: 16 d_model: 32 num_heads: 2 num_layers: 1 } }
    data { synthetic { kind: TOKENS num_samples: 512 seed: 5 } }
    training { batch_size_per_rank: 16 epochs: 3 seed: 1 }
    optimizer { kind: ADAMW lr: 0.01 }
  )pb");
  auto results = TrainOnRanks(spec, 2);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r].ok()) << results[r].status();
  EXPECT_EQ(results[0]->step(), 3 * (512 / 32));
  EXPECT_GT(results[0]->eval_accuracy(), 0.5);
  EXPECT_LT(results[0]->eval_accuracy(), 0.8);
  EXPECT_DOUBLE_EQ(results[0]->eval_loss(), results[1]->eval_loss());
}

TEST(TrainerTest, TorchScriptModelOnATensorFile) {
  v1::JobSpec spec = Spec(R"pb(
    model { torchscript { path: "worker/train/testdata/tiny_mlp_script.pt" } }
    data { tensor_file { path: "worker/train/testdata/tiny_data.pt" eval_path: "worker/train/testdata/tiny_eval.pt" } }
    training { batch_size_per_rank: 8 epochs: 20 seed: 1 }
    optimizer { kind: ADAM lr: 0.01 }
  )pb");
  auto results = TrainOnRanks(spec, 2);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r].ok()) << results[r].status();
  EXPECT_EQ(results[0]->step(), 20 * (96 / 16));
  EXPECT_GT(results[0]->eval_accuracy(), 0.75) << "labels come from a linear teacher";
  EXPECT_DOUBLE_EQ(results[0]->eval_accuracy(), results[1]->eval_accuracy());

  // Without eval_path there is no test split: training runs, no eval metrics.
  spec.mutable_data()->mutable_tensor_file()->clear_eval_path();
  spec.mutable_training()->set_epochs(1);
  auto no_eval = TrainOnRanks(spec, 1);
  ASSERT_TRUE(no_eval[0].ok()) << no_eval[0].status();
  EXPECT_EQ(no_eval[0]->eval_loss(), 0);
}

TEST(TrainerTest, ModelAndDataThatDoNotFitAreClearErrors) {
  v1::JobSpec missing = Spec(R"pb(
    model { torchscript { path: "/nonexistent/model.pt" } }
    data { synthetic { num_samples: 64 input_shape: [8] } }
  )pb");
  auto m = TrainOnRanks(missing, 1);
  EXPECT_EQ(m[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m[0].status().message(), HasSubstr("model.torchscript.path: cannot load /nonexistent/model.pt"));

  // The script takes 8 features; these samples have 5.
  v1::JobSpec shape = Spec(R"pb(
    model { torchscript { path: "worker/train/testdata/tiny_mlp_script.pt" } }
    data { synthetic { num_samples: 64 input_shape: [5] } }
  )pb");
  auto s = TrainOnRanks(shape, 1);
  EXPECT_EQ(s[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s[0].status().message(), HasSubstr("forward failed on input of shape [64, 5]"));

  v1::JobSpec cnn = Spec("model { cnn {} } data { synthetic { num_samples: 64 input_shape: [8] } }");
  auto c = TrainOnRanks(cnn, 1);
  EXPECT_EQ(c[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c[0].status().message(), HasSubstr("model.cnn needs image inputs"));
}

TEST(TrainerTest, UnsupportedFeaturesAndTooLittleDataAreClearErrors) {
  v1::JobSpec accum = Spec("model { mlp {} } data { synthetic {} } optimizer { kind: ACCUM_ADAM }");
  auto r = TrainOnRanks(accum, 1);
  EXPECT_EQ(r[0].status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(r[0].status().message(), HasSubstr("optimizer.kind ACCUM_ADAM"));
  v1::JobSpec tiny = Spec("model { mlp {} } data { synthetic { num_samples: 10 } } training { batch_size_per_rank: 8 }");
  auto t = TrainOnRanks(tiny, 2);
  EXPECT_EQ(t[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t[0].status().message(), HasSubstr("fewer than one global batch"));
}

}  // namespace
}  // namespace chorus
