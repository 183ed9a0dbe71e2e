#include "common/memory_estimate.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Spec(const std::string& text) {
  v1::JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec)) << text;
  NormalizeJobSpec(spec);
  return spec;
}

// mlp 3 -> 4 -> 2: (3*4 + 4) + (4*2 + 2) = 26 parameters, 104 bytes.
constexpr char kSmallMlp[] = R"pb(
  model { mlp { hidden_sizes: [ 4 ] } }
  data {
    synthetic {
      num_samples: 10
      input_shape: [ 3 ]
      num_classes: 2
    }
  }
  training { batch_size_per_rank: 2 }
)pb";

TEST(MemoryEstimateTest, SmallMlpWithSgdAndDdp) {
  RankMemoryEstimate e = EstimateRankMemory(Spec(kSmallMlp));
  EXPECT_EQ(e.runtime, 180e6);  // LibTorch and the rank's own, whatever the job
  EXPECT_EQ(e.parameters, 104);
  EXPECT_EQ(e.gradients, 104);
  EXPECT_EQ(e.optimizer, 0);        // plain SGD keeps no state
  EXPECT_EQ(e.communication, 0);    // gradients are views into the DDP buckets
  EXPECT_EQ(e.checkpoint, 104);     // the final checkpoint copies the parameters
  // 10 training + 2 test samples of 3 floats and an int64 label.
  EXPECT_EQ(e.data, 12 * (3 * 4 + 8));
  // 2 samples x (3 inputs + 4 linear + 4 ReLU + 2 outputs) floats, 1.5x for
  // what backward holds.
  EXPECT_EQ(e.activations, 2 * 13 * 1.5 * 4);
  // Both test samples in one batch; the ReLU's input and output (4 + 4) is
  // the widest pair of layer outputs.
  EXPECT_EQ(e.evaluation, 2 * 8 * 4);
  EXPECT_EQ(e.total_bytes(), 180e6 + 3 * 104 + 240 + 156);
  EXPECT_EQ(e.field, "model.mlp.hidden_sizes");
  EXPECT_EQ(e.ToString(),
            "about 180.0 MB (runtime 180.0 MB, parameters 104 B, gradients 104 B, checkpoint copy "
            "104 B, data 240 B, the larger of activations 156 B and evaluation 64 B)");
}

TEST(MemoryEstimateTest, CheckpointsAndEvaluationCountOnlyWhenTheJobHasThem) {
  const std::string base = kSmallMlp;
  EXPECT_EQ(EstimateRankMemory(Spec(base + "checkpoint { at_end: false }")).checkpoint, 0);
  EXPECT_EQ(
      EstimateRankMemory(Spec(base + "checkpoint { at_end: false every_steps: 5 }")).checkpoint,
      104);
  EXPECT_EQ(EstimateRankMemory(Spec(base + "optimizer { kind: ADAM }")).checkpoint, 3 * 104);
  RankMemoryEstimate no_eval = EstimateRankMemory(Spec(base + "eval { disabled: true }"));
  EXPECT_EQ(no_eval.evaluation, 0);
  EXPECT_THAT(no_eval.ToString(), HasSubstr("data 240 B, activations 156 B)"));
  // A rank evaluates its share of the split: 1000 test samples over 2 ranks
  // at batch 256 read 256 a batch, over 8 ranks all of their 125 at once.
  v1::JobSpec many = Spec(base);
  many.mutable_data()->mutable_synthetic()->set_num_samples(5000);
  many.mutable_resources()->set_min_ranks(2);
  EXPECT_EQ(EstimateRankMemory(many).evaluation, 256 * 8 * 4);
  many.mutable_resources()->set_min_ranks(8);
  EXPECT_EQ(EstimateRankMemory(many).evaluation, 125 * 8 * 4);
  // Held-out shards of unknown size: a full batch of max(256, batch_size_per_rank).
  many.mutable_training()->set_batch_size_per_rank(300);
  many.mutable_data()->mutable_shards()->add_eval_paths("/d/val-*.tar");
  many.mutable_data()->mutable_shards()->set_num_classes(2);
  many.mutable_data()->mutable_shards()->set_read_ahead_bytes(1);
  EXPECT_EQ(EstimateRankMemory(many).evaluation, 300 * 8 * 4);
}

