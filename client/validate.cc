// chorus validate SPEC: parse, normalize and check a job spec without
// submitting it. Prints the spec as it would run, or every problem.

#include <glob.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

#include "client/commands.h"
#include "client/rpc.h"
#include "common/grpc_util.h"
#include "common/job_spec.h"
#include "common/memory_estimate.h"

namespace chorus::client {
namespace {

// --agents: which connected agents would serve `spec` (its device, ACTIVE,
// free slots) and whether its min_ranks fit now. Notes on stderr, like the
// rest of validate's findings.
// The limits each rank's cgroup will enforce (Note [Rank cgroups] in
// worker/agent/rank_cgroup.cc), as the coordinator will decide them.
std::string LimitsLine(const v1::JobSpec& spec) {
  const int64_t memory = RankMemoryLimitBytes(spec);
  std::string line = "chorus validate: limits per rank: ";
  if (spec.resources().memory_bytes() > 0) {
    absl::StrAppend(&line, FormatBinaryBytes(memory), " of memory (resources.memory_bytes)");
  } else if (memory > 0) {
    absl::StrAppend(&line, FormatBinaryBytes(memory),
                    " of memory (the default: twice the estimate plus 1 GiB; set "
                    "resources.memory_bytes to change it)");
  } else {
    absl::StrAppend(&line, "no memory limit (",
                    spec.has_program() ? "a program's memory is unknown"
                                       : "the job's sizes are in its files",
                    "; set resources.memory_bytes for one)");
  }
  absl::StrAppend(&line, ", ", RankProcessLimit(spec),
                  " processes and threads (resources.max_processes), where the node agent "
                  "can make cgroups\n");
  return line;
}

int PrintServingAgents(const v1::JobSpec& spec, const GlobalOptions& global) {
  v1::ListAgentsResponse response;
  grpc::ClientContext context;
  SetDeadline(context, global);
  absl::Status s =
      FromGrpcStatus(JobStub(global)->ListAgents(&context, v1::ListAgentsRequest(), &response));
  if (!s.ok()) return ReportError("validate", s, global);
  const v1::ResourceSpec::Device device = spec.resources().device();
  const std::string name = v1::ResourceSpec::Device_Name(device);
  int serving = 0;
  int free_slots = 0;
  for (const v1::AgentInfo& agent : response.agents()) {
    if (agent.device() != device) continue;
    const std::string who = absl::StrCat(agent.agent_id(), " (", agent.host(), ")");
    if (agent.state() != v1::AgentInfo::ACTIVE) {
      *global.err << "chorus validate: " << who << " has " << agent.slots() << " " << name
                  << " slot(s) but is " << v1::AgentInfo::State_Name(agent.state())
                  << ": it takes no new ranks\n";
      continue;
    }
    const int agent_free = std::max(0, agent.slots() - agent.busy_slots());
    ++serving;
    free_slots += agent_free;
    *global.err << "chorus validate: " << who << " would serve it: " << agent_free << " of "
                << agent.slots() << " " << name << " slot(s) free\n";
  }
  const int need = spec.resources().min_ranks();
  if (serving == 0) {
    *global.err << "chorus validate: no connected agent offers " << name
                << " slots; submitted, the job would wait PENDING until one does (start "
                   "chorus-worker --device "
                << absl::AsciiStrToLower(name) << " on such a node)\n";
  } else if (free_slots >= need) {
    *global.err << "chorus validate: its " << need << " rank(s) fit in the " << free_slots << " free "
                << name << " slot(s) now\n";
  } else {
    *global.err << "chorus validate: " << free_slots << " free " << name
                << " slot(s) now, fewer than its min_ranks " << need
                << "; submitted, it would wait PENDING for slots\n";
  }
  return kExitOk;
}

// Note [Globs checked here]
// The ranks expand data.shards.paths and eval_paths on their own machines,
// where the files may be and this one may lack them; a glob that matches
// nothing here is worth a warning, not a refusal (a rank that finds no file
// fails the job, naming the entry).
void WarnAboutUnmatchedGlobs(const v1::JobSpec& spec, const GlobalOptions& global) {
  const v1::ShardedData& shards = spec.data().shards();
  for (const auto& [field, paths] :
       {std::pair{"data.shards.paths", &shards.paths()},
        std::pair{"data.shards.eval_paths", &shards.eval_paths()}}) {
    for (int i = 0; i < paths->size(); ++i) {
      const std::string& entry = paths->Get(i);
      if (entry.find_first_of("*?[") == std::string::npos) continue;
      glob_t matches;
      const int rc = ::glob(entry.c_str(), GLOB_ERR, nullptr, &matches);
      ::globfree(&matches);
      if (rc == 0) continue;
      *global.err << "chorus validate: warning: " << field << "[" << i << "]: \"" << entry
                  << "\" matches no file on this machine; each rank expands it on its own "
                     "machine, where it must match (or the job fails naming it)\n";
    }
  }
}

}  // namespace

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
  auto agents = std::make_shared<bool>(false);
  cmd->add_flag("--agents", *agents,
                "Also ask the coordinator (--coordinator) which connected node agents would serve "
                "the job: those with slots of its resources.device, their free slots, and "
                "whether its min_ranks fit now.");
  cmd->callback([path, output, agents, &global, &exit_code] {
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
      *global.err << LimitsLine(*spec);
      exit_code = *agents ? PrintServingAgents(*spec, global) : kExitOk;
      return;
    }
    WarnAboutUnmatchedGlobs(*spec, global);
    // Where files can be read here, their sizes count (a lower bound).
    const RankMemoryEstimate memory = EstimateRankMemory(*spec, LocalFileSize);
    *global.err << "chorus validate: a rank needs " << memory.ToString() << "\n";
    *global.err << LimitsLine(*spec);
    if (const int64_t here = MachineMemoryBytes(); here > 0 && memory.total() > here) {
      *global.err << "chorus validate: note: " << memory.field << ": that is more than this "
                  << "machine's " << FormatBytes(static_cast<double>(here))
                  << " of memory; it can only run on agents with more (chorus submit refuses it "
                     "when no connected agent has enough)\n";
    }
    exit_code = *agents ? PrintServingAgents(*spec, global) : kExitOk;
  });
}

}  // namespace chorus::client
