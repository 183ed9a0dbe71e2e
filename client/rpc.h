// What the chorus subcommands share to call the coordinator: stubs, deadlines,
// turning errors into messages and exit codes, and printing protos.
//
// Thread-safety: ConfigureSecurity must run before other threads make
// channels; the rest keep no state.
//
// Example:
//   grpc::ClientContext context;
//   SetDeadline(context, global);
//   absl::Status s = FromGrpcStatus(JobStub(global)->GetJob(&context, request, &job));
//   if (!s.ok()) exit_code = ReportError("status", s, global);
#ifndef CHORUS_CLIENT_RPC_H_
#define CHORUS_CLIENT_RPC_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "client/commands.h"
#include "google/protobuf/message.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace chorus::client {

// Loads the credentials `global` names (once per process) for every channel
// made afterwards: --token_file, else CHORUS_TOKEN or CHORUS_TOKEN_FILE,
// else the token `chorus up` left for --coordinator (LocalTokenPath), if
// there is one. On a bad file it prints the problem and exits with 2.
void ConfigureSecurity(const GlobalOptions& global);
// Where `chorus up` leaves the admin token of the coordinator it runs at
// `coordinator` (HOST:PORT) for this user's other commands
// (Note [chorus up's tokens] in client/up.cc):
// $HOME/.chorus/tokens/HOST_PORT (the password database's home directory
// when $HOME is unset). Empty if there is no home directory.
std::string LocalTokenPath(const std::string& coordinator);
// global.channel if set; otherwise a channel to --coordinator with the
// credentials configured.
std::shared_ptr<grpc::Channel> CoordinatorChannel(const GlobalOptions& global);
// A JobService stub over CoordinatorChannel(global).
std::unique_ptr<v1::JobService::Stub> JobStub(const GlobalOptions& global);
// Whether --coordinator names several coordinators ("a:29650,b:29650").
inline bool IsCoordinatorList(const std::string& coordinator) {
  return coordinator.find(',') != std::string::npos;
}
// Every call carries the --timeout deadline; with several coordinators it
// waits for a leader until then (wait_for_ready) instead of failing at once.
void SetDeadline(grpc::ClientContext& context, const GlobalOptions& global);
// Why none of the coordinators `list` names leads, if one says (Note [Why
// none leads] in common/grpc_util.cc); empty otherwise. Takes up to 3 s.
std::string WhyNoneLeads(const std::string& list);
// Prints "chorus CMD: message" (with a hint when nothing answered) on
// global.err and returns the exit code: 2 for bad input, 1 otherwise.
int ReportError(const std::string& command, const absl::Status& status,
                const GlobalOptions& global);
// The message as JSON with the proto field names (the stable --json format);
// indented, or on one line when `one_line` (for streams of records).
std::string ToJson(const google::protobuf::Message& message, bool one_line = false);
// Unix microseconds as local "YYYY-MM-DD HH:MM:SS", or "-" for 0.
std::string FormatTime(int64_t unix_us);
// "PENDING", "RUNNING", ...
std::string StateName(v1::Job::State state);

// A path the user typed, relative to where they typed it (also under
// `bazel run`, which changes the working directory and passes the original
// one in BUILD_WORKING_DIRECTORY).
std::string UserPath(const std::string& path);
// Loads a spec the user named and makes the files it names (model.torchscript
// .path, data dirs and files) absolute against the user's directory, so rank
// processes started elsewhere find them. A program spec gets the user's
// directory as program.working_dir when it sets none, and its argv[0] must
// be an executable file on this machine (INVALID_ARGUMENT naming
// program.argv[0] otherwise).
absl::StatusOr<v1::JobSpec> LoadUserJobSpec(const std::string& path);

}  // namespace chorus::client

#endif  // CHORUS_CLIENT_RPC_H_
