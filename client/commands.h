// The chorus CLI's subcommands, one file each. Each Add*Command registers a
// CLI11 subcommand on `app`; when it runs it stores the process exit code in
// `exit_code` (0 success, 1 runtime failure, 2 bad input).
//
// Thread-safety: build and run an app on one thread; `global` must outlive
// the app (the commands keep a reference to it).
//
// Example:
//   CLI::App app;
//   GlobalOptions global;
//   global.channel = server->InProcessChannel(grpc::ChannelArguments());  // a test's fake
//   int exit_code = kExitOk;
//   AddJobsCommand(app, global, exit_code);
//   app.parse(argc, argv);
#ifndef CHORUS_CLIENT_COMMANDS_H_
#define CHORUS_CLIENT_COMMANDS_H_

#include <iostream>
#include <memory>
#include <ostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "chorus/v1/coordinator.pb.h"
#include "grpcpp/channel.h"

namespace chorus::client {

// Options every subcommand that talks to the coordinator shares, and where
// the commands print.
struct GlobalOptions {
  std::string coordinator = "127.0.0.1:29650";
  double timeout_seconds = 5;
  // Credentials (common/auth.h); empty ones fall back to CHORUS_TOKEN,
  // CHORUS_TOKEN_FILE, CHORUS_TLS_CA, CHORUS_TLS_CERT, CHORUS_TLS_KEY.
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  // When set, every call goes over this channel (its own credentials; the
  // ones above are not loaded) instead of one dialled to `coordinator`, which
  // then only names the coordinator in messages. Tests inject a fake's here.
  std::shared_ptr<grpc::Channel> channel;
  // Results go to `out`, progress and errors to `err`; not owned.
  std::ostream* out = &std::cout;
  std::ostream* err = &std::cerr;
};

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

void AddVersionCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddValidateCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddPingCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddCoordinatorsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddSubmitCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddJobsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddQueueCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddStatusCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddCancelCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddUpCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddWatchCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddLogsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddCheckpointsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddExportCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddCheckpointCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddTopCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddDrainCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddAgentsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddDatasetCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);
void AddWhoamiCommand(CLI::App& app, const GlobalOptions& global, int& exit_code);

// The coordinator's queue in placement order (client/queue.cc).
absl::StatusOr<v1::GetQueueResponse> GetQueue(const GlobalOptions& global);
// The table `chorus queue` prints for `queue`.
std::string FormatQueue(const v1::GetQueueResponse& queue);

// One line for an agent: id, host, state, busy slots, jobs (client/drain.cc).
std::string FormatAgent(const v1::AgentInfo& agent);

// The table `chorus top` draws for `status` (client/top.cc).
std::string FormatTop(const v1::JobStatus& status);

}  // namespace chorus::client

#endif  // CHORUS_CLIENT_COMMANDS_H_
