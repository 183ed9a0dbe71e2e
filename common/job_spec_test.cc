#include "common/job_spec.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using v1::JobSpec;

bool SameSpec(const JobSpec& a, const JobSpec& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

// The same job written in each of the three formats.
constexpr char kText[] = R"pb(
  name: "same"
  model {
    cnn {
      channels: [ 8, 16 ]
      kernel_size: 3
    }
  }
  data { fashion_mnist {} }
  training { batch_size_per_rank: 32 epochs: 2 shuffle: false }
  optimizer { kind: ADAMW lr: 0.002 weight_decay: 0.01 }
  strategy { ddp { bucket_cap_mb: 4 compression: BF16 ignored: "running_" } }
  resources { min_ranks: 2 max_ranks: 3 }
)pb";

constexpr char kJson[] = R"({
  "name": "same",
  "model": {"cnn": {"channels": [8, 16], "kernelSize": 3}},
  "data": {"fashion_mnist": {}},
  "training": {"batch_size_per_rank": 32, "epochs": 2, "shuffle": false},
  "optimizer": {"kind": "ADAMW", "lr": 0.002, "weight_decay": 0.01},
  "strategy": {"ddp": {"bucket_cap_mb": 4, "compression": "BF16", "ignored": ["running_"]}},
  "resources": {"min_ranks": 2, "max_ranks": 3}
})";

constexpr char kYaml[] = R"(
name: same
model:
  cnn: {channels: [8, 16], kernel_size: 3}
data:
  fashion_mnist: {}
training:
  batch_size_per_rank: 32
  epochs: 2
  shuffle: false
optimizer: {kind: ADAMW, lr: 0.002, weight_decay: 1.0e-2}
strategy:
  ddp:
    bucket_cap_mb: 4
    compression: BF16
    ignored: ["running_"]
resources: {min_ranks: 2, max_ranks: 3}
)";

JobSpec MustParse(const char* text, SpecFormat format) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text, format, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

TEST(JobSpecTest, ThreeFormatsParseToTheSameMessage) {
  JobSpec text = MustParse(kText, SpecFormat::kTextProto);
  JobSpec json = MustParse(kJson, SpecFormat::kJson);
  JobSpec yaml = MustParse(kYaml, SpecFormat::kYaml);
  EXPECT_EQ(text.model().cnn().channels(1), 16);
  EXPECT_EQ(text.strategy().ddp().compression(), v1::DdpStrategy::BF16);
  EXPECT_TRUE(text.training().has_shuffle());
  EXPECT_FALSE(text.training().shuffle());
  EXPECT_TRUE(SameSpec(text, json)) << JobSpecToText(json);
  EXPECT_TRUE(SameSpec(text, yaml)) << JobSpecToText(yaml);
}

