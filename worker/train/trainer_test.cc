#include "worker/train/trainer.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"
#include "worker/train/memory_sink.h"
#include "worker/train/shard_index.h"
#include "worker/train/shard_writer.h"

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
                                                      std::vector<int>* reports = nullptr,
                                                      const TrainOptions& train_options = {}) {
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
      results[r] = Train(
          spec, **comm, [&](const v1::Metrics&) { ++counts[r]; }, nullptr, train_options);
    });
  }
  for (auto& t : threads) t.join();
  if (reports) *reports = counts;
  return results;
}

TEST(TrainerTest, TwoRanksLearnSyntheticClassesAndAgreeOnMetrics) {
  v1::JobSpec spec = Spec(R"pb(
    model { mlp { hidden_sizes: [ 32 ] } }
    data {
      synthetic {
        num_samples: 1024
        input_shape: [ 8 ]
        num_classes: 3
        seed: 4
      }
    }
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

// An MLP learning 1024 synthetic samples of 3 classes from a linear teacher.
constexpr char kThreeClasses[] = R"pb(
  model { mlp { hidden_sizes: [ 32 ] } }
  data {
    synthetic {
      num_samples: 1024
      input_shape: [ 8 ]
      num_classes: 3
      seed: 4
    }
  }
  optimizer { kind: SGD lr: 0.1 momentum: 0.9 }
  eval { every_steps: 20 }
)pb";

TEST(TrainerTest, DecentralizedRanksLearnAsWellAsDdpAndEvaluateTheGlobalAverage) {
  const std::string common = std::string(kThreeClasses) + R"pb(
    training { batch_size_per_rank: 16 epochs: 4 seed: 2 log_every_steps: 8 }
    resources { min_ranks: 4 max_ranks: 4 }
  )pb";
  auto ddp = TrainOnRanks(Spec(common), 4);
  ASSERT_TRUE(ddp[0].ok()) << ddp[0].status();
  for (const char* topology : {"RING", "ONE_PEER_EXPONENTIAL"}) {
    v1::JobSpec spec = Spec(common + "strategy { decentralized { topology: " + topology +
                            " bucket_cap_mb: 0.001 } }");
    MemorySink sink;
    TrainOptions options;
    options.checkpoints = &sink;
    auto results = TrainOnRanks(spec, 4, nullptr, options);
    for (int r = 0; r < 4; ++r)
      ASSERT_TRUE(results[r].ok()) << topology << ": " << results[r].status();
    EXPECT_EQ(results[0]->step(), 4 * (1024 / 64));
    EXPECT_GT(results[0]->eval_accuracy(), ddp[0]->eval_accuracy() - 0.03) << topology;
    // Every rank evaluated the same averaged model.
    for (int r = 1; r < 4; ++r)
      EXPECT_DOUBLE_EQ(results[r]->eval_loss(), results[0]->eval_loss()) << topology;
    // Pairs: each step sends the model once (8*32+32 + 32*3+3 floats).
    EXPECT_EQ(results[0]->values().at("exchange_bytes_per_step"), (8 * 32 + 32 + 32 * 3 + 3) * 4)
        << topology;
    ASSERT_EQ(sink.Steps(), std::vector<int64_t>{64}) << topology;
    EXPECT_EQ(sink.Model(64).size(), 4u) << topology;
  }
}

TEST(TrainerTest, AHotSpareTrainsNothingAndChangesNothing) {
  // Elastic gossip over one_peer_exponential at 3 ranks: ranks 0 and 1
  // train, rank 2 is a hot spare. The run is the 2-rank run.
  const v1::JobSpec spec = Spec(std::string(kThreeClasses) + R"pb(
    training { batch_size_per_rank: 16 epochs: 2 seed: 2 log_every_steps: 8 }
    resources { min_ranks: 2 max_ranks: 3 }
    elastic {}
    strategy { decentralized { bucket_cap_mb: 0.001 } }
  )pb");
  MemorySink three_sink, two_sink;
  TrainOptions three_options, two_options;
  three_options.checkpoints = &three_sink;
  two_options.checkpoints = &two_sink;
  auto three = TrainOnRanks(spec, 3, nullptr, three_options);
  auto two = TrainOnRanks(spec, 2, nullptr, two_options);
  for (int r = 0; r < 3; ++r)
    ASSERT_TRUE(three[r].ok()) << "rank " << r << ": " << three[r].status();
  ASSERT_TRUE(two[0].ok()) << two[0].status();
  EXPECT_EQ(three[0]->step(), 2 * (1024 / 32)) << "two ranks share the data";
  EXPECT_EQ(three[0]->values().at("training_ranks"), 2);
  EXPECT_EQ(two[0]->values().count("training_ranks"), 0u);
  EXPECT_EQ(three[2]->values().at("exchange_bytes_per_step"), 0) << "the spare exchanges nothing";
  EXPECT_EQ(three[0]->values().at("exchange_bytes_per_step"),
            two[0]->values().at("exchange_bytes_per_step"));
  // The final model (the trainers' global average) is the 2-rank run's, bit
  // for bit: the spare adds zeros to the sum, and both runs start from the
  // seed's model (Note [Seeded draws] in worker/train/model.h).
  ASSERT_EQ(three_sink.Steps(), std::vector<int64_t>{64});
  ASSERT_EQ(two_sink.Steps(), std::vector<int64_t>{64});
  const std::map<std::string, at::Tensor> three_model = three_sink.Model(64);
  const std::map<std::string, at::Tensor> two_model = two_sink.Model(64);
  ASSERT_EQ(three_model.size(), two_model.size());
  ASSERT_FALSE(three_model.empty());
  for (const auto& [name, tensor] : three_model) {
    ASSERT_EQ(two_model.count(name), 1u) << name;
    EXPECT_TRUE(tensor.equal(two_model.at(name))) << name;
  }
  // Every rank, the spare too, evaluated that model. The 3-rank run cuts
  // the test split in thirds, the 2-rank run in halves, so the per-batch
  // float losses (means over other rows) round differently: the losses
  // have differed by 8e-8 of the loss, the counts of correct answers never.
  for (int r = 1; r < 3; ++r) {
    EXPECT_DOUBLE_EQ(three[r]->eval_loss(), three[0]->eval_loss());
    EXPECT_DOUBLE_EQ(three[r]->eval_accuracy(), three[0]->eval_accuracy());
  }
  EXPECT_NEAR(three[0]->eval_loss(), two[0]->eval_loss(), 1e-6 * two[0]->eval_loss());
  EXPECT_DOUBLE_EQ(three[0]->eval_accuracy(), two[0]->eval_accuracy());
  EXPECT_GT(three[0]->eval_accuracy(), 0.8);
}

