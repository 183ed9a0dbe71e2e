#include "common/program_spec.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/env_names.h"

namespace chorus {

const std::vector<std::string>& ChorusSetVariables() {
  // Built once on first use and never destroyed (no exit-time destructor).
  static const auto* const kNames = new std::vector<std::string>{
      "RANK",
      "WORLD_SIZE",
      "LOCAL_RANK",
      "LOCAL_WORLD_SIZE",
      "MASTER_ADDR",
      "MASTER_PORT",
      "GROUP_RANK",
      "GROUP_WORLD_SIZE",
      "ROLE_NAME",
      "ROLE_RANK",
      "ROLE_WORLD_SIZE",
      "TORCHELASTIC_RESTART_COUNT",
      "TORCHELASTIC_MAX_RESTARTS",
      "TORCHELASTIC_RUN_ID",
      "TORCHELASTIC_USE_AGENT_STORE",
      kEnvCoordinator,
      kEnvJobId,
      kEnvGeneration,
      kEnvToken,
      kEnvAgentId,
      kEnvSlot,
      kEnvRank,
      kEnvWorldSize,
      kEnvStoreNamespace,
      kEnvRankHost,
      kEnvJoinFile,
      kEnvProgressFd,
      kEnvRankPid,
  };
  return *kNames;
}

bool IsChorusSetVariable(absl::string_view name) {
  const std::vector<std::string>& names = ChorusSetVariables();
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string ProgramBinaryPath(const v1::ProgramSpec& program) {
  if (program.argv_size() == 0 || program.argv(0).empty()) return "";
  const std::string& binary = program.argv(0);
  if (binary[0] == '/') return binary;
  const std::string& dir = program.working_dir();
  if (dir.empty() || dir[0] != '/') return "";
  return dir.back() == '/' ? dir + binary : absl::StrCat(dir, "/", binary);
}

std::vector<SpecError> CheckProgramBinary(const v1::ProgramSpec& program) {
  const std::string path = ProgramBinaryPath(program);
  if (path.empty()) return {};
  const std::string field = "program.argv[0]";
  const bool relative = program.argv(0)[0] != '/';
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const std::string why = errno == ENOENT ? "does not exist" : std::strerror(errno);
    if (relative) {
      return {{field,
               absl::StrCat("relative path ", program.argv(0),
                            " does not resolve against program.working_dir ", program.working_dir(),
                            " (", path, " ", why, "); give an absolute path or fix working_dir")}};
    }
    return {{field, absl::StrCat(path, " ", why)}};
  }
  if (S_ISDIR(st.st_mode)) return {{field, absl::StrCat(path, " is a directory, not a program")}};
  if (!S_ISREG(st.st_mode)) return {{field, absl::StrCat(path, " is not a regular file")}};
  if (::access(path.c_str(), X_OK) != 0) {
    return {{field, absl::StrFormat("%s is not executable (mode %04o); chmod +x it, or run it "
                                    "through its interpreter, e.g. [\"/usr/bin/python3\", \"%s\"]",
                                    path, st.st_mode & 07777, path)}};
  }
  return {};
}

}  // namespace chorus
