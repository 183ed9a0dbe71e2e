// chorus: the command line for Chorus training jobs.

#include <iostream>

#include "client/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"chorus: submit and watch data-parallel training jobs on a Chorus coordinator."};
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the subcommand
  chorus::client::GlobalOptions global;
  app.add_option("--coordinator", global.coordinator, "Coordinator address, HOST:PORT.")
      ->envname("CHORUS_COORDINATOR")
      ->capture_default_str();
  app.add_option("--timeout", global.timeout_seconds,
                 "Seconds to wait for the coordinator on each call.")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--token_file", global.token_file,
                 "File holding the bearer token for a coordinator that requires one (or set "
                 "CHORUS_TOKEN / CHORUS_TOKEN_FILE).");
  app.add_option("--tls_ca", global.tls_ca,
                 "PEM CA bundle to verify a TLS coordinator with (or CHORUS_TLS_CA).");
  app.add_option(
      "--tls_cert", global.tls_cert,
      "PEM client certificate, for a coordinator that requires one (or CHORUS_TLS_CERT).");
  app.add_option("--tls_key", global.tls_key, "PEM key of --tls_cert (or CHORUS_TLS_KEY).");

  int exit_code = chorus::client::kExitOk;
  chorus::client::AddVersionCommand(app, exit_code);
  chorus::client::AddValidateCommand(app, exit_code);
  chorus::client::AddPingCommand(app, global, exit_code);
  chorus::client::AddSubmitCommand(app, global, exit_code);
  chorus::client::AddJobsCommand(app, global, exit_code);
  chorus::client::AddStatusCommand(app, global, exit_code);
  chorus::client::AddCancelCommand(app, global, exit_code);
  chorus::client::AddWatchCommand(app, global, exit_code);
  chorus::client::AddLogsCommand(app, global, exit_code);
  chorus::client::AddCheckpointsCommand(app, global, exit_code);
  chorus::client::AddExportCommand(app, global, exit_code);
  chorus::client::AddCheckpointCommand(app, global, exit_code);
  chorus::client::AddUpCommand(app, global, exit_code);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help or the error
    return code == 0 ? 0 : chorus::client::kExitBadInput;
  }
  return exit_code;
}