TEST(TrainerTest, RanksOnThreadsOfOneProcessStartFromTheSeedsModel) {
  // Ranks that are threads of one process share LibTorch's default
  // generator (Note [Seeded draws] in worker/train/model.h); rank 0's
  // initial model, which every rank starts from, must be the seed's however
  // the others' seeding and drawing interleave with its own. Eight ranks
  // build a wide model at the same moment; one step later every run holds
  // the same model, bit for bit.
  const v1::JobSpec spec = Spec(R"pb(
    model { mlp { hidden_sizes: [ 1024, 1024 ] } }
    data {
      synthetic {
        num_samples: 256
        input_shape: [ 8 ]
        num_classes: 3
        seed: 4
      }
    }
    training { batch_size_per_rank: 16 max_steps: 1 seed: 3 }
    optimizer { kind: SGD lr: 0.1 }
    eval { disabled: true }
  )pb");
  std::map<std::string, at::Tensor> first;
  for (int run = 0; run < 5; ++run) {
    MemorySink sink;
    TrainOptions options;
    options.checkpoints = &sink;
    auto results = TrainOnRanks(spec, 8, nullptr, options);
    for (int r = 0; r < 8; ++r) ASSERT_TRUE(results[r].ok()) << results[r].status();
    ASSERT_EQ(sink.Steps(), std::vector<int64_t>{1});
    const std::map<std::string, at::Tensor> model = sink.Model(1);
    ASSERT_FALSE(model.empty());
    if (run == 0) {
      first = model;
      continue;
    }
    ASSERT_EQ(model.size(), first.size());
    for (const auto& [name, tensor] : model)
      EXPECT_TRUE(tensor.equal(first.at(name))) << "run " << run << ": " << name;
  }
}

