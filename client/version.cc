// chorus version: what this CLI is and which API it speaks.

#include <iostream>

#include "client/commands.h"
#include "common/device.h"
#include "common/version.h"

namespace chorus::client {

void AddVersionCommand(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("version", "Print the Chorus version and build features.");
  cmd->callback([&exit_code] {
    std::cout << "chorus " << kVersion << " (api " << kApiVersion
              << ", cuda: " << (BuiltWithCuda() ? "yes" : "no") << ")\n";
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
