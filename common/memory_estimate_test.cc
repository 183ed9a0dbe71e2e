#include "common/memory_estimate.h"

#include <cstdint>
#include <limits>
#include <string>

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
  EXPECT_EQ(e.parameters, 104);
  EXPECT_EQ(e.gradients, 104);
  EXPECT_EQ(e.optimizer, 0);        // plain SGD keeps no state
  EXPECT_EQ(e.communication, 0);    // gradients are views into the DDP buckets
  // 10 training + 2 test samples of 3 floats and an int64 label.
  EXPECT_EQ(e.data, 12 * (3 * 4 + 8));
  // 2 samples x (3 inputs + 4 linear + 4 ReLU + 2 outputs) floats, and their gradients.
  EXPECT_EQ(e.activations, 2 * 13 * 4 * 2);
  EXPECT_EQ(e.total_bytes(), 656);
  EXPECT_EQ(e.field, "data.synthetic.num_samples");
  EXPECT_EQ(e.ToString(),
            "about 656 B (parameters 104 B, gradients 104 B, data 240 B, activations 208 B)");
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
  // 3 tokens x (4 + 24 + 2 + 5) values + 3 x 1 head x 3 x 3 attention values.
  EXPECT_EQ(e.activations, (3 * 35 + 27) * 4 * 2);
  EXPECT_EQ(e.total_bytes(), 2056);  // no DDP bucket copies: gradients are views
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
  EXPECT_EQ(e.activations, 125 * 4 * 2);
  EXPECT_EQ(e.data, 6 * (16 * 4 + 8));
  EXPECT_EQ(e.total_bytes(), 2256);
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
  EXPECT_EQ(e.total_bytes(), 2750);
  EXPECT_EQ(e.field, "model.torchscript.path");
  // Unknown sizes count nothing rather than guessing.
  RankMemoryEstimate unknown = EstimateRankMemory(spec);
  EXPECT_EQ(unknown.total_bytes(), 0);
  EXPECT_EQ(EstimateRankMemory(spec, [](const std::string&) -> int64_t { return -1; }).total(), 0);
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
  EXPECT_EQ(e.activations, 1e9 * 13 * 4 * 2);
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

TEST(MemoryEstimateTest, ParseMemTotal) {
  EXPECT_EQ(ParseMemTotal("MemTotal:       24576000 kB\nMemFree:  1 kB\n"), 24576000LL * 1024);
  EXPECT_EQ(ParseMemTotal("MemFree:  1 kB\n"), 0);
  EXPECT_EQ(ParseMemTotal("MemTotal: lots kB\n"), 0);
  EXPECT_GT(MachineMemoryBytes(), 0);  // Linux always has /proc/meminfo
}

}  // namespace
}  // namespace chorus