TEST(TrainerTest, CnnOnAFashionMnistSubsetRunsAndMaxStepsStops) {
  v1::JobSpec spec = Spec(R"pb(
    model {
      cnn {
        channels: [ 4, 8 ]
        fc_hidden: 16
      }
    }
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
    model {
      transformer_lm { vocab_size: 16 context_length: 16 d_model: 32 num_heads: 2 num_layers: 1 }
    }
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
    data {
      tensor_file {
        path: "worker/train/testdata/tiny_data.pt"
        eval_path: "worker/train/testdata/tiny_eval.pt"
      }
    }
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

TEST(TrainerTest, TiedWeightsAreSynchronizedAndSteppedOnce) {
  // A TorchScript model whose `out.weight` is `hidden.weight` and whose
  // `hidden` Linear is registered a second time as `again`: LibTorch lists
  // the shared parameters two or three times, PyTorch once. Trained on 2
  // ranks with DDP, clipping and SGD with momentum, the final checkpoint
  // must equal PyTorch in one process on the concatenated batches.
  constexpr int kSteps = 12;
  constexpr int kBatch = 4;
  const std::string out = std::string(std::getenv("TEST_TMPDIR")) + "/tied";
  const std::string command =
      absl::StrCat("/usr/bin/python3 worker/train/testdata/tied_weights_reference.py ", out, " ",
                   kSteps, " ", 2 * kBatch, " 2>&1");
  ASSERT_EQ(std::system(command.c_str()), 0)
      << "the PyTorch reference run failed (needs Debian's python3-torch; run deploy/setup.sh)";
  // Unformatted: clang-format would put spaces inside the quoted paths.
  // clang-format off
  v1::JobSpec spec = Spec(absl::StrCat(R"pb(
    model { torchscript { path: ")pb", out, R"pb(/model.pt" } }
    data { tensor_file { path: ")pb", out, R"pb(/data.pt" } }
    training { batch_size_per_rank: 4 epochs: 1 seed: 1 shuffle: false log_every_steps: 100 }
    optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
    grad_clip_norm: 0.5
  )pb"));
  // clang-format on
  MemorySink sink;
  TrainOptions options;
  options.checkpoints = &sink;
  auto results = TrainOnRanks(spec, 2, nullptr, options);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r].ok()) << results[r].status();
  ASSERT_EQ(results[0]->step(), kSteps);
  ASSERT_EQ(sink.Steps(), (std::vector<int64_t>{kSteps}));

  std::ifstream in(out + "/final.pt", std::ios::binary);
  ASSERT_TRUE(in) << "no final.pt from the reference run";
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, at::Tensor> want;
  for (const auto& item : torch::jit::pickle_load(bytes).toGenericDict()) {
    want[item.key().toStringRef()] = item.value().toTensor();
  }
  std::map<std::string, at::Tensor> got = sink.Model(kSteps);
  std::vector<std::string> got_names, want_names;
  for (const auto& [name, tensor] : got) got_names.push_back(name);
  for (const auto& [name, tensor] : want) want_names.push_back(name);
  EXPECT_EQ(got_names, want_names) << "every name of a shared parameter, as state_dict() has";
  for (const auto& [name, reference] : want) {
    if (!got.count(name)) continue;
    const double max_diff = (got.at(name) - reference).abs().max().item<double>();
    EXPECT_TRUE(at::allclose(got.at(name), reference, 1e-5, 1e-6))
        << name << " max difference " << max_diff;
  }
  EXPECT_TRUE(got.at("out.weight").is_same(got.at("hidden.weight")) ||
              got.at("out.weight").data_ptr() == got.at("hidden.weight").data_ptr())
      << "a tied weight is stored once";

  // What `chorus export` writes (model.pt as stored) loads back into the
  // PyTorch model with load_state_dict: it once failed with "Missing key(s):
  // out.weight".
  v1::CheckpointManifest final_step;
  final_step.set_step(kSteps);
  auto files = sink.Load(final_step);
  ASSERT_TRUE(files.ok()) << files.status();
  const std::string exported = out + "/exported.pt";
  for (const CheckpointFileData& f : *files) {
    if (f.name == "model.pt") std::ofstream(exported, std::ios::binary) << f.bytes;
  }
  const std::string load = absl::StrCat(
      "/usr/bin/python3 worker/train/testdata/tied_weights_reference.py --load ", exported, " ",
      out, "/final.pt 2>&1");
  EXPECT_EQ(std::system(load.c_str()), 0) << "load_state_dict of the exported model.pt failed";
}

TEST(TrainerTest, ModelAndDataThatDoNotFitAreClearErrors) {
  v1::JobSpec missing = Spec(R"pb(
    model { torchscript { path: "/nonexistent/model.pt" } }
    data {
      synthetic {
        num_samples: 64
        input_shape: [ 8 ]
      }
    }
  )pb");
  auto m = TrainOnRanks(missing, 1);
  EXPECT_EQ(m[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m[0].status().message(),
              HasSubstr("model.torchscript.path: cannot load /nonexistent/model.pt"));

  // The script takes 8 features; these samples have 5.
  v1::JobSpec shape = Spec(R"pb(
    model { torchscript { path: "worker/train/testdata/tiny_mlp_script.pt" } }
    data {
      synthetic {
        num_samples: 64
        input_shape: [ 5 ]
      }
    }
  )pb");
  auto s = TrainOnRanks(shape, 1);
  EXPECT_EQ(s[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s[0].status().message(), HasSubstr("forward failed on input of shape [64, 5]"));

  v1::JobSpec cnn =
      Spec("model { cnn {} } data { synthetic { num_samples: 64 input_shape: [8] } }");
  auto c = TrainOnRanks(cnn, 1);
  EXPECT_EQ(c[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c[0].status().message(), HasSubstr("model.cnn needs image inputs"));
}

TEST(TrainerTest, ResumingFromACheckpointIsBitIdenticalToNotStopping) {
  // Adam moments, the LR schedule and the sampler position must all resume.
  // Dropout's random draws too, but the default generator is per process and
  // ranks here are threads of one process, so dropout runs on one rank (the
  // multi-process end-to-end test covers it on two).
  // A one-rank decentralized run checks the per-bucket optimizers'
  // AccumAdamW state, restored before step 0's bucket re-layout.
  for (const auto& [world, decentralized] : {std::pair{2, false}, {1, false}, {1, true}}) {
    SCOPED_TRACE(absl::StrCat(world, " rank(s)", decentralized ? ", decentralized" : ""));
    // clang-format off
    v1::JobSpec spec = Spec(absl::StrCat(R"pb(
      model { mlp { hidden_sizes: [32] dropout: )pb", world == 1 ? "0.2" : "0", R"pb( } }
      data { synthetic { num_samples: 600 input_shape: [8] num_classes: 3 seed: 4 } }
      training { batch_size_per_rank: )pb", 32 / world, R"pb( epochs: 3 seed: 2 }
      lr_schedule { cosine { warmup_steps: 5 } }
      checkpoint { every_steps: 25 keep_last: 0 }
    )pb", decentralized ? "optimizer { kind: ACCUM_ADAMW lr: 0.01 accum_iter: 3 } "
                          "strategy { decentralized { topology: COMPLETE bucket_cap_mb: 0.0005 } }"
                        : "optimizer { kind: ADAM lr: 0.01 }"));
    // clang-format on
    // 600 / 32 = 18 steps per epoch (24 samples dropped), 54 in all.
    MemorySink uninterrupted;
    TrainOptions options;
    options.checkpoints = &uninterrupted;
    auto full = TrainOnRanks(spec, world, nullptr, options);
    for (int r = 0; r < world; ++r) ASSERT_TRUE(full[r].ok()) << full[r].status();
    EXPECT_EQ(uninterrupted.Steps(), (std::vector<int64_t>{25, 50, 54}));

    // Start again from step 25 (mid-epoch 1) on a fresh set of ranks.
    MemorySink resumed;
    ASSERT_TRUE(resumed.Put(25, *uninterrupted.Load(At(25))).ok());
    TrainOptions resume;
    resume.checkpoints = &resumed;
    resume.resume = At(25);
    auto second = TrainOnRanks(spec, world, nullptr, resume);
    for (int r = 0; r < world; ++r) ASSERT_TRUE(second[r].ok()) << second[r].status();
    EXPECT_EQ(second[0]->step(), 54);
    EXPECT_EQ(resumed.Steps(), (std::vector<int64_t>{25, 50, 54}));
    for (int64_t step : {50, 54}) {
      std::map<std::string, at::Tensor> a = uninterrupted.Model(step);
      std::map<std::string, at::Tensor> b = resumed.Model(step);
      ASSERT_EQ(a.size(), b.size());
      for (const auto& [name, tensor] : a) {
        EXPECT_TRUE(at::equal(tensor, b.at(name)))
            << name << " differs at step " << step << " after resuming";
      }
    }
    EXPECT_EQ(second[0]->eval_accuracy(), full[0]->eval_accuracy());
  }
}

TEST(TrainerTest, PerRankDecentralizedCheckpointsResumeBitIdentically) {
  // Every rank's own model, optimizer state and the exchange it has
  // received but not mixed in yet (Note [Exchange in checkpoints]): the
  // resumed ranks continue exactly where the uninterrupted ones were.
  v1::JobSpec spec = Spec(R"pb(
    model { mlp { hidden_sizes: [ 32 ] } }
    data {
      synthetic {
        num_samples: 600
        input_shape: [ 8 ]
        num_classes: 3
        seed: 4
      }
    }
    training { batch_size_per_rank: 16 epochs: 3 seed: 2 }
    lr_schedule { cosine { warmup_steps: 5 } }
    optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
    strategy { decentralized { topology: RING bucket_cap_mb: 0.0005 } }
    checkpoint { every_steps: 25 keep_last: 0 per_rank: true }
  )pb");
  MemorySink uninterrupted;
  TrainOptions options;
  options.checkpoints = &uninterrupted;
  auto full = TrainOnRanks(spec, 2, nullptr, options);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(full[r].ok()) << full[r].status();
  EXPECT_EQ(uninterrupted.Steps(), (std::vector<int64_t>{25, 50, 54}));
  EXPECT_EQ(uninterrupted.Files(25),
            (std::vector<std::string>{"model.pt", "model.rank1.pt", "train_state.pt",
                                      "train_state.rank1.pt"}));
  // The ranks' own models differ (gossip has not reached consensus).
  {
    std::map<std::string, at::Tensor> r0 = uninterrupted.Model(25, 0),
                                      r1 = uninterrupted.Model(25, 1);
    ASSERT_FALSE(r0.empty());
    ASSERT_EQ(r0.size(), r1.size());
    EXPECT_FALSE(at::equal(r0.begin()->second, r1.at(r0.begin()->first)));
  }

  v1::CheckpointManifest manifest = At(25);
  manifest.set_per_rank(true);
  manifest.set_world_size(2);
  for (const std::string& name : uninterrupted.Files(25)) manifest.add_files()->set_name(name);
  MemorySink resumed;
  ASSERT_TRUE(resumed.Put(25, *uninterrupted.Load(manifest)).ok());
  TrainOptions resume;
  resume.checkpoints = &resumed;
  resume.resume = manifest;
  auto second = TrainOnRanks(spec, 2, nullptr, resume);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(second[r].ok()) << second[r].status();
  for (int64_t step : {50, 54}) {
    for (int rank : {0, 1}) {
      std::map<std::string, at::Tensor> a = uninterrupted.Model(step, rank);
      std::map<std::string, at::Tensor> b = resumed.Model(step, rank);
      ASSERT_EQ(a.size(), b.size());
      for (const auto& [name, tensor] : a) {
        EXPECT_TRUE(at::equal(tensor, b.at(name)))
            << name << " of rank " << rank << " differs at step " << step;
      }
    }
  }
  EXPECT_EQ(second[0]->eval_accuracy(), full[0]->eval_accuracy());

  // On another number of ranks, rank r starts from part r mod 2 (here 1
  // rank: rank 0's part, without the exchange); training goes on to the end.
  MemorySink one;
  ASSERT_TRUE(one.Put(25, *uninterrupted.Load(manifest)).ok());
  resume.checkpoints = &one;
  auto alone = TrainOnRanks(spec, 1, nullptr, resume);
  ASSERT_TRUE(alone[0].ok()) << alone[0].status();
  EXPECT_EQ(alone[0]->step(), 25 + (600 - 224) / 16 + 600 / 16);  // as in the test below
  EXPECT_GT(alone[0]->eval_accuracy(), 0.6);
}

// The largest |a - b| over the tensors of two models, relative to the
// largest |a| (at least 1).
double MaxRelativeDifference(const std::map<std::string, at::Tensor>& a,
                             const std::map<std::string, at::Tensor>& b) {
  double diff = 0, scale = 1;
  for (const auto& [name, tensor] : a) {
    EXPECT_EQ(b.count(name), 1u) << name;
    if (b.count(name) == 0) return 1e9;
    diff = std::max(diff, (tensor - b.at(name)).abs().max().item<double>());
    scale = std::max(scale, tensor.abs().max().item<double>());
  }
  return diff / scale;
}

// Issue 44: an elastic job that shrinks from 4 ranks to 2 must train what an
// undisturbed run would. With training.global_batch_size each step trains
// the same global batch as the same micro-batches with the same dropout
// draws at every world size (Note [Global batch] in sampler.cc): 1, 2 and 4
// ranks end with the same parameters. Not bit for bit: the micro-batch
// gradients are summed in another order (accumulation on a rank, then the
// all-reduce), so they agree to float rounding.
TEST(TrainerTest, AGlobalBatchTrainsTheSameStepsAtEveryWorldSize) {
  // 600 samples, global batch 48 of micro-batches of 4: 12 steps an epoch;
  // 12, 6 or 3 micro-batches per rank and step at 1, 2 or 4 ranks.
  const std::string common = R"pb(
    model { mlp { hidden_sizes: [ 32 ] dropout: 0.3 } }
    data {
      synthetic {
        num_samples: 600
        input_shape: [ 8 ]
        num_classes: 3
        seed: 4
      }
    }
    optimizer { kind: SGD lr: 0.2 momentum: 0.9 }
    resources { min_ranks: 1 max_ranks: 4 }
    elastic {}
  )pb";
  auto final_model = [](const v1::JobSpec& spec, int world) {
    MemorySink sink;
    TrainOptions options;
    options.checkpoints = &sink;
    auto results = TrainOnRanks(spec, world, nullptr, options);
    for (int r = 0; r < world; ++r) EXPECT_TRUE(results[r].ok()) << results[r].status();
    EXPECT_EQ(sink.Steps(), std::vector<int64_t>{15}) << world << " ranks";
    return sink.Steps().empty() ? std::map<std::string, at::Tensor>() : sink.Model(15);
  };
  // 15 steps: into the second epoch, whose order is shuffled afresh.
  const v1::JobSpec global = Spec(common + R"pb(
    training { batch_size_per_rank: 4 global_batch_size: 48 max_steps: 15 seed: 2 }
  )pb");
  const std::map<std::string, at::Tensor> one = final_model(global, 1);
  ASSERT_FALSE(one.empty());
  for (int world : {2, 4}) {
    EXPECT_LT(MaxRelativeDifference(one, final_model(global, world)), 1e-5)
        << world << " ranks end elsewhere than 1 rank";
  }
  // A world size the global batch does not split into (validation allows
  // 1 to 4) fails the generation, naming it.
  for (const absl::StatusOr<v1::Metrics>& r : TrainOnRanks(global, 5)) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(),
                HasSubstr("generation 1 cannot train: training.global_batch_size 48 does not "
                          "split into micro-batches of training.batch_size_per_rank 4 on each of "
                          "5 ranks: it must be a multiple of 4 x 5 = 20"));
  }
  // Without it the step is batch_size_per_rank x ranks: a job shrunk from 4
  // ranks to 2 took steps of 24 samples instead of 48, another computation,
  // which the comparison above tells apart.
  const v1::JobSpec per_rank = Spec(common + R"pb(
    training { batch_size_per_rank: 12 max_steps: 15 seed: 2 }
  )pb");
  EXPECT_GT(MaxRelativeDifference(final_model(per_rank, 4), final_model(per_rank, 2)), 1e-3);
}

