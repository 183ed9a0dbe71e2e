#include "client/cli.h"

#include <string>
#include <vector>

#include "client/rpc.h"
#include "common/env_names.h"
#include "common/host_port.h"

namespace chorus::client {

int RunChorus(int argc, const char* const* argv, GlobalOptions& global) {
  CLI::App app{"chorus: submit and watch data-parallel training jobs on a Chorus coordinator."};
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the subcommand
  app.add_option("--coordinator", global.coordinator,
                 "Coordinator address, HOST:PORT, or every coordinator of a cluster that has "
                 "several, \"a:29650,b:29650,c:29650\": calls go to the leader and wait for a "
                 "new one (within --timeout) while leadership moves.")
      ->envname(kEnvCoordinator)
      ->check([](const std::string& value) -> std::string {
        // One address is checked by the channel (any gRPC target works).
        if (!IsCoordinatorList(value)) return "";
        absl::StatusOr<std::vector<HostPort>> list = ParseHostPortList(value);
        return list.ok() ? "" : std::string(list.status().message());
      })
      ->capture_default_str();
  app.add_option("--timeout", global.timeout_seconds,
                 "Seconds to wait for the coordinator on each call.")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--token_file", global.token_file,
                 "File holding your (user or admin) token for a coordinator that requires one "
                 "(or set CHORUS_TOKEN / CHORUS_TOKEN_FILE; the token of a running `chorus up` "
                 "is found by itself); it must not be readable by others. `chorus whoami` "
                 "says who it makes you.");
  app.add_option("--tls_ca", global.tls_ca,
                 "PEM CA bundle to verify a TLS coordinator with (or CHORUS_TLS_CA).");
  app.add_option(
      "--tls_cert", global.tls_cert,
      "PEM client certificate, for a coordinator that requires one (or CHORUS_TLS_CERT).");
  app.add_option("--tls_key", global.tls_key, "PEM key of --tls_cert (or CHORUS_TLS_KEY).");

  int exit_code = kExitOk;
  AddVersionCommand(app, global, exit_code);
  AddValidateCommand(app, global, exit_code);
  AddPingCommand(app, global, exit_code);
  AddCoordinatorsCommand(app, global, exit_code);
  AddSubmitCommand(app, global, exit_code);
  AddJobsCommand(app, global, exit_code);
  AddQueueCommand(app, global, exit_code);
  AddStatusCommand(app, global, exit_code);
  AddTopCommand(app, global, exit_code);
  AddCancelCommand(app, global, exit_code);
  AddWatchCommand(app, global, exit_code);
  AddLogsCommand(app, global, exit_code);
  AddCheckpointsCommand(app, global, exit_code);
  AddExportCommand(app, global, exit_code);
  AddDatasetCommand(app, global, exit_code);
  AddCheckpointCommand(app, global, exit_code);
  AddUpCommand(app, global, exit_code);
  AddDrainCommand(app, global, exit_code);
  AddAgentsCommand(app, global, exit_code);
  AddWhoamiCommand(app, global, exit_code);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e, *global.out, *global.err);  // prints help or the error
    return code == 0 ? 0 : kExitBadInput;
  }
  return exit_code;
}

}  // namespace chorus::client