TEST(JobSpecTest, NormalizationFillsDocumentedDefaultsOnly) {
  JobSpec spec = MustParse(kText, SpecFormat::kTextProto);
  NormalizeJobSpec(spec);
  EXPECT_EQ(spec.model().cnn().fc_hidden(), 128);
  EXPECT_EQ(spec.model().cnn().kernel_size(), 3);  // user's value kept
  EXPECT_EQ(spec.data().fashion_mnist().dir(), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(spec.data().remainder(), v1::DataSpec::DROP);
  EXPECT_FALSE(spec.training().shuffle());  // explicit false survives
  EXPECT_EQ(spec.training().log_every_steps(), 10);
  EXPECT_EQ(spec.strategy().ddp().first_bucket_mb(), 1);
  EXPECT_EQ(spec.strategy().ddp().bucket_cap_mb(), 4);
  EXPECT_TRUE(spec.strategy().ddp().broadcast_buffers());
  EXPECT_EQ(spec.strategy().ddp().grad_accum_steps(), 1);
  EXPECT_EQ(spec.resources().threads_per_rank(), 1);
  EXPECT_EQ(spec.resources().max_processes(), 4096);
  EXPECT_EQ(spec.resources().memory_bytes(), 0);  // derived at launch: RankMemoryLimitBytes
  EXPECT_EQ(spec.resources().device(), v1::ResourceSpec::CPU);
  EXPECT_EQ(spec.checkpoint().keep_last(), 3);
  EXPECT_TRUE(spec.checkpoint().at_end());
  EXPECT_EQ(spec.hang_detection().dead_after_seconds(), 5);
  EXPECT_EQ(spec.hang_detection().stall_after_seconds(), 3);
  EXPECT_EQ(spec.hang_detection().action(), v1::HangDetectionSpec::REPORT);
  EXPECT_TRUE(spec.lr_schedule().has_constant());

  JobSpec again = spec;
  NormalizeJobSpec(again);
  EXPECT_TRUE(SameSpec(spec, again)) << "normalization must be idempotent";
  EXPECT_THAT(ValidateJobSpec(spec), IsEmpty());
}

// Note [Paths in one form]: the coordinator and the ranks build paths from
// these and compare them byte for byte.
TEST(JobSpecTest, NormalizationStoresEveryPathInOneForm) {
  auto spec = ParseJobSpec(
      "model { torchscript { path: '/m//model.pt' } } "
      "data { tensor_file { path: '/d/./train.pt' eval_path: '/d/x/../eval.pt' } } "
      "checkpoint { storage: SHARED_DIR shared_dir: '/mnt/ckpt/' }",
      SpecFormat::kTextProto, "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  NormalizeJobSpec(*spec);
  EXPECT_EQ(spec->model().torchscript().path(), "/m/model.pt");
  EXPECT_EQ(spec->data().tensor_file().path(), "/d/train.pt");
  EXPECT_EQ(spec->data().tensor_file().eval_path(), "/d/eval.pt");
  EXPECT_EQ(spec->checkpoint().shared_dir(), "/mnt/ckpt");
  auto program = ParseJobSpec(
      "program { argv: 'python3' working_dir: '/home/u/run/' } "
      "checkpoint { storage: SHARED_DIR shared_dir: '/nfs//c/' }",
      SpecFormat::kTextProto, "test");
  ASSERT_TRUE(program.ok()) << program.status();
  NormalizeJobSpec(*program);
  EXPECT_EQ(program->program().working_dir(), "/home/u/run");
  EXPECT_EQ(program->checkpoint().shared_dir(), "/nfs/c");
  EXPECT_FALSE(program->has_data()) << "nothing of the built-in trainer is added";
  EXPECT_FALSE(program->has_model());
}

TEST(JobSpecTest, ShardsGetTheirDefaultsAndNormalPaths) {
  auto spec = ParseJobSpec(
      "model { transformer_lm { context_length: 48 } } "
      "data { shards { format: TOKENS paths: ['/d/./train.bin', '/d/x/../shard-*.bin'] } }",
      SpecFormat::kTextProto, "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  NormalizeJobSpec(*spec);
  EXPECT_THAT(ValidateJobSpec(*spec), IsEmpty());
  const v1::ShardedData& s = spec->data().shards();
  EXPECT_EQ(s.paths(0), "/d/train.bin");
  EXPECT_EQ(s.paths(1), "/d/shard-*.bin");
  EXPECT_EQ(s.sequence_length(), 48);
  EXPECT_EQ(s.token_type(), v1::ShardedData::UINT16);
  EXPECT_EQ(s.read_ahead_bytes(), 64 << 20);
  EXPECT_EQ(s.shuffle_buffer(), 4096);
  auto tar = ParseJobSpec(
      "model { mlp {} } data { shards { format: TAR paths: '/d/a.tar' num_classes: 10 } }",
      SpecFormat::kTextProto, "test");
  ASSERT_TRUE(tar.ok()) << tar.status();
  NormalizeJobSpec(*tar);
  EXPECT_THAT(ValidateJobSpec(*tar), IsEmpty());
  EXPECT_EQ(tar->data().shards().input_member(), "x.npy");
  EXPECT_EQ(tar->data().shards().target_member(), "y.npy");
  // Every member type that is read, and tensor_file shards (no members).
  for (const char* data :
       {"format: TAR paths: '/d/a.tar' num_classes: 10 input_member: 'x.pt' target_member: "
        "'y.pth'",
        // WebDataset's own names: KEY.npy with its label as KEY.cls, .txt or .json.
        "format: TAR paths: '/d/a.tar' num_classes: 10 input_member: 'npy' target_member: 'cls'",
        "format: TAR paths: '/d/a.tar' num_classes: 10 input_member: 'x.npy' target_member: "
        "'label.txt'",
        "format: TAR paths: '/d/a.tar' num_classes: 10 target_member: 'json'",
        "format: TENSOR_FILES paths: '/d/train-*.pt' num_classes: 10"}) {
    auto other = ParseJobSpec(absl::StrCat("model { mlp {} } data { shards { ", data, " } }"),
                              SpecFormat::kTextProto, "test");
    ASSERT_TRUE(other.ok()) << other.status();
    NormalizeJobSpec(*other);
    EXPECT_THAT(ValidateJobSpec(*other), IsEmpty()) << data;
  }
}

TEST(JobSpecTest, ElasticDefaultsOnlyWhenTheBlockIsThere) {
  JobSpec plain = MustParse("model { mlp {} } data { synthetic {} }", SpecFormat::kTextProto);
  NormalizeJobSpec(plain);
  EXPECT_FALSE(plain.has_elastic());

  JobSpec elastic =
      MustParse("model { mlp {} } data { synthetic {} } elastic {}", SpecFormat::kTextProto);
  NormalizeJobSpec(elastic);
  ASSERT_TRUE(elastic.has_elastic());
  EXPECT_EQ(elastic.elastic().max_restarts(), 3);
  EXPECT_EQ(elastic.elastic().wait_seconds(), 60);
  EXPECT_EQ(elastic.elastic().scale_up_interval_seconds(), 60);
  EXPECT_FALSE(elastic.elastic().scale_lr());
  EXPECT_THAT(ValidateJobSpec(elastic), IsEmpty());

  // max_restarts 0 is kept: the job survives no failure.
  JobSpec none = MustParse("model { mlp {} } data { synthetic {} } elastic { max_restarts: 0 }",
                           SpecFormat::kTextProto);
  NormalizeJobSpec(none);
  EXPECT_EQ(none.elastic().max_restarts(), 0);

  // A program job's block gets the same defaults and checks (it used to get
  // neither: max_restarts 0 and a generation due within 0 s).
  JobSpec program = MustParse("program { argv: '/usr/bin/python3' } elastic {}",
                              SpecFormat::kTextProto);
  NormalizeJobSpec(program);
  EXPECT_EQ(program.elastic().max_restarts(), 3);
  EXPECT_EQ(program.elastic().wait_seconds(), 60);
  EXPECT_EQ(program.elastic().scale_up_interval_seconds(), 60);
  EXPECT_THAT(ValidateJobSpec(program), IsEmpty());
  program.mutable_elastic()->set_wait_seconds(-5);
  std::vector<SpecError> refused = ValidateJobSpec(program);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].field, "elastic.wait_seconds");
  EXPECT_EQ(refused[0].message, "must be > 0, got -5");

  // Gossip jobs re-form too. A size the topology does not serve trains
  // with the largest one it does and keeps the rest as hot spares.
  JobSpec gossip = MustParse(
      "model { mlp {} } data { synthetic {} } elastic {} strategy { decentralized { topology: RING "
      "} } resources { min_ranks: 2 max_ranks: 5 }",
      SpecFormat::kTextProto);
  NormalizeJobSpec(gossip);
  EXPECT_THAT(ValidateJobSpec(gossip), IsEmpty()) << "3 and 5 ranks: 2 and 4 train, 1 spare";
  // Without the elastic block the job never re-forms: every size must be served.
  gossip.clear_elastic();
  std::vector<SpecError> errors = ValidateJobSpec(gossip);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].field, "strategy.decentralized.topology");
  EXPECT_THAT(errors[0].message, HasSubstr("unservable: 3,5"));
  // Some sizes serve no ranks at all: one rank of nodes of two.
  JobSpec nodes = MustParse(
      "model { mlp {} } data { synthetic {} } elastic {} strategy { decentralized { topology: "
      "ALTERNATING_EXPONENTIAL_RING local_world_size: 2 } } resources { min_ranks: 1 max_ranks: "
      "4 }",
      SpecFormat::kTextProto);
  NormalizeJobSpec(nodes);
  errors = ValidateJobSpec(nodes);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].field, "strategy.decentralized.local_world_size");
  EXPECT_THAT(errors[0].message, HasSubstr("unservable: 1)"));
  gossip.mutable_strategy()->mutable_decentralized()->set_topology(
      v1::DecentralizedStrategy::COMPLETE);
  EXPECT_THAT(ValidateJobSpec(gossip), IsEmpty());
}