TEST(TrainerTest, ACheckpointResumesOnAnotherNumberOfRanks) {
  v1::JobSpec spec = Spec(R"pb(
    model { mlp { hidden_sizes: [ 32 ] } }
    data {
      synthetic {
        num_samples: 600
        input_shape: [ 8 ]
        num_classes: 3
        seed: 4
      }
    }
    training { batch_size_per_rank: 16 epochs: 3 seed: 2 }
    optimizer { kind: ADAM lr: 0.01 }
    checkpoint { every_steps: 25 }
  )pb");
  MemorySink two_ranks;
  TrainOptions options;
  options.checkpoints = &two_ranks;
  auto full = TrainOnRanks(spec, 2, nullptr, options);
  ASSERT_TRUE(full[0].ok()) << full[0].status();
  // The same checkpoint on 1 and on 3 ranks: training continues over the
  // rest of the epoch and the remaining epochs at the new world size.
  for (int world : {1, 3}) {
    MemorySink other;
    ASSERT_TRUE(other.Put(25, *two_ranks.Load(At(25))).ok());
    TrainOptions o;
    o.checkpoints = &other;
    o.resume = At(25);
    auto r = TrainOnRanks(spec, world, nullptr, o);
    ASSERT_TRUE(r[0].ok()) << r[0].status();
    // 25 steps trained 800 samples = epoch 1 up to sample 224 of 600.
    const int64_t global = 16 * world;
    const int64_t expected = 25 + (600 - 224) / global + 1 * (600 / global);
    EXPECT_EQ(r[0]->step(), expected) << world << " ranks";
    EXPECT_GT(r[0]->eval_accuracy(), 0.6) << world << " ranks";
  }
}

