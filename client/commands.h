// The chorus CLI's subcommands, one file each. Each Add*Command registers a
// CLI11 subcommand on `app`; when it runs it stores the process exit code in
// `exit_code` (0 success, 1 runtime failure, 2 bad input).
#ifndef CHORUS_CLIENT_COMMANDS_H_
#define CHORUS_CLIENT_COMMANDS_H_

#include <string>

#include "CLI/CLI.hpp"

namespace chorus::client {

// Options every subcommand that talks to the coordinator shares.
struct GlobalOptions {
  std::string coordinator = "127.0.0.1:29650";
  double timeout_seconds = 5;
  // Credentials (common/auth.h); empty ones fall back to CHORUS_TOKEN,
  // CHORUS_TOKEN_FILE, CHORUS_TLS_CA, CHORUS_TLS_CERT, CHORUS_TLS_KEY.
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
};

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

void AddVersionCommand(CLI::App& app, int& exit_code);
void AddValidateCommand(CLI::App& app, int& exit_code);
void AddPingCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddSubmitCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddJobsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddStatusCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddCancelCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddUpCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddWatchCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddLogsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddCheckpointsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddExportCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddCheckpointCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);

}  // namespace chorus::client

#endif  // CHORUS_CLIENT_COMMANDS_H_
