#include "chorus/environment.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/env_names.h"
#include "common/host_port.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

constexpr char kHowToRun[] =
    "this program expects to be started by Chorus as a `program` job (a job spec with "
    "program { argv: [\"/path/to/binary\"] }, run with `chorus up` or `chorus submit`; "
    "docs/sdk.md)";

absl::StatusOr<std::string> Required(const EnvironmentLookup& lookup, const std::string& name) {
  std::optional<std::string> value = lookup(name);
  if (!value.has_value() || value->empty()) {
    return absl::FailedPreconditionError(absl::StrCat(name, " is not set: ", kHowToRun));
  }
  return *value;
}

absl::StatusOr<int64_t> Number(const EnvironmentLookup& lookup, const std::string& name,
                               int64_t min) {
  ASSIGN_OR_RETURN(std::string text, Required(lookup, name));
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be an integer >= ", min, ", got '", text, "'"));
  }
  return value;
}

}  // namespace

EnvironmentLookup ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

absl::StatusOr<SessionEnvironment> ReadSessionEnvironment(const EnvironmentLookup& lookup) {
  SessionEnvironment env;
  ASSIGN_OR_RETURN(env.job_id, Required(lookup, kEnvJobId));
  ASSIGN_OR_RETURN(env.coordinator, Required(lookup, kEnvCoordinator));
  if (env.coordinator.find(',') != std::string::npos) {
    // Several coordinators; the session follows the leader among them.
    if (absl::StatusOr<std::vector<HostPort>> list = ParseHostPortList(env.coordinator);
        !list.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CHORUS_COORDINATOR: ", list.status().message()));
    }
  }
  ASSIGN_OR_RETURN(const int64_t rank, Number(lookup, "RANK", 0));
  ASSIGN_OR_RETURN(const int64_t world_size, Number(lookup, "WORLD_SIZE", 1));
  ASSIGN_OR_RETURN(const int64_t local_rank, Number(lookup, "LOCAL_RANK", 0));
  ASSIGN_OR_RETURN(const int64_t local_world_size, Number(lookup, "LOCAL_WORLD_SIZE", 1));
  ASSIGN_OR_RETURN(env.generation, Number(lookup, kEnvGeneration, 1));
  ASSIGN_OR_RETURN(env.store_namespace, Required(lookup, kEnvStoreNamespace));
  ASSIGN_OR_RETURN(const std::string join_file, Required(lookup, kEnvJoinFile));
  if (rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK must be < WORLD_SIZE (", world_size, "), got ", rank));
  }
  if (local_rank >= local_world_size) {
    return absl::InvalidArgumentError(absl::StrCat("LOCAL_RANK must be < LOCAL_WORLD_SIZE (",
                                                   local_world_size, "), got ", local_rank));
  }
  env.rank = static_cast<int>(rank);
  env.world_size = static_cast<int>(world_size);
  env.local_rank = static_cast<int>(local_rank);
  env.local_world_size = static_cast<int>(local_world_size);
  env.rank_host = lookup(kEnvRankHost).value_or("127.0.0.1");
  if (env.rank_host.empty()) env.rank_host = "127.0.0.1";
  if (lookup(kEnvProgressFd).has_value()) {
    ASSIGN_OR_RETURN(const int64_t fd, Number(lookup, kEnvProgressFd, 0));
    env.progress_fd = static_cast<int>(fd);
  }
  env.agent_id = lookup(kEnvAgentId).value_or("");
  if (lookup(kEnvSlot).has_value()) {
    ASSIGN_OR_RETURN(const int64_t slot, Number(lookup, kEnvSlot, 0));
    env.slot = static_cast<int>(slot);
  }
  if (lookup(kEnvRankPid).has_value()) {
    ASSIGN_OR_RETURN(env.rank_pid, Number(lookup, kEnvRankPid, 1));
  }

  std::ifstream in(join_file, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("CHORUS_JOIN_FILE names ", join_file,
                                            ", which cannot be read (the supervising chorus-rank "
                                            "writes it before starting the program)"));
  }
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (!env.joined.ParseFromString(bytes.str())) {
    return absl::DataLossError(absl::StrCat("CHORUS_JOIN_FILE ", join_file,
                                            " does not hold a serialized chorus.v1.JoinResponse"));
  }
  if (env.joined.rank() != env.rank || env.joined.world_size() != env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RANK/WORLD_SIZE (", env.rank, "/", env.world_size, ") disagree with CHORUS_JOIN_FILE ",
        join_file, " (", env.joined.rank(), "/", env.joined.world_size(), ")"));
  }
  if (env.joined.generation() != env.generation) {
    return absl::InvalidArgumentError(absl::StrCat("CHORUS_GENERATION (", env.generation,
                                                   ") disagrees with CHORUS_JOIN_FILE ", join_file,
                                                   " (generation ", env.joined.generation(), ")"));
  }
  return env;
}

}  // namespace chorus