TEST(TrainerTest, ACommunicatorOnTheWrongDeviceAndTooLittleDataAreClearErrors) {
  // A CUDA job handed a Gloo (CPU) communicator: refused before any work,
  // naming the field and what the job needs.
  v1::JobSpec cuda = Spec("model { mlp {} } data { synthetic {} } resources { device: CUDA }");
  auto r = TrainOnRanks(cuda, 1);
  EXPECT_EQ(r[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r[0].status().message(),
              HasSubstr("resources.device is CUDA but rank 0's communicator works on cpu: a "
                        "CUDA job needs an NCCL communicator"));
  v1::JobSpec tiny = Spec(
      "model { mlp {} } data { synthetic { num_samples: 10 } } training { batch_size_per_rank: 8 "
      "}");
  auto t = TrainOnRanks(tiny, 2);
  EXPECT_EQ(t[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t[0].status().message(), HasSubstr("fewer than one global batch"));
}

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

// `shards` shards of `per_shard` samples: x float32 [8] from a seeded
// Gaussian, y int64 the class a fixed linear teacher gives (3).
std::vector<std::pair<at::Tensor, at::Tensor>> ClassShards(int shards, int per_shard) {
  at::Generator gen = at::detail::createCPUGenerator(9);
  const at::Tensor teacher = at::randn({8, 3}, gen, at::kFloat);
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (int s = 0; s < shards; ++s) {
    const at::Tensor x = at::randn({per_shard, 8}, gen, at::kFloat).contiguous();
    out.emplace_back(x, x.matmul(teacher).argmax(1).contiguous());
  }
  return out;
}

// torch.save({'x': x, 'y': y}, path): a tensor_file.
void SaveTensorFile(const std::string& path, const at::Tensor& x, const at::Tensor& y) {
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("x", x);
  dict.insert("y", y);
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// ClassShards as tar shards train-S.tar in `dir`.
void WriteClassShards(const std::string& dir, int shards, int per_shard) {
  const std::vector<std::pair<at::Tensor, at::Tensor>> data = ClassShards(shards, per_shard);
  for (int s = 0; s < shards; ++s) {
    auto tar = TarWriter::Create(absl::StrCat(dir, "/train-", s, ".tar"));
    ASSERT_TRUE(tar.ok()) << tar.status();
    const auto& [x, y] = data[s];
    for (int i = 0; i < per_shard; ++i) {
      const std::string key = absl::StrCat("s", s, "_", i);
      ASSERT_TRUE(
          (*tar)
              ->Add(key + ".x.npy", NpyBytes(ElementType::kFloat32, {8}, x[i].data_ptr<float>()))
              .ok());
      ASSERT_TRUE(
          (*tar)
              ->Add(key + ".y.npy", NpyBytes(ElementType::kInt64, {}, y.data_ptr<int64_t>() + i))
              .ok());
    }
    ASSERT_TRUE((*tar)->Close().ok());
  }
}

// The samples of each epoch in the sample traces of `dir` (every rank's
// `step` lines), counted, for steps in [from, to).
std::map<int64_t, std::map<int64_t, int>> TracedSamples(const std::string& dir, int64_t from,
                                                        int64_t to) {
  std::map<int64_t, std::map<int64_t, int>> out;
  std::ifstream in(absl::StrCat(dir, "/", ::getpid(), ".trace"));
  std::string word;
  while (in >> word) {
    if (word != "step") {
      std::getline(in, word);
      continue;
    }
    int64_t generation, rank, step, epoch;
    std::string list;
    in >> generation >> rank >> step >> epoch >> list;
    if (step < from || step >= to) continue;
    for (absl::string_view i : absl::StrSplit(list, ',')) {
      int64_t sample;
      EXPECT_TRUE(absl::SimpleAtoi(i, &sample)) << list;
      ++out[epoch][sample];
    }
  }
  return out;
}

// Note [Streamed order] in sampler.cc: a checkpoint's position (epoch,
// samples trained) resumes the streamed order on another number of ranks,
// and every sample of every epoch is trained exactly once.
TEST(TrainerTest, ShardedDataResumesMidEpochOnAnotherNumberOfRanksTrainingEachSampleOnce) {
  const std::string data = TestDir("class_shards");
  WriteClassShards(data, 3, 200);
  v1::JobSpec spec = Spec(R"pb(
    model { mlp { hidden_sizes: [ 32 ] } }
    data {
      shards {
        format: TAR
        paths: "/placeholder"
        num_classes: 3
        read_ahead_bytes: 4096
        shuffle_buffer: 32
      }
    }
    training { batch_size_per_rank: 16 epochs: 3 seed: 2 }
    optimizer { kind: ADAM lr: 0.01 }
    checkpoint { every_steps: 25 }
  )pb");
  spec.mutable_data()->mutable_shards()->set_paths(0, data + "/train-*.tar");
  // 600 samples, 2 ranks x 16: 18 steps an epoch (24 samples dropped).
  MemorySink two_ranks;
  TrainOptions options;
  options.checkpoints = &two_ranks;
  options.sample_trace_dir = TestDir("trace_two");
  auto full = TrainOnRanks(spec, 2, nullptr, options);
  ASSERT_TRUE(full[0].ok()) << full[0].status();
  EXPECT_EQ(full[0]->step(), 54);
  EXPECT_LT(full[0]->loss(), 0.5) << "it learns the teacher (chance: ln 3 = 1.1)";
  const std::map<int64_t, std::map<int64_t, int>> epochs =
      TracedSamples(options.sample_trace_dir, 0, 54);
  EXPECT_EQ(epochs.size(), 3u);
  for (const auto& [epoch, seen] : epochs) {
    EXPECT_EQ(seen.size(), 576u) << "epoch " << epoch;
    for (const auto& [i, count] : seen) EXPECT_EQ(count, 1) << "sample " << i;
  }
  // Resumed at step 25 (epoch 1, 224 samples in) on 3 ranks x 16: the rest
  // of epoch 1 is (600 - 224) / 48 = 7 steps, then 12 of epoch 2.
  MemorySink three;
  ASSERT_TRUE(three.Put(25, *two_ranks.Load(At(25))).ok());
  TrainOptions resume;
  resume.checkpoints = &three;
  resume.resume = At(25);
  resume.sample_trace_dir = TestDir("trace_three");
  auto second = TrainOnRanks(spec, 3, nullptr, resume);
  ASSERT_TRUE(second[0].ok()) << second[0].status();
  EXPECT_EQ(second[0]->step(), 25 + 7 + 12);
  std::map<int64_t, int> epoch1 = TracedSamples(options.sample_trace_dir, 0, 25)[1];
  const std::map<int64_t, std::map<int64_t, int>> after =
      TracedSamples(resume.sample_trace_dir, 25, 100);
  for (const auto& [i, count] : after.at(1)) epoch1[i] += count;
  EXPECT_EQ(epoch1.size(), 224u + 7 * 48) << "the epoch's samples before and after the resume";
  for (const auto& [i, count] : epoch1) EXPECT_EQ(count, 1) << "sample " << i;
  EXPECT_EQ(after.at(2).size(), 12u * 48);
}

// Note [Shard fingerprints] in shard_index.cc: checkpoints carry the
// shards' fingerprints, and a resume over a shard that changed fails naming
// it instead of training some samples of the epoch twice and others never.
TEST(TrainerTest, ShardedDataResumeOverAShardThatChangedFailsNamingIt) {
  const std::string data = TestDir("changing_shards");
  WriteClassShards(data, 2, 64);
  v1::JobSpec spec = Spec(R"pb(
    model { mlp { hidden_sizes: [ 4 ] } }
    data { shards { format: TAR paths: "/placeholder" num_classes: 3 } }
    training { batch_size_per_rank: 16 epochs: 1 seed: 2 }
    optimizer { kind: SGD lr: 0.01 }
    checkpoint { every_steps: 2 }
  )pb");
  spec.mutable_data()->mutable_shards()->set_paths(0, data + "/train-*.tar");
  MemorySink sink;
  TrainOptions options;
  options.checkpoints = &sink;
  auto first = TrainOnRanks(spec, 1, nullptr, options);
  ASSERT_TRUE(first[0].ok()) << first[0].status();
  TrainOptions resume;
  resume.checkpoints = &sink;
  resume.resume = At(2);
  auto same = TrainOnRanks(spec, 1, nullptr, resume);
  ASSERT_TRUE(same[0].ok()) << "the same shards resume: " << same[0].status();
  // train-1.tar rewritten with 48 samples instead of 64.
  const std::string other = TestDir("changing_shards_other");
  WriteClassShards(other, 2, 48);
  ASSERT_EQ(std::rename((other + "/train-1.tar").c_str(), (data + "/train-1.tar").c_str()), 0);
  auto changed = TrainOnRanks(spec, 1, nullptr, resume);
  ASSERT_FALSE(changed[0].ok());
  EXPECT_EQ(changed[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(changed[0].status().message()),
              HasSubstr(absl::StrCat("shard 1 (", data,
                                     "/train-1.tar, 48 samples) is not the "
                                     "shard the checkpoint was trained on")));
}

TEST(TrainerTest, TransformerLmTrainsFromAFlatTokenFile) {
  // A uint16 token file (nanoGPT's train.bin layout) of a fixed successor
  // function: the next token is always predictable.
  const std::string path = absl::StrCat(TestDir("tokens"), "/train.bin");
  std::vector<uint16_t> tokens(16 * 512 + 1);
  for (size_t i = 1; i < tokens.size(); ++i) tokens[i] = (tokens[i - 1] * 5 + 3) % 16;
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  v1::JobSpec spec = Spec(R"pb(
    model {
      transformer_lm { vocab_size: 16 context_length: 16 d_model: 32 num_heads: 2 num_layers: 1 }
    }
    data { shards { format: TOKENS paths: "/placeholder" read_ahead_bytes: 8192 } }
    training { batch_size_per_rank: 16 epochs: 3 seed: 1 }
    optimizer { kind: ADAMW lr: 0.01 }
  )pb");
  spec.mutable_data()->mutable_shards()->set_paths(0, path);
  auto results = TrainOnRanks(spec, 2);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r].ok()) << results[r].status();
  EXPECT_EQ(results[0]->step(), 3 * (512 / 32));
  EXPECT_LT(results[0]->loss(), 0.5) << "chance: ln 16 = 2.8";
  // Rank 0's last report window read its share of the file.
  EXPECT_GT(results[0]->values().at("data_read_bytes_per_second"), 0);
  EXPECT_GE(results[0]->values().at("data_wait_seconds"), 0);
}

// Note [Tensor file shards] in shard_index.cc: a directory of torch.save
// dicts trains exactly as the same samples packed into tar shards: the same
// samples in every step of every rank, and the same final parameters.
TEST(TrainerTest, TensorFileShardsTrainAsTheSameDataPackedToTar) {
  const std::string tar_dir = TestDir("same_tar"), pt_dir = TestDir("same_pt");
  WriteClassShards(tar_dir, 2, 100);
  const std::vector<std::pair<at::Tensor, at::Tensor>> data = ClassShards(2, 100);
  for (int s = 0; s < 2; ++s) {
    SaveTensorFile(absl::StrCat(pt_dir, "/train-", s, ".pt"), data[s].first, data[s].second);
  }
  std::vector<std::vector<std::string>> traces;
  std::vector<double> losses;
  for (const auto& [format, paths] :
       {std::pair{v1::ShardedData::TAR, tar_dir + "/train-*.tar"},
        std::pair{v1::ShardedData::TENSOR_FILES, pt_dir + "/train-*.pt"}}) {
    v1::JobSpec spec = Spec(R"pb(
      model { mlp { hidden_sizes: [ 16 ] } }
      data {
        shards {
          format: TAR
          paths: "/placeholder"
          num_classes: 3
          read_ahead_bytes: 2048
          shuffle_buffer: 16
        }
      }
      training { batch_size_per_rank: 8 epochs: 2 seed: 4 }
      optimizer { kind: ADAM lr: 0.01 }
    )pb");
    v1::ShardedData& shards = *spec.mutable_data()->mutable_shards();
    shards.set_format(format);
    shards.set_paths(0, paths);
    if (format == v1::ShardedData::TENSOR_FILES) {
      shards.clear_input_member();
      shards.clear_target_member();
    }
    TrainOptions options;
    options.sample_trace_dir = TestDir(absl::StrCat("same_trace_", format));
    auto results = TrainOnRanks(spec, 2, nullptr, options);
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r].ok()) << results[r].status();
    EXPECT_EQ(results[0]->step(), 2 * (200 / 16));
    losses.push_back(results[0]->loss());
    std::ifstream in(absl::StrCat(options.sample_trace_dir, "/", ::getpid(), ".trace"));
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    std::sort(lines.begin(), lines.end());  // the ranks' lines interleave
    traces.push_back(std::move(lines));
  }
  ASSERT_EQ(traces[0].size(), 2u * 2 * 12 + 2) << "a step line per rank and step, a final line";
  EXPECT_EQ(traces[1], traces[0]) << "the same samples each step, the same final parameters";
  EXPECT_EQ(losses[1], losses[0]);
}

