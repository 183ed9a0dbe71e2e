#include "common/program_spec.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using v1::JobSpec;

JobSpec MustParse(const std::string& text, SpecFormat format) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text, format, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

// The errors of the normalized textproto `text`, as "field: message".
std::vector<std::string> Errors(const std::string& text) {
  JobSpec spec = MustParse(text, SpecFormat::kTextProto);
  NormalizeJobSpec(spec);
  std::vector<std::string> out;
  for (const SpecError& e : ValidateJobSpec(spec)) out.push_back(e.field + ": " + e.message);
  return out;
}

TEST(ProgramSpecTest, ThreeFormatsParseToTheSameProgram) {
  const JobSpec text = MustParse(R"pb(
                                   name: "byo"
                                   program {
                                     argv: [ "/usr/bin/python3", "train.py", "--epochs", "2" ]
                                     env { key: "SEED" value: "7" }
                                     working_dir: "/srv/proj"
                                   }
                                   resources { min_ranks: 2 }
                                 )pb",
                                 SpecFormat::kTextProto);
  const JobSpec json = MustParse(R"({"name": "byo", "program": {"argv": ["/usr/bin/python3",
      "train.py", "--epochs", "2"], "env": {"SEED": "7"}, "working_dir": "/srv/proj"},
      "resources": {"min_ranks": 2}})",
                                 SpecFormat::kJson);
  const JobSpec yaml = MustParse(R"(
name: byo
program:
  argv: [/usr/bin/python3, train.py, --epochs, "2"]
  env: {SEED: "7"}
  working_dir: /srv/proj
resources: {min_ranks: 2}
)",
                                 SpecFormat::kYaml);
  ASSERT_EQ(text.program().argv_size(), 4);
  EXPECT_EQ(text.program().argv(3), "2");
  EXPECT_EQ(text.program().env().at("SEED"), "7");
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(text, json))
      << JobSpecToText(json);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(text, yaml))
      << JobSpecToText(yaml);
}

TEST(ProgramSpecTest, NormalizationLeavesTheTrainerFieldsUnset) {
  JobSpec spec = MustParse(R"pb(program { argv: "/bin/true" })pb", SpecFormat::kTextProto);
  NormalizeJobSpec(spec);
  EXPECT_FALSE(spec.has_model());
  EXPECT_FALSE(spec.has_data());
  EXPECT_FALSE(spec.has_training());
  EXPECT_FALSE(spec.has_optimizer());
  EXPECT_FALSE(spec.has_strategy());
  EXPECT_FALSE(spec.has_lr_schedule());
  EXPECT_EQ(spec.name(), "job");
  EXPECT_EQ(spec.resources().min_ranks(), 1);
  EXPECT_EQ(spec.resources().max_ranks(), 1);
  EXPECT_EQ(spec.hang_detection().dead_after_seconds(), 5);
  EXPECT_EQ(spec.checkpoint().storage(), v1::CheckpointSpec::COORDINATOR);
  JobSpec again = spec;
  NormalizeJobSpec(again);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(spec, again));
  EXPECT_THAT(ValidateJobSpec(spec), IsEmpty());
}

TEST(ProgramSpecTest, AProgramWithTrainerFieldsIsRefusedNamingEachField) {
  std::vector<std::string> errors = Errors(R"pb(
    program { argv: "/bin/true" }
    model { mlp {} }
    data { synthetic {} }
    optimizer { lr: 0.1 }
    grad_clip_norm: 1
  )pb");
  const std::string why =
      "is the built-in trainer's; a program job trains in its own code: remove it (or remove "
      "program to use the built-in trainer)";
  EXPECT_THAT(errors, ElementsAre("model: " + why, "data: " + why, "optimizer: " + why,
                                  "grad_clip_norm: " + why));
}

TEST(ProgramSpecTest, AnElasticProgramIsAccepted) {
  // The program re-forms through the SDK (docs/sdk.md "Elastic programs").
  EXPECT_THAT(Errors(R"pb(
                program { argv: [ "/bin/true" ] }
                resources { min_ranks: 2 max_ranks: 3 }
                elastic { max_restarts: 2 }
              )pb"),
              IsEmpty());
}

