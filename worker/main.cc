// chorus-worker: the node agent, one per machine. It advertises its slots to
// the coordinator and runs one rank process per assigned slot.

#include <unistd.h>

#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "common/device.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/version.h"
#include "glog/logging.h"

namespace {

struct AgentFlags {
  std::string coordinator = "127.0.0.1:29650";
  int slots = 1;
  std::string device = "cpu";
  int threads_per_rank = 1;
  std::string host;
  double connect_timeout_seconds = 10;
  int verbosity = 0;
};

std::string LocalHostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "chorus-worker: Chorus node agent, one per machine. This build checks that --device can "
      "host --slots ranks and that the coordinator answers, then exits with code 3: launching "
      "rank processes needs the coordinator's AgentService, which is not built yet."};
  AgentFlags flags;
  flags.host = LocalHostName();
  app.add_option("--coordinator", flags.coordinator, "Coordinator address, HOST:PORT.")
      ->envname("CHORUS_COORDINATOR")
      ->capture_default_str();
  app.add_option("--slots", flags.slots, "Rank processes this node can run (e.g. GPUs).")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--device", flags.device, "Device the ranks train on.")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--threads_per_rank", flags.threads_per_rank,
                 "Intra-op threads per rank process (CPU).")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--host", flags.host, "Name this node reports to the coordinator.")
      ->capture_default_str();
  app.add_option("--connect_timeout", flags.connect_timeout_seconds,
                 "Seconds to wait for the coordinator to answer at startup.")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-v,--verbosity", flags.verbosity, "glog VLOG level.")->capture_default_str();
  app.set_version_flag("--version", std::string(chorus::kVersion));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  chorus::InitLogging(argv[0], flags.verbosity);

  const auto device = flags.device == "cuda" ? chorus::v1::ResourceSpec::CUDA
                                             : chorus::v1::ResourceSpec::CPU;
  if (absl::Status s = chorus::CheckDevice(device, flags.slots); !s.ok()) {
    std::cerr << "chorus-worker: " << s.message() << "\n";
    return 2;
  }
  auto health = chorus::CheckHealth(flags.coordinator,
                                    absl::Seconds(flags.connect_timeout_seconds));
  if (!health.ok()) {
    std::cerr << "chorus-worker: " << health.status().message()
              << "; start chorus-coordinator first or fix --coordinator\n";
    return 1;
  }
  LOG(INFO) << "coordinator at " << flags.coordinator << " is "
            << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*health) << "; node "
            << flags.host << " offers " << flags.slots << " " << flags.device << " slot(s)";
  // The AgentService the coordinator needs to hand out work does not exist in
  // this build, so there is nothing to wait for: say so instead of idling.
  std::cerr << "chorus-worker: this build cannot launch ranks yet: the coordinator has no "
               "AgentService to assign work\n";
  return 3;
}