// data.shards.eval_paths: held-out shards are evaluated over the same
// samples, in the same batches, as the same held-out split in memory, so a
// job on shards reports the eval_loss and eval_accuracy it would in memory.
TEST(TrainerTest, HeldOutShardsAreEvaluatedAsTheSameSamplesInMemory) {
  const std::string dir = TestDir("held_out");
  WriteClassShards(dir, 3, 120);  // train-0.tar and train-1.tar train, train-2.tar is held out
  const std::vector<std::pair<at::Tensor, at::Tensor>> data = ClassShards(3, 120);
  SaveTensorFile(dir + "/train.pt", at::cat({data[0].first, data[1].first}),
       at::cat({data[0].second, data[1].second}));
  SaveTensorFile(dir + "/eval.pt", data[2].first, data[2].second);
  const std::string common = R"pb(
    model { mlp { hidden_sizes: [ 16 ] } }
    training { batch_size_per_rank: 8 epochs: 2 seed: 5 shuffle: false }
    optimizer { kind: SGD lr: 0.05 }
    eval { max_batches: 0 }
  )pb";
  const std::vector<std::string> variants = {
      absl::StrCat("data { tensor_file { path: '", dir, "/train.pt' eval_path: '", dir,
                   "/eval.pt' } }"),
      absl::StrCat("data { shards { format: TAR paths: ['", dir, "/train-0.tar', '", dir,
                   "/train-1.tar'] eval_paths: '", dir,
                   "/train-2.tar' num_classes: 3 read_ahead_bytes: 2048 } }"),
      absl::StrCat("data { shards { format: TENSOR_FILES paths: '", dir, "/train.pt' eval_paths: '",
                   dir, "/eval.pt' num_classes: 3 read_ahead_bytes: 2048 } }")};
  std::vector<v1::Metrics> finals;
  for (const std::string& variant : variants) {
    SCOPED_TRACE(variant);
    auto results = TrainOnRanks(Spec(common + variant), 2);
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r].ok()) << results[r].status();
    EXPECT_EQ(results[0]->eval_loss(), results[1]->eval_loss()) << "summed over the ranks";
    finals.push_back(*results[0]);
  }
  EXPECT_GT(finals[0].eval_loss(), 0);
  EXPECT_GT(finals[0].eval_accuracy(), 1.0 / 3) << "better than chance after two epochs";
  for (size_t v = 1; v < finals.size(); ++v) {
    EXPECT_EQ(finals[v].loss(), finals[0].loss()) << variants[v] << ": the same training";
    EXPECT_DOUBLE_EQ(finals[v].eval_loss(), finals[0].eval_loss()) << variants[v];
    EXPECT_DOUBLE_EQ(finals[v].eval_accuracy(), finals[0].eval_accuracy()) << variants[v];
  }
}