TEST(MemoryEstimateTest, OptimizerStateAndStrategyBuffers) {
  const std::string base = kSmallMlp;
  EXPECT_EQ(EstimateRankMemory(Spec(base + "optimizer { momentum: 0.9 }")).optimizer, 104);
  EXPECT_EQ(EstimateRankMemory(Spec(base + "optimizer { kind: ADAM }")).optimizer, 208);
  EXPECT_EQ(EstimateRankMemory(Spec(base + "optimizer { kind: ACCUM_ADAMW }")).optimizer, 312);
  // Buckets copy the gradients when .grad is not a view into them.
  EXPECT_EQ(EstimateRankMemory(Spec(base + "strategy { ddp { gradient_as_bucket_view: false } }"))
                .communication,
            104);
  EXPECT_EQ(EstimateRankMemory(Spec(base + "strategy { ddp { compression: FP16 } }")).communication,
            52);
  EXPECT_EQ(EstimateRankMemory(Spec(base + "strategy { decentralized {} }")).communication, 208);
}

// Issue 59's job: nanoGPT's vocabulary, 32 tokens of context, d_model 64.
// Its logits ([B, 32, 50304] floats, 4 copies in a training step, 2 in an
// evaluation batch of 256 sequences) are most of what it holds.
TEST(MemoryEstimateTest, LargeVocabularyLogitsDominate) {
  RankMemoryEstimate e = EstimateRankMemory(Spec(R"pb(
    model { transformer_lm { vocab_size: 50304 context_length: 32 d_model: 64 } }
    data { shards { format: TOKENS paths: "/train.bin" eval_paths: "/val.bin" } }
    training { batch_size_per_rank: 16 }
    optimizer { kind: ADAMW }
  )pb"));
  const double logits = 32 * 50304 * 4.0;  // bytes per sequence
  EXPECT_GT(e.activations, 16 * logits * 4);
  EXPECT_LT(e.activations, 16 * logits * 4 * 1.05);
  EXPECT_GT(e.evaluation, 256 * logits * 2);
  EXPECT_LT(e.evaluation, 256 * logits * 2 * 1.05);
  // Parameters, gradients, two moments, and the checkpoint's copy of all but the gradients.
  EXPECT_DOUBLE_EQ(e.total(), e.runtime + 7 * e.parameters + e.data + e.evaluation);
  EXPECT_THAT(e.ToString(), HasSubstr("about 3.8 GB (runtime 180.0 MB"));
  EXPECT_THAT(e.ToString(), HasSubstr("the larger of activations 421.3 MB and evaluation 3.3 GB"));
  EXPECT_EQ(e.field, "model.transformer_lm");
}

TEST(MemoryEstimateTest, SmallTransformer) {
  RankMemoryEstimate e = EstimateRankMemory(Spec(R"pb(
    model {
      transformer_lm {
        vocab_size: 5
        context_length: 3
        d_model: 2
        num_heads: 1
        num_layers: 1
        d_ff: 4
      }
    }
    data {
      synthetic {
        kind: TOKENS
        num_samples: 5
        input_shape: [ 3 ]
      }
    }
    training { batch_size_per_rank: 1 }
  )pb"));
  // Embeddings 5*2 + 3*2, one block 54, final norm 4, head 2*5 + 5.
  EXPECT_EQ(e.parameters, 89 * 4);
  // 6 sequences of 3 input and 3 target tokens.
  EXPECT_EQ(e.data, 6 * 2 * 3 * 8);
  // 3 tokens x (4 + 24 + 2) values + 3 x 1 head x 3 x 3 attention values,
  // 1.5x for backward; the head's 3 x 5 logits 4x.
  EXPECT_EQ(e.activations, ((3 * 30 + 27) * 1.5 + 3 * 5 * 4) * 4);
  // The one test sequence: a block's 3 x (4 x 2 + 4) values and 4 x 3 x 3
  // attention values, the logits 2x.
  EXPECT_EQ(e.evaluation, (3 * 12 + 36 + 3 * 5 * 2) * 4);
  // No DDP bucket copies: gradients are views.
  EXPECT_EQ(e.total_bytes(), 180e6 + 3 * 89 * 4 + 6 * 2 * 3 * 8 + e.activations);
  EXPECT_EQ(e.field, "model.transformer_lm");
}

TEST(MemoryEstimateTest, SmallCnn) {
  RankMemoryEstimate e = EstimateRankMemory(Spec(R"pb(
    model {
      cnn {
        channels: [ 2, 3 ]
        kernel_size: 3
        fc_hidden: 4
      }
    }
    data {
      synthetic {
        num_samples: 5
        input_shape: [ 1, 4, 4 ]
        num_classes: 2
      }
    }
    training { batch_size_per_rank: 1 }
  )pb"));
  // conv 1*2*9 + 2, conv 2*3*9 + 3, fc 3*1*1*4 + 4, fc 4*2 + 2.
  EXPECT_EQ(e.parameters, 103 * 4);
  EXPECT_EQ(e.activations, 125 * 1.5 * 4);
  // One test sample; the first ReLU's input and output, 2 x 2 x 4 x 4.
  EXPECT_EQ(e.evaluation, 64 * 4);
  EXPECT_EQ(e.data, 6 * (16 * 4 + 8));
  EXPECT_EQ(e.total_bytes(), 180e6 + 3 * 103 * 4 + 6 * (16 * 4 + 8) + 125 * 1.5 * 4);
  EXPECT_EQ(e.field, "model.cnn.channels");
}

TEST(MemoryEstimateTest, ShardsCountTheirReadAheadBufferNotTheFiles) {
  const v1::JobSpec spec = Spec(R"pb(
    model { transformer_lm { vocab_size: 256 context_length: 64 } }
    data { shards { format: TOKENS paths: "/train.bin" read_ahead_bytes: 1000000 } }
  )pb");
  RankMemoryEstimate e = EstimateRankMemory(spec, [](const std::string&) -> int64_t {
    return int64_t{1} << 40;  // a terabyte of tokens is never held
  });
  EXPECT_EQ(e.data, 1000000);
  // A directory of tensor files is streamed too: not its files' sizes.
  const v1::JobSpec files = Spec(R"pb(
    model { mlp {} }
    data {
      shards {
        format: TENSOR_FILES
        paths: "/d/train-*.pt"
        num_classes: 10
        read_ahead_bytes: 2000000
      }
    }
  )pb");
  e = EstimateRankMemory(files, [](const std::string&) -> int64_t { return int64_t{1} << 40; });
  EXPECT_EQ(e.data, 2000000);
  // Held-out shards are read through a second buffer of the same size.
  v1::JobSpec held_out = files;
  held_out.mutable_data()->mutable_shards()->add_eval_paths("/d/val-*.pt");
  e = EstimateRankMemory(held_out, [](const std::string&) -> int64_t { return int64_t{1} << 40; });
  EXPECT_EQ(e.data, 4000000);
}

TEST(MemoryEstimateTest, FilesCountTheirSizeAsALowerBound) {
  const v1::JobSpec spec = Spec(R"pb(
    model { torchscript { path: "/m.pt" } }
    data { tensor_file { path: "/train.pt" eval_path: "/test.pt" } }
  )pb");
  RankMemoryEstimate e = EstimateRankMemory(spec, [](const std::string& path) -> int64_t {
    if (path == "/m.pt") return 1000;
    if (path == "/train.pt") return 500;
    if (path == "/test.pt") return 250;
    return -1;
  });
  EXPECT_EQ(e.parameters, 1000);
  EXPECT_EQ(e.data, 750);
  EXPECT_EQ(e.total_bytes(), 180e6 + 3 * 1000 + 750);  // SGD: the checkpoint copies the module
  EXPECT_EQ(e.field, "model.torchscript.path");
  // Unknown sizes count nothing rather than guessing: only the runtime.
  RankMemoryEstimate unknown = EstimateRankMemory(spec);
  EXPECT_EQ(unknown.total_bytes(), 180e6);
  EXPECT_EQ(EstimateRankMemory(spec, [](const std::string&) -> int64_t { return -1; }).total(),
            180e6);
}

TEST(MemoryEstimateTest, HugeHiddenLayerIsBlamedOnTheModel) {
  RankMemoryEstimate e = EstimateRankMemory(
      Spec("model { mlp { hidden_sizes: [2000000000] } } data { synthetic {} }"));
  // (32 + 1) * 2e9 + 2e9 * 10 + 10 parameters.
  EXPECT_EQ(e.parameters, 86000000010.0 * 4);
  EXPECT_EQ(e.field, "model.mlp.hidden_sizes");
  EXPECT_GT(e.total(), 1e12);
  EXPECT_LT(e.total(), kMaxRankMemoryBytes);
  EXPECT_THAT(e.ToString(), HasSubstr("parameters 344.0 GB"));
}

TEST(MemoryEstimateTest, HugeInputIsBlamedOnTheDataAndDoesNotWrap) {
  RankMemoryEstimate e = EstimateRankMemory(
      Spec("model { mlp {} } data { synthetic { input_shape: [100000, 100000] } }"));
  // 4096 + 819 samples of 1e10 floats and a label.
  EXPECT_EQ(e.data, 4915 * (1e10 * 4 + 8));
  EXPECT_EQ(e.field, "data.synthetic.input_shape");
  EXPECT_GT(e.total(), kMaxRankMemoryBytes);

  // An int64 product of these would wrap; the estimate saturates instead.
  RankMemoryEstimate huge = EstimateRankMemory(Spec(
      "model { mlp {} } data { synthetic { input_shape: [1000000000, 1000000000, 1000000000] } }"));
  EXPECT_GT(huge.total(), 1e30);
  EXPECT_EQ(huge.total_bytes(), std::numeric_limits<int64_t>::max());
}

TEST(MemoryEstimateTest, LargeBatchIsBlamedOnTheBatchSize) {
  v1::JobSpec spec = Spec(kSmallMlp);
  spec.mutable_training()->set_batch_size_per_rank(1000000000);
  RankMemoryEstimate e = EstimateRankMemory(spec);
  EXPECT_EQ(e.activations, 1e9 * 13 * 1.5 * 4);
  EXPECT_EQ(e.field, "training.batch_size_per_rank");
}

TEST(MemoryEstimateTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(999), "999 B");
  EXPECT_EQ(FormatBytes(1500), "1.5 kB");
  EXPECT_EQ(FormatBytes(999999), "1.0 MB");
  EXPECT_EQ(FormatBytes(16e12), "16.0 TB");
  EXPECT_EQ(FormatBytes(2.5e18), "2.5 EB");
}

// Memory limits are set in binary units, and a limit of 4 << 30 must read
// "4 GiB" in a job's reason, not "4.3 GB".
TEST(MemoryEstimateTest, FormatBinaryBytes) {
  EXPECT_EQ(FormatBinaryBytes(0), "0 B");
  EXPECT_EQ(FormatBinaryBytes(1023), "1023 B");
  EXPECT_EQ(FormatBinaryBytes(1024), "1 KiB");
  EXPECT_EQ(FormatBinaryBytes(int64_t{256} << 20), "256 MiB");
  EXPECT_EQ(FormatBinaryBytes(int64_t{4} << 30), "4 GiB");
  EXPECT_EQ(FormatBinaryBytes(int64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(FormatBinaryBytes((int64_t{1} << 30) + 1), "1.0 GiB");
  EXPECT_EQ(FormatBinaryBytes(int64_t{64} << 40), "64 TiB");
}

TEST(MemoryEstimateTest, ParseMemTotal) {
  EXPECT_EQ(ParseMemTotal("MemTotal:       24576000 kB\nMemFree:  1 kB\n"), 24576000LL * 1024);
  EXPECT_EQ(ParseMemTotal("MemFree:  1 kB\n"), 0);
  EXPECT_EQ(ParseMemTotal("MemTotal: lots kB\n"), 0);
  EXPECT_GT(MachineMemoryBytes(), 0);  // Linux always has /proc/meminfo
}

TEST(MemoryEstimateTest, PeakResidentBytes) {
  EXPECT_EQ(ParseVmHwm("VmPeak:  9000 kB\nVmHWM:    2048 kB\nVmRSS:  1024 kB\n"), 2048 * 1024);
  EXPECT_EQ(ParseVmHwm("VmRSS:  1024 kB\n"), 0);
  const int64_t before = PeakResidentBytes();
  EXPECT_GT(before, 0);
  // 64 MiB written: the peak holds them.
  std::vector<char> block(size_t{64} << 20, 1);
  ASSERT_EQ(block[12345], 1);
  EXPECT_GE(PeakResidentBytes(), std::max(before, int64_t{64} << 20));
}

}  // namespace
}  // namespace chorus