TEST(ProgramSpecTest, CommandProblemsNameTheirField) {
  EXPECT_THAT(Errors("program {}"),
              ElementsAre("program.argv: is required: the command each rank runs, e.g. "
                          "[\"/usr/bin/python3\", \"train.py\"]"));
  EXPECT_THAT(Errors(R"pb(program { argv: "" })pb"),
              ElementsAre("program.argv[0]: must name the program to run, got an empty string"));
  EXPECT_THAT(Errors(R"pb(program { argv: "python3" })pb"),
              ElementsAre(HasSubstr("program.argv[0]: relative path python3 needs "
                                    "program.working_dir (an absolute directory)")));
  EXPECT_THAT(Errors(R"pb(program { argv: "/bin/true" working_dir: "proj" })pb"),
              ElementsAre("program.working_dir: must be an absolute path, got \"proj\""));
  EXPECT_THAT(Errors(R"pb(program {
                            argv: "/bin/true"
                            env { key: "RANK" value: "3" }
                            env { key: "A=B" value: "1" }
                            env { key: "MY_SETTING" value: "1" }
                          })pb"),
              ElementsAre("program.env[A=B]: variable names must not hold '=' or NUL",
                          "program.env[RANK]: is set by Chorus for each rank (docs/programs.md); "
                          "choose another name"));
}

TEST(ProgramSpecTest, NeitherModelNorProgramSaysBoth) {
  JobSpec spec;
  NormalizeJobSpec(spec);
  std::vector<SpecError> errors = ValidateJobSpec(spec);
  ASSERT_FALSE(errors.empty());
  EXPECT_EQ(errors[0].field, "model");
  EXPECT_THAT(errors[0].message, HasSubstr("or set program"));
}

TEST(ProgramSpecTest, BinaryPathResolvesAgainstTheWorkingDirectory) {
  v1::ProgramSpec p;
  EXPECT_EQ(ProgramBinaryPath(p), "");
  p.add_argv("bin/train");
  EXPECT_EQ(ProgramBinaryPath(p), "");
  p.set_working_dir("/srv/proj");
  EXPECT_EQ(ProgramBinaryPath(p), "/srv/proj/bin/train");
  p.set_working_dir("/srv/proj/");
  EXPECT_EQ(ProgramBinaryPath(p), "/srv/proj/bin/train");
  p.set_argv(0, "/opt/train");
  EXPECT_EQ(ProgramBinaryPath(p), "/opt/train");
}

class ProgramBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/program_binary_test";
    ::mkdir(dir_.c_str(), 0755);
  }
  std::string Write(const std::string& name, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << "#!/bin/sh\nexit 0\n";
    ::chmod(path.c_str(), mode);
    return path;
  }
  std::vector<std::string> Problems(const std::string& argv0, const std::string& working_dir) {
    v1::ProgramSpec p;
    p.add_argv(argv0);
    p.set_working_dir(working_dir);
    std::vector<std::string> out;
    for (const SpecError& e : CheckProgramBinary(p)) out.push_back(e.field + ": " + e.message);
    return out;
  }
  std::string dir_;
};

TEST_F(ProgramBinaryTest, AnExecutableFilePasses) {
  const std::string path = Write("ok.sh", 0755);
  EXPECT_THAT(Problems(path, ""), IsEmpty());
  EXPECT_THAT(Problems("ok.sh", dir_), IsEmpty());
}

TEST_F(ProgramBinaryTest, MissingFileIsNamed) {
  EXPECT_THAT(Problems(dir_ + "/nothing", ""),
              ElementsAre("program.argv[0]: " + dir_ + "/nothing does not exist"));
}

TEST_F(ProgramBinaryTest, NotExecutableIsNamedWithItsMode) {
  const std::string path = Write("plain.py", 0644);
  EXPECT_THAT(Problems(path, ""), ElementsAre(HasSubstr("program.argv[0]: " + path +
                                                        " is not executable (mode 0644)")));
}

TEST_F(ProgramBinaryTest, RelativePathThatDoesNotResolveNamesTheWorkingDirectory) {
  EXPECT_THAT(Problems("bin/train", dir_),
              ElementsAre(HasSubstr("program.argv[0]: relative path bin/train does not resolve "
                                    "against program.working_dir " +
                                    dir_ + " (" + dir_ + "/bin/train does not exist)")));
}

TEST_F(ProgramBinaryTest, ADirectoryIsNotAProgram) {
  EXPECT_THAT(Problems(dir_, ""),
              ElementsAre("program.argv[0]: " + dir_ + " is a directory, not a program"));
}

TEST(ChorusSetVariablesTest, CoversTorchrunAndTheSdkVariables) {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                           "MASTER_PORT", "CHORUS_JOIN_FILE", "CHORUS_PROGRESS_FD",
                           "CHORUS_RANK_PID", "CHORUS_AGENT_ID", "CHORUS_SLOT", "GROUP_RANK",
                           "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE",
                           "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                           "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"}) {
    EXPECT_TRUE(IsChorusSetVariable(name)) << name;
  }
  EXPECT_FALSE(IsChorusSetVariable("PYTHONPATH"));
  // A default the program may choose itself, as under torchrun.
  EXPECT_FALSE(IsChorusSetVariable("NCCL_ASYNC_ERROR_HANDLING"));
}

}  // namespace
}  // namespace chorus