TEST(JobSpecTest, MinimalSpecGetsDdpAndOneRank) {
  JobSpec spec = MustParse("model { mlp {} } data { synthetic {} }", SpecFormat::kTextProto);
  NormalizeJobSpec(spec);
  EXPECT_TRUE(spec.strategy().has_ddp());
  EXPECT_EQ(spec.resources().min_ranks(), 1);
  EXPECT_EQ(spec.resources().max_ranks(), 1);
  EXPECT_EQ(spec.training().epochs(), 1);
  EXPECT_THAT(spec.model().mlp().hidden_sizes(), ElementsAre(256, 128));
  EXPECT_EQ(spec.data().synthetic().kind(), v1::SyntheticData::CLASSIFICATION);
  EXPECT_EQ(spec.optimizer().lr(), 0.01);
  EXPECT_THAT(ValidateJobSpec(spec), IsEmpty());
}

TEST(JobSpecTest, TextRoundTripIsExact) {
  JobSpec spec = MustParse(kYaml, SpecFormat::kYaml);
  NormalizeJobSpec(spec);
  JobSpec from_text = MustParse(JobSpecToText(spec).c_str(), SpecFormat::kTextProto);
  JobSpec from_json = MustParse(JobSpecToJson(spec).c_str(), SpecFormat::kJson);
  EXPECT_TRUE(SameSpec(spec, from_text));
  EXPECT_TRUE(SameSpec(spec, from_json));
}

TEST(JobSpecTest, UnknownFieldsAreErrorsInEveryFormat) {
  auto text =
      ParseJobSpec("model { mlp { hiden_sizes: 3 } }", SpecFormat::kTextProto, "a.textproto");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("a.textproto"));
  EXPECT_THAT(text.status().message(), HasSubstr("job spec a.textproto:1:26: "));
  EXPECT_THAT(text.status().message(), HasSubstr("hiden_sizes"));

  auto json =
      ParseJobSpec(R"({"model": {"mlp": {"hiden_sizes": [3]}}})", SpecFormat::kJson, "a.json");
  ASSERT_FALSE(json.ok());
  EXPECT_THAT(json.status().message(), HasSubstr("hiden_sizes"));

  auto yaml = ParseJobSpec("training:\n  batch_sise: 3\n", SpecFormat::kYaml, "a.yaml");
  ASSERT_FALSE(yaml.ok());
  EXPECT_THAT(yaml.status().message(), HasSubstr("a.yaml"));
  EXPECT_THAT(yaml.status().message(), HasSubstr("batch_sise"));
}

// Note [YAML aliases] in common/job_spec.cc.
TEST(JobSpecTest, YamlAliasesUsedAsMeantPass) {
  JobSpec spec = MustParse(
      "model:\n  cnn: {channels: &widths [8, 16], kernel_size: &k 3}\n"
      "training: {batch_size_per_rank: *k, epochs: *k}\n",
      SpecFormat::kYaml);
  EXPECT_EQ(spec.model().cnn().channels_size(), 2);
  EXPECT_EQ(spec.training().batch_size_per_rank(), 3);
  EXPECT_EQ(spec.training().epochs(), 3);
}

TEST(JobSpecTest, AYamlNodeInsideItselfIsRefusedWithItsPath) {
  for (const char* text : {"model: &x {mlp: *x}\n", "a: &x [*x]\n", "a: &x {b: [1, {c: *x}]}\n"}) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(text, SpecFormat::kYaml, "loop.yaml");
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr("loop.yaml"));
    EXPECT_THAT(spec.status().message(),
                HasSubstr("an alias refers to a node that contains it (a spec is a tree)"));
  }
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec("a: &x {b: [1, {c: *x}]}\n", SpecFormat::kYaml, "loop.yaml");
  EXPECT_THAT(spec.status().message(), HasSubstr("loop.yaml: a.b[1].c: an alias"));
}

TEST(JobSpecTest, AliasesOfAliasesThatExpandToGigabytesAreRefused) {
  // Nine levels of ten aliases each: under 1 KB written, 10^9 strings meant.
  std::string text = "l0: &l0 [\"aaaaaaaaaaaaaaaa\"]\n";
  for (int level = 1; level <= 9; ++level) {
    absl::StrAppend(&text, "l", level, ": &l", level, " [");
    for (int i = 0; i < 10; ++i) absl::StrAppend(&text, i > 0 ? ", " : "", "*l", level - 1);
    text += "]\n";
  }
  ASSERT_LT(text.size(), 1000u);
  const absl::Time start = absl::Now();
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text, SpecFormat::kYaml, "laughs.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(),
              HasSubstr("the spec's aliases expand it past 1 MiB (the largest spec is 256 KiB)"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));

  std::string deep = "a: ";
  for (int i = 0; i < 100; ++i) deep += "[";
  for (int i = 0; i < 100; ++i) deep += "]";
  spec = ParseJobSpec(deep + "\n", SpecFormat::kYaml, "deep.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("nested more than 64 levels deep"));
}

TEST(JobSpecTest, SyntaxErrorsNameFileAndPosition) {
  auto yaml = ParseJobSpec("model:\n  mlp: {hidden_sizes: [1, 2\n", SpecFormat::kYaml, "bad.yaml");
  ASSERT_FALSE(yaml.ok());
  EXPECT_THAT(yaml.status().message(), HasSubstr("bad.yaml:"));

  auto list = ParseJobSpec("- 1\n- 2\n", SpecFormat::kYaml, "list.yaml");
  ASSERT_FALSE(list.ok());
  EXPECT_THAT(list.status().message(), HasSubstr("top level must be a mapping"));

  auto enum_value =
      ParseJobSpec("optimizer { kind: LBFGS }", SpecFormat::kTextProto, "e.textproto");
  ASSERT_FALSE(enum_value.ok());
  EXPECT_THAT(enum_value.status().message(), HasSubstr("LBFGS"));
}

