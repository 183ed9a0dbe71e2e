// chorus ping: is a coordinator answering at --coordinator?

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "client/rpc.h"
#include "common/grpc_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"

namespace chorus::client {
namespace {

using grpc::health::v1::HealthCheckResponse;

// Asks the health service behind `global`'s channel for the whole server's
// status, waiting up to --timeout for a connection. The messages are those
// of CheckHealth (common/grpc_util.h), which does the same over a channel it
// dials itself.
absl::StatusOr<HealthCheckResponse::ServingStatus> CheckCoordinatorHealth(
    const GlobalOptions& global) {
  auto stub = grpc::health::v1::Health::NewStub(CoordinatorChannel(global));
  const absl::Duration timeout = absl::Seconds(global.timeout_seconds);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  // Wait for the connection within the deadline instead of failing at once
  // while the channel is still connecting.
  context.set_wait_for_ready(true);
  grpc::health::v1::HealthCheckRequest request;
  HealthCheckResponse response;
  absl::Status s = FromGrpcStatus(stub->Check(&context, request, &response));
  if (s.code() == absl::StatusCode::kDeadlineExceeded ||
      s.code() == absl::StatusCode::kUnavailable) {
    return absl::Status(s.code(), absl::StrCat("no coordinator answered at ", global.coordinator,
                                               " within ", absl::FormatDuration(timeout)));
  }
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("health check of ", global.coordinator, " failed: ", s.message()));
  }
  return response.status();
}

}  // namespace

void AddPingCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "ping",
      "Ask the coordinator's health service whether it is serving. Prints SERVING and exits "
      "0, or says why not and exits 1.");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print {\"coordinator\": ADDR, \"status\": STATUS}.");
  cmd->callback([json, &global, &exit_code] {
    auto status = CheckCoordinatorHealth(global);
    if (!status.ok()) {
      *global.err << "chorus ping: " << status.status().message()
                  << ". Start one with `chorus-coordinator`, or pass --coordinator HOST:PORT.\n";
      exit_code = kExitFailure;
      return;
    }
    const std::string name = HealthCheckResponse::ServingStatus_Name(*status);
    if (*json) {
      *global.out << "{\"coordinator\": \"" << global.coordinator << "\", \"status\": \"" << name
                  << "\"}\n";
    } else {
      *global.out << global.coordinator << ": " << name << "\n";
    }
    exit_code = *status == HealthCheckResponse::SERVING ? kExitOk : kExitFailure;
  });
}

}  // namespace chorus::client
