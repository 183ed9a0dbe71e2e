// What the chorus subcommands share to call the coordinator: stubs, deadlines,
// turning errors into messages and exit codes, and printing protos.
#ifndef CHORUS_CLIENT_RPC_H_
#define CHORUS_CLIENT_RPC_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "client/commands.h"
#include "google/protobuf/message.h"
#include "grpcpp/client_context.h"

namespace chorus::client {

std::unique_ptr<v1::JobService::Stub> JobStub(const GlobalOptions& global);
// Every call carries the --timeout deadline.
void SetDeadline(grpc::ClientContext& context, const GlobalOptions& global);
// Prints "chorus CMD: message" (with a hint when nothing answered) and
// returns the exit code: 2 for bad input, 1 otherwise.
int ReportError(const std::string& command, const absl::Status& status,
                const GlobalOptions& global);
// The message as JSON with the proto field names (the stable --json format).
std::string ToJson(const google::protobuf::Message& message);
// Unix microseconds as local "YYYY-MM-DD HH:MM:SS", or "-" for 0.
std::string FormatTime(int64_t unix_us);
// "PENDING", "RUNNING", ...
std::string StateName(v1::Job::State state);

}  // namespace chorus::client

#endif  // CHORUS_CLIENT_RPC_H_
