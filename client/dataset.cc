// chorus dataset pack: writes tar shards for data.shards by running
// chorus-dataset-pack (installed beside the worker binaries, which link
// LibTorch to read tensor_files; the CLI does not).

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "common/paths.h"

extern char** environ;

namespace chorus::client {

void AddDatasetCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* dataset = app.add_subcommand("dataset", "Prepare datasets for data.shards.");
  dataset->require_subcommand(1);
  CLI::App* pack = dataset->add_subcommand(
      "pack",
      "Write WebDataset-style tar shards (KEY.x.npy and KEY.y.npy members) from a tensor_file "
      "(torch.save({'x': ..., 'y': ...})) or a folder of KEY.x.npy / KEY.y.npy files, to "
      "OUT-000000.tar, OUT-000001.tar, ...; prints the data.shards.paths glob.");
  auto from = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto per_shard = std::make_shared<int64_t>(10000);
  pack->add_option("--from", *from, "A tensor_file (.pt) or a folder of .npy pairs.")->required();
  pack->add_option("--out", *out, "Shard path prefix, e.g. /data/train.")->required();
  pack->add_option("--samples_per_shard", *per_shard, "Samples per shard (default 10000).");
  pack->callback([from, out, per_shard, &global, &exit_code] {
    const std::string packer = CompanionBinary(ExecutableDir(), "chorus-dataset-pack", "worker");
    if (access(packer.c_str(), X_OK) != 0) {
      *global.err << "chorus dataset pack: " << packer
                  << " is missing; build it with `bazel build //worker:chorus-dataset-pack`\n";
      exit_code = kExitFailure;
      return;
    }
    std::vector<std::string> args = {
        packer, "--from", *from, "--out", *out, "--samples_per_shard", absl::StrCat(*per_shard)};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    int status = 0;
    if (posix_spawn(&pid, packer.c_str(), nullptr, nullptr, argv.data(), environ) != 0 ||
        waitpid(pid, &status, 0) != pid) {
      *global.err << "chorus dataset pack: cannot run " << packer << "\n";
      exit_code = kExitFailure;
      return;
    }
    exit_code = WIFEXITED(status) && WEXITSTATUS(status) == 0 ? kExitOk : kExitBadInput;
  });
}

}  // namespace chorus::client