// Found by //common:job_spec_fuzzer: a spec whose strings are not UTF-8 was
// accepted, then could not be sent (proto3 strings must be UTF-8) or came
// back changed from its JSON form.
TEST(JobSpecTest, StringsMustBeUtf8InEveryFormat) {
  auto text = ParseJobSpec("data { tensor_file { path: \"/d/\\322x.pt\" } }",
                           SpecFormat::kTextProto, "t.textproto");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("t.textproto"));
  EXPECT_THAT(text.status().message(), HasSubstr("data.tensor_file.path"));
  EXPECT_THAT(text.status().message(), HasSubstr("UTF-8"));

  auto yaml =
      ParseJobSpec("strategy: {ddp: {ignored: [ok, \"b\xd2\"]}}\n", SpecFormat::kYaml, "y.yaml");
  ASSERT_FALSE(yaml.ok());  // refused by the JSON parser YAML goes through
  EXPECT_EQ(yaml.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(yaml.status().message(), HasSubstr("y.yaml"));

  auto repeated = ParseJobSpec("strategy { ddp { ignored: [\"ok\", \"b\\322\"] } }",
                               SpecFormat::kTextProto, "r.textproto");
  ASSERT_FALSE(repeated.ok());
  EXPECT_THAT(repeated.status().message(), HasSubstr("strategy.ddp.ignored[1]"));

  // Multi-byte UTF-8 is text like any other.
  auto utf8 = ParseJobSpec("name: \"caf\303\251\"", SpecFormat::kTextProto, "u.textproto");
  ASSERT_TRUE(utf8.ok()) << utf8.status();
  EXPECT_EQ(utf8->name(), "caf\xc3\xa9");
}

TEST(JobSpecTest, YamlQuotedScalarsStayStrings) {
  JobSpec spec =
      MustParse("name: \"123\"\nmodel: {torchscript: {path: '/m/model.pt'}}\n", SpecFormat::kYaml);
  EXPECT_EQ(spec.name(), "123");
  EXPECT_EQ(spec.model().torchscript().path(), "/m/model.pt");
}