// Note [Token samples] in shard_format.cc: a transformer_lm trains on
// TENSOR_FILES shards of token sequences as on the same file in memory; a
// token id outside the vocabulary is an error naming the file and sample.
TEST(TrainerTest, ALanguageModelTrainsOnTensorFileShardsAsOnTheSameFileInMemory) {
  const std::string dir = TestDir("lm_tensor_files");
  at::Generator gen = at::detail::createCPUGenerator(6);
  const at::Tensor seq = at::randint(32, {96, 17}, gen, at::kLong);
  const at::Tensor next = seq.narrow(1, 1, 16).contiguous();
  SaveTensorFile(dir + "/train.pt", seq.narrow(1, 0, 16).contiguous(), next);
  const std::string common = R"pb(
    model {
      transformer_lm { vocab_size: 32 context_length: 16 d_model: 16 num_heads: 2 num_layers: 1 }
    }
    training { batch_size_per_rank: 8 epochs: 1 seed: 3 shuffle: false }
    optimizer { kind: ADAMW lr: 0.01 }
  )pb";
  std::vector<double> losses;
  for (const std::string& data :
       {absl::StrCat("data { tensor_file { path: '", dir, "/train.pt' } }"),
        absl::StrCat("data { shards { format: TENSOR_FILES paths: '", dir,
                     "/train.pt' read_ahead_bytes: 4096 } }")}) {
    SCOPED_TRACE(data);
    auto results = TrainOnRanks(Spec(common + data), 2);
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r].ok()) << results[r].status();
    EXPECT_EQ(results[0]->step(), 96 / 16);
    losses.push_back(results[0]->loss());
  }
  EXPECT_EQ(losses[1], losses[0]) << "the same sequences in the same steps";

  at::Tensor bad = seq.narrow(1, 0, 16).contiguous();
  bad[5][3] = 40;
  SaveTensorFile(dir + "/bad.pt", bad, next);
  auto results = TrainOnRanks(
      Spec(common + absl::StrCat("data { shards { format: TENSOR_FILES paths: '", dir,
                                 "/bad.pt' } }")),
      1);
  ASSERT_FALSE(results[0].ok());
  // The token's own bytes: the fourth int64 of sample 5's row of x.
  v1::ShardedData shards;
  shards.set_format(v1::ShardedData::TENSOR_FILES);
  shards.add_paths(dir + "/bad.pt");
  absl::StatusOr<ShardIndex> index = ShardIndex::Build(shards);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(results[0].status().message(),
            absl::StrCat("data.shards: ", dir, "/bad.pt at byte offset ",
                         index->Locate(5).x.offset + 3 * 8,
                         " (sample 5, element 3 of its x row): input token id 40 is not in [0, "
                         "model.transformer_lm.vocab_size 32)"));
}

