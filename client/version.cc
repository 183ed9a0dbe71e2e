// chorus version: what this CLI is and which API it speaks.

#include "common/version.h"

#include <iostream>
#include <memory>

#include "client/commands.h"
#include "common/device.h"

namespace chorus::client {

void AddVersionCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("version", "Print the Chorus version and build features.");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print {\"version\", \"api\", \"cuda\"}.");
  cmd->callback([json, &global, &exit_code] {
    if (*json) {
      *global.out << "{\"version\": \"" << kVersion << "\", \"api\": \"" << kApiVersion
                  << "\", \"cuda\": " << (BuiltWithCuda() ? "true" : "false") << "}\n";
    } else {
      *global.out << "chorus " << kVersion << " (api " << kApiVersion
                  << ", cuda: " << (BuiltWithCuda() ? "yes" : "no") << ")\n";
    }
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
