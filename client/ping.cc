// chorus ping: is a coordinator answering at --coordinator?

#include <iostream>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "client/commands.h"
#include "client/rpc.h"
#include "common/grpc_util.h"
#include "common/json.h"
#include "grpc/health/v1/health.pb.h"

namespace chorus::client {

using grpc::health::v1::HealthCheckResponse;

void AddPingCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "ping",
      "Ask the coordinator's health service whether it is serving. Prints SERVING and exits "
      "0, or says why not and exits 1 (NOT_SERVING: no coordinator can be elected, e.g. its "
      "etcd is unreachable; the reason follows).");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print {\"coordinator\": ADDR, \"status\": STATUS}.");
  cmd->callback([json, &global, &exit_code] {
    auto status = CheckHealth(CoordinatorChannel(global), global.coordinator,
                              absl::Seconds(global.timeout_seconds));
    if (!status.ok()) {
      *global.err << "chorus ping: " << status.status().message()
                  << ". Start one with `chorus-coordinator`, or pass --coordinator HOST:PORT.\n";
      exit_code = kExitFailure;
      return;
    }
    const std::string name = HealthCheckResponse::ServingStatus_Name(*status);
    // Note [A follower that cannot elect] in coordinator/service/follower_server.h.
    const std::string why =
        *status == HealthCheckResponse::NOT_SERVING ? WhyNoneLeads(global.coordinator) : "";
    if (*json) {
      *global.out << "{\"coordinator\": \"" << global.coordinator << "\", \"status\": \"" << name
                  << "\"" << (why.empty() ? "" : ", \"reason\": " + JsonString(why)) << "}\n";
    } else {
      *global.out << global.coordinator << ": " << name << (why.empty() ? "" : " (" + why + ")")
                  << "\n";
    }
    exit_code = *status == HealthCheckResponse::SERVING ? kExitOk : kExitFailure;
  });
}

}  // namespace chorus::client
