// chorus validate SPEC: parse, normalize and check a job spec without
// submitting it. Prints the spec as it would run, or every problem.

#include <iostream>
#include <string>

#include "client/commands.h"
#include "client/rpc.h"
#include "common/job_spec.h"
#include "common/memory_estimate.h"

namespace chorus::client {

void AddValidateCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "validate",
      "Check a job spec (.textproto/.pbtxt, .json, .yaml/.yml). Prints the normalized spec "
      "(every default filled in) on stdout, or every problem with its field path on stderr "
      "and exits 2.");
  auto path = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>("text");
  cmd->add_option("spec", *path, "Job spec file.")->required();
  cmd->add_option("-o,--output", *output, "How to print the normalized spec.")
      ->check(CLI::IsMember({"text", "json", "none"}))
      ->capture_default_str();
  cmd->add_flag_callback(
      "--json", [output] { *output = "json"; }, "Same as --output json.");
  cmd->callback([path, output, &global, &exit_code] {
    absl::StatusOr<v1::JobSpec> spec = LoadUserJobSpec(*path);
    if (!spec.ok()) {
      *global.err << "chorus validate: " << spec.status().message() << "\n";
      exit_code = kExitBadInput;
      return;
    }
    if (*output == "text") {
      *global.out << JobSpecToText(*spec);
    } else if (*output == "json") {
      *global.out << JobSpecToJson(*spec);
    }
    *global.err << "chorus validate: " << *path << " is valid (" << spec->resources().min_ranks()
                << (spec->resources().max_ranks() != spec->resources().min_ranks()
                        ? "-" + std::to_string(spec->resources().max_ranks())
                        : "")
                << " ranks)\n";
    if (spec->has_program()) {
      *global.err << "chorus validate: each rank runs " << spec->program().argv(0) << " in "
                  << spec->program().working_dir() << " (docs/programs.md)\n";
      exit_code = kExitOk;
      return;
    }
    // Where files can be read here, their sizes count (a lower bound).
    const RankMemoryEstimate memory = EstimateRankMemory(*spec, LocalFileSize);
    *global.err << "chorus validate: a rank needs " << memory.ToString() << "\n";
    if (const int64_t here = MachineMemoryBytes(); here > 0 && memory.total() > here) {
      *global.err << "chorus validate: note: " << memory.field << ": that is more than this "
                  << "machine's " << FormatBytes(static_cast<double>(here))
                  << " of memory; it can only run on agents with more (chorus submit refuses it "
                     "when no connected agent has enough)\n";
    }
    if (absl::Status support = CheckRuntimeSupport(*spec); !support.ok()) {
      *global.err << "chorus validate: note: the spec is valid, but " << support.message() << "\n";
    }
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