// Held-out shards whose samples differ in shape from the training shards'
// are refused before training, naming the file and both shapes.
TEST(TrainerTest, HeldOutShardsOfAnotherShapeAreAClearError) {
  const std::string dir = TestDir("held_out_shape");
  WriteClassShards(dir, 1, 16);
  auto tar = TarWriter::Create(dir + "/eval.tar");
  ASSERT_TRUE(tar.ok()) << tar.status();
  const float x[5] = {1, 2, 3, 4, 5};
  const int64_t y = 2;
  ASSERT_TRUE((*tar)->Add("a.x.npy", NpyBytes(ElementType::kFloat32, {5}, x)).ok());
  ASSERT_TRUE((*tar)->Add("a.y.npy", NpyBytes(ElementType::kInt64, {}, &y)).ok());
  ASSERT_TRUE((*tar)->Close().ok());
  v1::JobSpec spec = Spec(absl::StrCat(R"pb(
    model { mlp { hidden_sizes: [ 4 ] } }
    training { batch_size_per_rank: 4 epochs: 1 }
    data { shards { format: TAR paths: ")pb",
                                       dir, R"pb(/train-0.tar" eval_paths: ")pb", dir,
                                       R"pb(/eval.tar" num_classes: 3 } }
  )pb"));
  auto results = TrainOnRanks(spec, 1);
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(results[0].status().message()),
            absl::StrCat("data.shards.eval_paths: ", dir,
                         "/eval.tar holds samples of Float [5] -> Long [] but the training "
                         "shards' are Float [8] -> Long []; held-out samples must have the "
                         "training samples' types and shapes"));
  // A held-out entry that matches nothing is named as such.
  spec.mutable_data()->mutable_shards()->set_eval_paths(0, dir + "/val-*.tar");
  results = TrainOnRanks(spec, 1);
  ASSERT_FALSE(results[0].ok());
  EXPECT_TRUE(absl::StartsWith(results[0].status().message(), "data.shards.eval_paths[0]: "))
      << results[0].status();
}

}  // namespace
}  // namespace chorus
