// The whole chorus command line: the global options, every subcommand, and
// the exit code of a run. main() and the commands' tests share it, so a test
// runs exactly what a user types.
//
// Thread-safety: one run at a time per GlobalOptions (the options are parsed
// into it).
//
// Example:
//   GlobalOptions global;  // or with a test's channel and streams
//   const char* argv[] = {"chorus", "jobs", "--json"};
//   int exit_code = RunChorus(3, argv, global);
#ifndef CHORUS_CLIENT_CLI_H_
#define CHORUS_CLIENT_CLI_H_

#include "client/commands.h"

namespace chorus::client {

// Parses `argv` (global options before or after the subcommand, filling
// `global`) and runs the subcommand. Returns the process exit code: the
// command's, 0 for --help, 2 for a usage error (printed to global.err).
int RunChorus(int argc, const char* const* argv, GlobalOptions& global);

}  // namespace chorus::client

#endif  // CHORUS_CLIENT_CLI_H_
