#include "client/rpc.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/env_names.h"
#include "common/grpc_util.h"
#include "common/job_spec.h"
#include "common/program_spec.h"
#include "google/protobuf/util/json_util.h"

namespace chorus::client {

std::string LocalTokenPath(const std::string& coordinator) {
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') {
    // As ssh finds ~/.ssh: the password database knows the home directory
    // when the environment does not say (a service, a test runner).
    const struct passwd* entry = getpwuid(getuid());
    home = entry != nullptr ? entry->pw_dir : nullptr;
  }
  if (home == nullptr || *home == '\0' || coordinator.empty()) return "";
  std::string name = coordinator;
  for (char& c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '-') c = '_';
  }
  return absl::StrCat(home, "/.chorus/tokens/", name);
}

void ConfigureSecurity(const GlobalOptions& global) {
  static bool configured = false;
  if (configured) return;
  std::string token_file = global.token_file;
  const auto unset = [](const char* name) {
    const char* value = std::getenv(name);
    return value == nullptr || *value == '\0';
  };
  if (token_file.empty() && unset(kEnvToken) && unset(kEnvTokenFile)) {
    const std::string local = LocalTokenPath(global.coordinator);
    if (!local.empty() && access(local.c_str(), F_OK) == 0) token_file = local;
  }
  absl::StatusOr<ClientSecurity> security =
      LoadClientSecurity(token_file, global.tls_ca, global.tls_cert, global.tls_key);
  if (!security.ok()) {
    *global.err << "chorus: " << security.status().message() << "\n";
    global.err->flush();
    std::exit(kExitBadInput);
  }
  ConfigureClient(*std::move(security));
  configured = true;
}

std::shared_ptr<grpc::Channel> CoordinatorChannel(const GlobalOptions& global) {
  if (global.channel != nullptr) return global.channel;
  ConfigureSecurity(global);
  return MakeCoordinatorChannel(global.coordinator, kOneShotConnectTimeout);
}

std::unique_ptr<v1::JobService::Stub> JobStub(const GlobalOptions& global) {
  return v1::JobService::NewStub(CoordinatorChannel(global));
}

void SetDeadline(grpc::ClientContext& context, const GlobalOptions& global) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(global.timeout_seconds)));
  // Several coordinators: while leadership moves none may lead for a
  // moment; the call waits for the new leader within its deadline instead
  // of failing at once (Note [Following the leader] in common/grpc_util.cc).
  if (IsCoordinatorList(global.coordinator)) context.set_wait_for_ready(true);
}

std::string WhyNoneLeads(const std::string& list) {
  return NoLeaderReason(list, absl::Seconds(3),
                        [](const std::shared_ptr<grpc::Channel>& channel,
                           grpc::ClientContext* context) {
                          v1::CoordinatorLeader leader;
                          return v1::JobService::NewStub(channel)->GetLeader(
                              context, v1::GetLeaderRequest(), &leader);
                        });
}

int ReportError(const std::string& command, const absl::Status& status,
                const GlobalOptions& global) {
  std::ostream& err = *global.err;
  err << "chorus " << command << ": " << status.message();
  if (status.code() == absl::StatusCode::kUnavailable ||
      status.code() == absl::StatusCode::kDeadlineExceeded) {
    if (IsCoordinatorList(global.coordinator)) {
      err << " (coordinators " << global.coordinator
          << ": none leads or answers within --timeout; `chorus coordinators` shows each one)";
      if (global.channel == nullptr) {
        if (const std::string why = WhyNoneLeads(global.coordinator); !why.empty()) {
          err << "; " << why;
        }
      }
    } else {
      err << " (coordinator " << global.coordinator
          << "; is it running? `chorus ping` checks, --coordinator picks another)";
    }
  }
  err << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure;
}

std::string ToJson(const google::protobuf::Message& message, bool one_line) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.add_whitespace = !one_line;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string FormatTime(int64_t unix_us) {
  if (unix_us == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMicros(unix_us),
                          absl::LocalTimeZone());
}

std::string StateName(v1::Job::State state) { return v1::Job::State_Name(state); }

namespace {

// The directory the user ran the command in (under `bazel run`, theirs,
// not the runfiles tree); empty if it cannot be found.
std::string UserDirectory() {
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return "";
  return cwd;
}

}  // namespace

std::string UserPath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  const std::string dir = UserDirectory();
  return dir.empty() ? path : dir + "/" + path;
}

absl::StatusOr<v1::JobSpec> LoadUserJobSpec(const std::string& path) {
  // A program starts where the user ran the command unless its spec says
  // otherwise.
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(UserPath(path), UserDirectory());
  if (!spec.ok()) return spec;
  auto absolute = [](std::string* p) { *p = UserPath(*p); };
  if (spec->has_program()) {
    // Checked here, on the machine `chorus up --local` runs it on.
    const std::vector<SpecError> problems = CheckProgramBinary(spec->program());
    if (problems.empty()) return spec;
    std::string message = absl::StrCat("job spec ", UserPath(path), " has ", problems.size(),
                                       problems.size() == 1 ? " problem:" : " problems:");
    for (const SpecError& e : problems) absl::StrAppend(&message, "\n  ", e.field, ": ", e.message);
    return absl::InvalidArgumentError(message);
  }
  if (spec->model().has_torchscript())
    absolute(spec->mutable_model()->mutable_torchscript()->mutable_path());
  if (spec->has_data()) {
    v1::DataSpec& data = *spec->mutable_data();
    if (data.has_fashion_mnist()) absolute(data.mutable_fashion_mnist()->mutable_dir());
    if (data.has_tensor_file()) {
      absolute(data.mutable_tensor_file()->mutable_path());
      absolute(data.mutable_tensor_file()->mutable_eval_path());
    }
    if (data.has_shards()) {
      for (std::string& shard : *data.mutable_shards()->mutable_paths()) absolute(&shard);
    }
  }
  return spec;
}

}  // namespace chorus::client