TEST(JobSpecTest, FormatFromPath) {
  EXPECT_EQ(*SpecFormatFromPath("a/b.textproto"), SpecFormat::kTextProto);
  EXPECT_EQ(*SpecFormatFromPath("b.PBTXT"), SpecFormat::kTextProto);
  EXPECT_EQ(*SpecFormatFromPath("b.json"), SpecFormat::kJson);
  EXPECT_EQ(*SpecFormatFromPath("b.yml"), SpecFormat::kYaml);
  auto bad = SpecFormatFromPath("b.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr(".textproto/.pbtxt, .json or .yaml/.yml"));
}

TEST(JobSpecTest, LoadReportsMissingFile) {
  auto spec = LoadJobSpec("/nonexistent/job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(spec.status().message(), HasSubstr("/nonexistent/job.yaml"));
}

TEST(JobSpecTest, EveryExampleLoadsAndValidates) {
  for (const char* path :
       {"examples/fashion_mnist_mlp_ddp.textproto", "examples/fashion_mnist_cnn_ddp.textproto",
        "examples/transformer_lm_ddp.textproto",
        "examples/torchscript/fashion_mnist_torchscript.textproto",
        "examples/synthetic_mlp_ddp.json", "examples/transformer_lm_decentralized.yaml"}) {
    absl::StatusOr<JobSpec> spec = LoadJobSpec(path);
    EXPECT_TRUE(spec.ok()) << path << ": " << spec.status();
  }
  JobSpec lm = *LoadJobSpec("examples/transformer_lm_decentralized.yaml");
  EXPECT_EQ(lm.strategy().decentralized().topology(),
            v1::DecentralizedStrategy::ONE_PEER_EXPONENTIAL);
  EXPECT_EQ(lm.model().transformer_lm().d_ff(), 512);
  EXPECT_EQ(lm.data().synthetic().input_shape(0), 64);
}

// ---------------------------------------------------------------- validation

// Parses `text`, adds an MLP and synthetic data where it sets none, normalizes, and returns the
// errors as "field: message" strings.
std::vector<std::string> Errors(const std::string& text) {
  JobSpec spec = MustParse(text.c_str(), SpecFormat::kTextProto);
  if (spec.model().kind_case() == v1::ModelSpec::KIND_NOT_SET) spec.mutable_model()->mutable_mlp();
  if (spec.data().source_case() == v1::DataSpec::SOURCE_NOT_SET) {
    spec.mutable_data()->mutable_synthetic();
  }
  NormalizeJobSpec(spec);
  std::vector<std::string> out;
  for (const SpecError& e : ValidateJobSpec(spec)) out.push_back(e.field + ": " + e.message);
  return out;
}

TEST(JobSpecValidationTest, ValidBaseHasNoErrors) { EXPECT_THAT(Errors(""), IsEmpty()); }

TEST(JobSpecValidationTest, MissingModelAndData) {
  JobSpec spec;
  NormalizeJobSpec(spec);
  std::vector<std::string> fields;
  for (const SpecError& e : ValidateJobSpec(spec)) fields.push_back(e.field);
  EXPECT_THAT(fields, ElementsAre("model", "data"));
}

struct Case {
  const char* spec;
  const char* expected;  // exact "field: message"
};

class ValidationCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(ValidationCaseTest, ReportsFieldAndAllowedRange) {
  std::vector<std::string> errors = Errors(GetParam().spec);
  EXPECT_THAT(errors, ElementsAre(GetParam().expected)) << GetParam().spec;
}

INSTANTIATE_TEST_SUITE_P(
    EveryRule, ValidationCaseTest,
    ::testing::Values(
        Case{"strategy { ddp { bucket_cap_mb: -3 } }",
             "strategy.ddp.bucket_cap_mb: must be > 0, got -3"},
        Case{"strategy { ddp { first_bucket_mb: -1 } }",
             "strategy.ddp.first_bucket_mb: must be > 0, got -1"},
        Case{"strategy { ddp { grad_accum_steps: -2 } }",
             "strategy.ddp.grad_accum_steps: must be >= 1, got -2"},
        Case{"training { global_batch_size: -8 }",
             "training.global_batch_size: must be >= 0, got -8"},
        Case{"training { batch_size_per_rank: 16 global_batch_size: 96 } "
             "resources { min_ranks: 2 max_ranks: 4 }",
             "training.global_batch_size: 96 does not split into micro-batches of "
             "training.batch_size_per_rank 16 on each of 4 ranks: it must be a multiple of 16 x "
             "4 = 64, and so at every world size from resources.min_ranks 2 to max_ranks 4 (e.g. "
             "192)"},
        Case{"training { batch_size_per_rank: 16 global_batch_size: 40 }",
             "training.global_batch_size: 40 does not split into micro-batches of "
             "training.batch_size_per_rank 16 on each of 1 ranks: it must be a multiple of 16 x "
             "1 = 16, and so at every world size from resources.min_ranks 1 to max_ranks 1 (e.g. "
             "16)"},
        Case{"training { batch_size_per_rank: 8 global_batch_size: 64 } "
             "strategy { decentralized { topology: COMPLETE } }",
             "training.global_batch_size: needs strategy ddp: gossip averaging has no global "
             "batch to keep"},
        Case{"training { batch_size_per_rank: 8 global_batch_size: 64 } "
             "strategy { ddp { grad_accum_steps: 2 } }",
             "training.global_batch_size: sets the micro-batches per step itself; remove "
             "strategy.ddp.grad_accum_steps (2)"},
        Case{"training { batch_size_per_rank: 8 global_batch_size: 96 } "
             "resources { min_ranks: 2 max_ranks: 4 } elastic { scale_lr: true }",
             "training.global_batch_size: keeps every step the same at every world size, "
             "elastic.scale_lr changes the learning rate with it: use one of them"},
        Case{"strategy { ddp { ignored: '' } }",
             "strategy.ddp.ignored[0]: must be a parameter or buffer name or prefix, got an empty "
             "string"},
        Case{"name: 'my job!'",
             "name: may hold letters, digits, '-', '_' and '.', got \"my job!\""},
        Case{"model { mlp { hidden_sizes: [64, 0] } }",
             "model.mlp.hidden_sizes[1]: must be > 0, got 0"},
        Case{"model { mlp { dropout: 1 } }", "model.mlp.dropout: must be in [0, 1), got 1"},
        Case{"model { cnn { channels: [4] } }",
             "model.cnn.channels: must list 2 values (one per conv layer), got 1"},
        Case{"model { cnn { kernel_size: 4 } }",
             "model.cnn.kernel_size: must be odd and in [1, 11], got 4"},
        Case{"model { torchscript { } }",
             "model.torchscript.path: is required: the file written by torch.jit.save"},
        Case{"model { transformer_lm { d_model: 100 num_heads: 3 } } data { synthetic { kind: "
             "TOKENS } }",
             "model.transformer_lm.d_model: must be divisible by num_heads (3), got 100"},
        Case{"model { transformer_lm { } } data { fashion_mnist { } }",
             "data: model.transformer_lm needs token data: use synthetic { kind: TOKENS }, a "
             "tensor_file or shards (TOKENS, or TAR and TENSOR_FILES of int64 token sequences)"},
        Case{"model { transformer_lm { } } data { shards { format: TENSOR_FILES paths: '/d/*.pt' "
             "num_classes: 10 } }",
             "data.shards.num_classes: is for classification; a transformer_lm's classes are its "
             "tokens (model.transformer_lm.vocab_size)"},
        Case{"data { shards { paths: '/d/a.tar' num_classes: 10 } }",
             "data.shards.format: must be TAR, TOKENS or TENSOR_FILES, got 0"},
        Case{"data { shards { format: TAR num_classes: 10 } }",
             "data.shards.paths: is required: the shard files (paths or globs such as "
             "/data/train-*.tar)"},
        Case{"data { shards { format: TAR paths: '/d/a.tar' } }",
             "data.shards.num_classes: is required with CROSS_ENTROPY loss: the number of classes "
             "of the targets"},
        Case{"data { shards { format: TAR paths: '/d/a.tar' num_classes: 3 input_member: "
             "'x.pt' target_member: 'label' } }",
             "data.shards.target_member: must end in .npy (NumPy), .pt or .pth (torch.save of a "
             "tensor), or .cls, .txt or .json (an integer class label as text), the member types "
             "that are read; got \"label\""},
        Case{"data { shards { format: TAR paths: '/d/a.tar' num_classes: 3 input_member: "
             "'cls' target_member: 'y.npy' } }",
             "data.shards.input_member: a text member (.cls, .txt, .json) holds a label: it can "
             "be the target_member, not the input; must end in .npy (NumPy), .pt or .pth "
             "(torch.save of a tensor), the member types that are read; got \"cls\""},
        Case{"data { shards { format: TAR paths: '/d/a.tar' num_classes: 3 input_member: "
             "'jpg' target_member: 'cls' } }",
             "data.shards.input_member: \"jpg\" members are images, which are not decoded (image "
             "decoding is out of scope): store each sample's decoded pixels as a .npy member "
             "instead (uint8 [H, W, C], numpy.save), e.g. KEY.x.npy, and set this field to "
             "\"x.npy\""},
        Case{"data { shards { format: TENSOR_FILES paths: '/d/*.pt' num_classes: 3 "
             "input_member: 'x.pt' } }",
             "data.shards.input_member: and target_member are for format TAR; TENSOR_FILES files "
             "hold dicts with keys 'x' and 'y'"},
        Case{"data { shards { format: TENSOR_FILES paths: '/d/*.pt' } }",
             "data.shards.num_classes: is required with CROSS_ENTROPY loss: the number of classes "
             "of the targets"},
        Case{
            "data { shards { format: TAR paths: '/d/a.tar' num_classes: 3 read_ahead_bytes: -1 } }",
            "data.shards.read_ahead_bytes: must be > 0, got -1"},
        Case{"data { shards { format: TAR paths: ['/d/a.tar', ''] num_classes: 3 } }",
             "data.shards.paths[1]: is empty"},
        Case{"data { shards { format: TAR paths: '/d/a.tar' eval_paths: ['/d/v.tar', ''] "
             "num_classes: 3 } }",
             "data.shards.eval_paths[1]: is empty"},
        Case{"data { shards { format: TOKENS paths: '/d/train.bin' sequence_length: 8 } }",
             "data.shards.format: TOKENS shards need model.transformer_lm or a torchscript model"},
        Case{"model { transformer_lm { context_length: 32 } } data { shards { format: TOKENS "
             "paths: '/d/train.bin' sequence_length: 64 } }",
             "data.shards.sequence_length: must be at most model.transformer_lm.context_length "
             "(32), got 64"},
        Case{"data { synthetic { kind: TOKENS } }",
             "data.synthetic.kind: TOKENS data needs model.transformer_lm or a torchscript model"},
        Case{"data { synthetic { num_samples: -5 } }",
             "data.synthetic.num_samples: must be > 0, got -5"},
        Case{"data { synthetic { num_classes: 1 } }",
             "data.synthetic.num_classes: must be >= 2, got 1"},
        Case{"data { synthetic { input_shape: [3, -1] } }",
             "data.synthetic.input_shape[1]: must be > 0, got -1"},
        Case{"data { tensor_file { } }",
             "data.tensor_file.path: is required: a .pt file holding tensors x and y"},
        Case{"data { fashion_mnist { train_limit: -1 } }",
             "data.fashion_mnist.train_limit: must be >= 0, got -1"},
        Case{"data { fashion_mnist { } } loss { kind: MSE }",
             "loss.kind: Fashion-MNIST labels are classes: use CROSS_ENTROPY, got MSE"},
        Case{"data { synthetic { kind: REGRESSION } }",
             "loss.kind: synthetic REGRESSION data needs MSE loss"},
        Case{"loss { label_smoothing: 1.5 }", "loss.label_smoothing: must be in [0, 1), got 1.5"},
        Case{"training { batch_size_per_rank: -1 }",
             "training.batch_size_per_rank: must be > 0, got -1"},
        Case{"training { epochs: -1 max_steps: 10 }", "training.epochs: must be >= 0, got -1"},
        Case{"training { max_steps: -10 epochs: 1 }", "training.max_steps: must be >= 0, got -10"},
        Case{"training { log_every_steps: -1 }", "training.log_every_steps: must be > 0, got -1"},
        Case{"optimizer { lr: -0.1 }", "optimizer.lr: must be > 0, got -0.1"},
        Case{"optimizer { momentum: 1 }", "optimizer.momentum: must be in [0, 1), got 1"},
        Case{"optimizer { weight_decay: -1 }", "optimizer.weight_decay: must be >= 0, got -1"},
        Case{"optimizer { kind: ADAM beta2: 1 }", "optimizer.beta2: must be in [0, 1), got 1"},
        Case{"optimizer { eps: -1 }", "optimizer.eps: must be > 0, got -1"},
        Case{"optimizer { accum_iter: -1 }", "optimizer.accum_iter: must be >= 1, got -1"},
        Case{"optimizer { nesterov: true }", "optimizer.nesterov: needs kind SGD and momentum > 0"},
        Case{"optimizer { kind: ADAM momentum: 0.9 }",
             "optimizer.momentum: applies to SGD only; the Adam family uses beta1"},
        Case{"lr_schedule { cosine { warmup_steps: 100 total_steps: 50 } }",
             "lr_schedule.cosine.warmup_steps: must be < total_steps (50), got 100"},
        Case{"lr_schedule { cosine { min_lr_ratio: 2 } }",
             "lr_schedule.cosine.min_lr_ratio: must be in [0, 1], got 2"},
        Case{"lr_schedule { step { } }", "lr_schedule.step.step_size: must be > 0, got 0"},
        Case{"lr_schedule { step { step_size: 10 gamma: 3 } }",
             "lr_schedule.step.gamma: must be in [0, 1], got 3"},
        Case{"grad_clip_norm: -1", "grad_clip_norm: must be >= 0, got -1"},
        Case{"resources { min_ranks: -1 max_ranks: 2 }",
             "resources.min_ranks: must be >= 1, got -1"},
        Case{"resources { min_ranks: 4 max_ranks: 2 }",
             "resources.max_ranks: must be >= min_ranks (4), got 2"},
        Case{"priority: 9", "priority: unknown value 9; use LOW, NORMAL or HIGH"},
        Case{"resources { min_ranks: 1 max_ranks: 20000 }",
             "resources.max_ranks: must be <= 16384, got 20000"},
        Case{"resources { threads_per_rank: 1000 }",
             "resources.threads_per_rank: must be <= 256, got 1000"},
        Case{"resources { memory_bytes: -1 }",
             "resources.memory_bytes: must be at least 67108864 (64 MiB: a rank's runtime alone "
             "needs more), or unset for the default; got -1"},
        Case{"resources { memory_bytes: 1000000 }",
             "resources.memory_bytes: must be at least 67108864 (64 MiB: a rank's runtime alone "
             "needs more), or unset for the default; got 1000000"},
        Case{"resources { memory_bytes: 100000000000000000 }",
             "resources.memory_bytes: must be at most 70368744177664 (64 TiB, more than any one "
             "machine holds); got 100000000000000000"},
        Case{"resources { max_processes: -3 }", "resources.max_processes: must be >= 32, got -3"},
        Case{"resources { max_processes: 5 }", "resources.max_processes: must be >= 32, got 5"},
        Case{"checkpoint { every_steps: -5 }", "checkpoint.every_steps: must be >= 0, got -5"},
        Case{"checkpoint { keep_last: -1 }", "checkpoint.keep_last: must be >= 0, got -1"},
        Case{"checkpoint { unreachable_retry_seconds: -5 }",
             "checkpoint.unreachable_retry_seconds: must be >= 0, got -5"},
        Case{"checkpoint { storage: SHARED_DIR shared_dir: 'rel/dir' }",
             "checkpoint.shared_dir: storage SHARED_DIR needs an absolute directory path, got "
             "\"rel/dir\""},
        Case{"checkpoint { shared_dir: '/mnt/ckpt' }",
             "checkpoint.shared_dir: is only used with storage SHARED_DIR"},
        Case{"checkpoint { per_rank: true }",
             "checkpoint.per_rank: needs strategy.decentralized (DDP replicas are identical)"},
        Case{"eval { every_steps: -1 }", "eval.every_steps: must be >= 0, got -1"},
        Case{"eval { max_batches: -1 }", "eval.max_batches: must be >= 0, got -1"},
        Case{"hang_detection { dead_after_seconds: -1 }",
             "hang_detection.dead_after_seconds: must be > 0, got -1"},
        Case{"hang_detection { stall_after_seconds: -2 }",
             "hang_detection.stall_after_seconds: must be > 0, got -2"},
        Case{"hang_detection { straggler_ratio: 0.5 }",
             "hang_detection.straggler_ratio: must be > 1, got 0.5"},
        Case{"hang_detection { phase_limit_seconds: -1 }",
             "hang_detection.phase_limit_seconds: must be > 0, got -1"},
        Case{"elastic { max_restarts: -1 }", "elastic.max_restarts: must be >= 0, got -1"},
        Case{"elastic { wait_seconds: -5 }", "elastic.wait_seconds: must be > 0, got -5"},
        Case{"elastic { scale_up_interval_seconds: -1 }",
             "elastic.scale_up_interval_seconds: must be > 0, got -1"},
        Case{"elastic { } resources { preemptible: true }",
             "resources.preemptible: an elastic job is preempted by giving up ranks at a step "
             "boundary, never sent back to the queue; remove preemptible or the elastic block"},
        // A gossip job that does not re-form runs at any size in its
        // range: every one must be a size the topology serves.
        Case{"strategy { decentralized { } } resources { min_ranks: 2 max_ranks: 4 }",
             "strategy.decentralized.topology: one_peer_exponential pairs rank i with i xor 2^k "
             "and needs a power-of-two number of ranks, got 3; nearest world sizes that work: 2 "
             "and 4 (resources allow 2..4 ranks; unservable: 3)"},
        Case{"fault_injection { faults { rank: 0 } }",
             "fault_injection.faults[0].kind: is required: one of EXIT, CRASH, HANG, SLOW, "
             "SKIP_COLLECTIVE, MISMATCH_COLLECTIVE"},
        Case{"fault_injection { faults { kind: CRASH rank: 2 } }",
             "fault_injection.faults[0].rank: must be in [0, 1), got 2"},
        Case{"fault_injection { faults { kind: HANG } }",
             "fault_injection.faults[0].duration_seconds: must be > 0, got 0"},
        Case{"fault_injection { faults { kind: EXIT exit_code: 300 } }",
             "fault_injection.faults[0].exit_code: must be in [1, 255], got 300"},
        Case{"fault_injection { faults { kind: CRASH at_step: -1 } }",
             "fault_injection.faults[0].at_step: must be >= 0, got -1"},
        Case{"strategy { decentralized { } } resources { min_ranks: 3 max_ranks: 3 }",
             "strategy.decentralized.topology: one_peer_exponential pairs rank i with i xor 2^k "
             "and needs a power-of-two number of ranks, got 3; nearest world sizes that work: 2 "
             "and 4 (resources allow 3..3 ranks; unservable: 3)"},
        Case{
            "strategy { decentralized { topology: RING } } resources { min_ranks: 2 max_ranks: 6 }",
            "strategy.decentralized.topology: ring pairs neighbours and needs an even number of "
            "ranks, got 3; nearest world sizes that work: 2 and 4 (resources allow 2..6 ranks; "
            "unservable: 3,5)"},
        Case{"strategy { decentralized { topology: RING bucket_cap_mb: -1 } }",
             "strategy.decentralized.bucket_cap_mb: must be > 0, got -1"},
        Case{"strategy { decentralized { topology: ALTERNATING_EXPONENTIAL_RING "
             "local_world_size: 3 } } resources { min_ranks: 4 max_ranks: 4 }",
             "strategy.decentralized.local_world_size: alternating_exponential_ring needs whole "
             "nodes: 4 ranks are not a multiple of local_world_size 3; nearest world sizes that "
             "work: 3 and 6 (resources allow 4..4 ranks; unservable: 4)"},
        Case{"strategy { decentralized { topology: RING custom_steps { groups { ranks: 0 } } } }",
             "strategy.decentralized.custom_steps: is only allowed with topology CUSTOM"},
        Case{"strategy { decentralized { topology: CUSTOM } }",
             "strategy.decentralized.custom_steps: topology CUSTOM needs at least one step"},
        Case{"strategy { decentralized { topology: CUSTOM custom_steps { groups { ranks: [0, 1] "
             "} } } } resources { min_ranks: 2 max_ranks: 4 }",
             "strategy.decentralized.custom_steps: a CUSTOM topology fixes the world size: set "
             "resources.min_ranks == max_ranks, got 2 and 4"},
        Case{"strategy { decentralized { topology: CUSTOM custom_steps { groups { ranks: [0, 1] "
             "} groups { ranks: [1, 2] } groups { ranks: [3] } } } } resources { min_ranks: 4 "
             "max_ranks: 4 }",
             "strategy.decentralized.custom_steps[0].groups[1].ranks: rank 1 appears in more "
             "than one group of this step"},
        Case{"strategy { decentralized { topology: CUSTOM custom_steps { groups { ranks: [0, 1] "
             "} groups { ranks: [2] } } } } resources { min_ranks: 4 max_ranks: 4 }",
             "strategy.decentralized.custom_steps[0]: every rank must be in exactly one group; "
             "missing ranks 3"},
        Case{"strategy { decentralized { topology: CUSTOM custom_steps { groups { ranks: [0, 7] "
             "} groups { ranks: [1] } } } } resources { min_ranks: 2 max_ranks: 2 }",
             "strategy.decentralized.custom_steps[0].groups[0].ranks: rank 7 is outside [0, 2)"}));

// Found writing //common:job_spec_fuzzer (its inputs huge_max_ranks and
// huge_custom_world time out without the fix): the topology checks walked every world
// size up to max_ranks (and a CUSTOM topology every rank), so a spec with a
// max_ranks near 2^31 kept SubmitJob busy for minutes (and overflowed the
// counter). Beyond the limit only the limit is reported, at once.
TEST(JobSpecValidationTest, AGlobalBatchThatFitsEveryWorldSizeIsValid) {
  EXPECT_THAT(Errors("training { batch_size_per_rank: 16 global_batch_size: 192 } "
                     "resources { min_ranks: 2 max_ranks: 4 } elastic {}"),
              IsEmpty());
  JobSpec spec = MustParse("training { batch_size_per_rank: 16 global_batch_size: 192 }",
                           SpecFormat::kTextProto);
  NormalizeJobSpec(spec);
  EXPECT_EQ(*MicroBatchesPerStep(spec, 2), 6);
  EXPECT_EQ(*MicroBatchesPerStep(spec, 4), 3);
  EXPECT_THAT(MicroBatchesPerStep(spec, 5).status().message(),
              HasSubstr("training.global_batch_size 192 does not split into micro-batches of "
                        "training.batch_size_per_rank 16 on each of 5 ranks"));
  spec.mutable_training()->set_global_batch_size(0);
  spec.mutable_strategy()->mutable_ddp()->set_grad_accum_steps(3);
  EXPECT_EQ(*MicroBatchesPerStep(spec, 5), 3) << "without a global batch: grad_accum_steps";
}

TEST(JobSpecValidationTest, HugeRankCountsAreReportedNotEnumerated) {
  const absl::Time start = absl::Now();
  EXPECT_THAT(Errors("strategy { decentralized { topology: COMPLETE } } "
                     "resources { min_ranks: 1 max_ranks: 2147483647 }"),
              ElementsAre("resources.max_ranks: must be <= 16384, got 2147483647"));
  EXPECT_THAT(Errors("strategy { decentralized { topology: CUSTOM custom_steps { groups { ranks: "
                     "0 } } } } resources { min_ranks: 2000000000 max_ranks: 2000000000 }"),
              ElementsAre("resources.max_ranks: must be <= 16384, got 2000000000"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST(JobSpecValidationTest, EveryProblemIsReportedAtOnce) {
  std::vector<std::string> errors = Errors(
      "training { batch_size_per_rank: -1 } optimizer { lr: -1 } "
      "strategy { ddp { bucket_cap_mb: -3 } }");
  EXPECT_EQ(errors.size(), 3u) << absl::StrJoin(errors, "\n");

  JobSpec spec = MustParse(
      "model { mlp {} } data { synthetic {} } optimizer { lr: -1 } "
      "strategy { ddp { bucket_cap_mb: -3 } }",
      SpecFormat::kTextProto);
  NormalizeJobSpec(spec);
  absl::Status status = CheckJobSpec(spec, "job.textproto");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "job spec job.textproto has 2 problems:\n"
            "  optimizer.lr: must be > 0, got -1\n"
            "  strategy.ddp.bucket_cap_mb: must be > 0, got -3");
}

TEST(JobSpecValidationTest, UnknownNumericEnumValueIsAnError) {
  JobSpec spec = MustParse("model { mlp {} } data { synthetic {} } optimizer { kind: 42 }",
                           SpecFormat::kTextProto);
  NormalizeJobSpec(spec);
  std::vector<std::string> fields;
  for (const SpecError& e : ValidateJobSpec(spec)) fields.push_back(e.field + ": " + e.message);
  EXPECT_THAT(fields, testing::Contains("optimizer.kind: unknown value 42"));
}

TEST(JobSpecValidationTest, RefusesWhatNoMachineCouldHold) {
  EXPECT_THAT(
      Errors("data { synthetic { input_shape: [100000, 100000] } }"),
      ElementsAre("data.synthetic.input_shape: a rank needs about 237.6 TB (runtime 180.0 MB, "
                  "parameters 10.2 TB, gradients 10.2 TB, checkpoint copy 10.2 TB, data 196.6 TB, "
                  "the larger of activations 3.8 TB and evaluation 10.2 TB), more than the 70.4 TB "
                  "any one machine holds; make the job smaller"));
  // About 5 TB fits a large machine: left to the agents' memory at submit.
  EXPECT_THAT(Errors("model { mlp { hidden_sizes: [2000000000] } }"), IsEmpty());
  std::vector<std::string> errors =
      Errors("model { mlp { hidden_sizes: [2000000000, 2000000000] } }");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0], testing::StartsWith("model.mlp.hidden_sizes: a rank needs about"));
}

// Note [Rank cgroups]: the memory limit a rank runs under. A set value is
// the limit; the trainer's default is twice its estimate plus 1 GiB in 64
// MiB steps; a program, and a trainer whose estimate needs a file's size,
// get none; processes default to 4096.
TEST(JobSpecLimitsTest, MemoryAndProcessLimits) {
  JobSpec trainer = MustParse("model { mlp { } } data { synthetic { } }", SpecFormat::kTextProto);
  NormalizeJobSpec(trainer);
  const double estimate = EstimateRankMemory(trainer).total();
  const int64_t limit = RankMemoryLimitBytes(trainer);
  EXPECT_GE(static_cast<double>(limit), 2 * estimate + (1 << 30));
  EXPECT_LT(static_cast<double>(limit), 2 * estimate + (1 << 30) + (64 << 20));
  EXPECT_EQ(limit % (64 << 20), 0);
  EXPECT_EQ(RankProcessLimit(trainer), 4096);

  trainer.mutable_resources()->set_memory_bytes(int64_t{3} << 30);
  trainer.mutable_resources()->set_max_processes(64);
  EXPECT_EQ(RankMemoryLimitBytes(trainer), int64_t{3} << 30);
  EXPECT_EQ(RankProcessLimit(trainer), 64);

  JobSpec gpu = trainer;
  gpu.mutable_resources()->set_memory_bytes(0);
  gpu.mutable_resources()->set_device(v1::ResourceSpec::CUDA);
  EXPECT_EQ(RankMemoryLimitBytes(gpu), limit + (int64_t{4} << 30));

  JobSpec program = MustParse("program { argv: '/bin/true' }", SpecFormat::kTextProto);
  NormalizeJobSpec(program);
  EXPECT_EQ(RankMemoryLimitBytes(program), 0);
  program.mutable_resources()->set_memory_bytes(int64_t{256} << 20);
  EXPECT_EQ(RankMemoryLimitBytes(program), int64_t{256} << 20);

  JobSpec scripted = MustParse(
      "model { torchscript { path: '/models/m.pt' } } data { synthetic { } }",
      SpecFormat::kTextProto);
  NormalizeJobSpec(scripted);
  EXPECT_EQ(RankMemoryLimitBytes(scripted), 0);
  JobSpec sharded = MustParse(
      "model { mlp { } } data { shards { format: TAR paths: '/d/train-*.tar' num_classes: 10 } }",
      SpecFormat::kTextProto);
  NormalizeJobSpec(sharded);
  EXPECT_EQ(RankMemoryLimitBytes(sharded), 0);
}

}  // namespace
}  // namespace chorus
