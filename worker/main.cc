// chorus-worker: the node agent, one per machine. It advertises its slots to
// the coordinator and runs one rank process per assigned slot.

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/device.h"
#include "common/env_names.h"
#include "common/host_port.h"
#include "common/logging.h"
#include "common/version.h"
#include "glog/logging.h"
#include "worker/agent/agent.h"
#include "worker/agent/slots.h"

namespace {

struct AgentFlags {
  std::string coordinator = "127.0.0.1:29650";
  std::string slots = "1";
  int threads_per_slot = 1;
  std::string device = "cpu";
  int threads_per_rank = 1;
  bool bind_cpus = true;
  bool rank_cgroups = true;
  std::string host;
  double connect_timeout_seconds = 30;
  std::string rank_binary;
  std::string rank_host;
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string rank_uid_range;
  int verbosity = 0;
};

// The local address the kernel would use to reach `host`: a UDP socket is
// "connected" (no packet is sent) and asked for its own address.
absl::StatusOr<std::string> LocalAddressTowardsHost(const std::string& host) {
  if (host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1")
    return std::string("127.0.0.1");
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError("cannot resolve the coordinator host " + host);
  }
  std::string result;
  int fd = socket(found->ai_family, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char text[INET6_ADDRSTRLEN] = {0};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const void* raw =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, raw, text, sizeof(text)) != nullptr) result = text;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  if (result.empty())
    return absl::UnavailableError("no local address routes to the coordinator host " + host);
  return result;
}

// The local address that reaches the first coordinator of the list
// --coordinator that one routes to (they share a network, usually).
absl::StatusOr<std::string> LocalAddressTowards(const std::string& coordinator) {
  absl::StatusOr<std::vector<chorus::HostPort>> list = chorus::ParseHostPortList(coordinator);
  if (!list.ok())
    return absl::InvalidArgumentError(absl::StrCat("--coordinator: ", list.status().message()));
  absl::Status last;
  for (const chorus::HostPort& address : *list) {
    absl::StatusOr<std::string> local = LocalAddressTowardsHost(address.host);
    if (local.ok()) return local;
    last = local.status();
  }
  return last;
}

std::string LocalHostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

void AddFlags(CLI::App& app, AgentFlags& flags) {
  app.add_option("--coordinator", flags.coordinator,
                 "Coordinator address, HOST:PORT, or every coordinator of a cluster that has "
                 "several, \"a:29650,b:29650,c:29650\": the agent and its ranks follow the "
                 "leader.")
      ->envname(chorus::kEnvCoordinator)
      ->capture_default_str();
  app.add_option("--slots", flags.slots,
                 "Rank processes this node can run: a number in [1, 1024], or auto. auto on "
                 "--device cpu: the CPUs this process may use (its affinity mask, so cpusets and "
                 "Slurm bindings count) divided by --threads_per_slot, at least 1; on --device "
                 "cuda: the GPUs CUDA sees (an error in a build without CUDA).")
      ->envname(chorus::kEnvSlots)
      ->capture_default_str();
  app.add_option("--threads_per_slot", flags.threads_per_slot,
                 "With --slots auto on cpu: CPUs one slot stands for (set it to the "
                 "resources.threads_per_rank of the jobs this node runs).")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--device", flags.device, "Device the ranks train on.")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--threads_per_rank", flags.threads_per_rank,
                 "Intra-op threads per rank process (CPU).")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--bind_cpus", flags.bind_cpus,
                 "Start each rank bound to its slot's share of the CPUs this process may run "
                 "on (slot i of N gets the i-th of N contiguous shares; its threads and child "
                 "processes stay there); nothing is bound when there are more slots than CPUs. "
                 "false: leave placement to the scheduler.")
      ->envname(chorus::kEnvBindCpus)
      ->capture_default_str();
  app.add_option("--rank_cgroups", flags.rank_cgroups,
                 "Run each rank in a cgroup of its own with its job's memory and process limits "
                 "(resources.memory_bytes, resources.max_processes) and its slot's CPUs; needs "
                 "root or a delegated cgroup, and without them the ranks run unlimited after one "
                 "warning (docs/operating.md). false: never.")
      ->envname(chorus::kEnvRankCgroups)
      ->capture_default_str();
  app.add_option("--host", flags.host, "Name this node reports to the coordinator.")
      ->capture_default_str();
  app.add_option("--rank_host", flags.rank_host,
                 "Address this node's ranks bind and give their peers for training traffic "
                 "(default: the local address that reaches the coordinator; 127.0.0.1 for a "
                 "loopback coordinator).");
  app.add_option("--rank_binary", flags.rank_binary,
                 "The rank program (default: chorus-rank next to chorus-worker).");
  app.add_option("--connect_timeout", flags.connect_timeout_seconds,
                 "Seconds to wait for the coordinator to answer at startup.")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--token_file", flags.token_file,
                 "File holding an agent (or admin) token, for a coordinator started with "
                 "--token_file (or set CHORUS_TOKEN / CHORUS_TOKEN_FILE); readable by its owner only. "
                 "Ranks get their job's own credential instead.");
  app.add_option("--tls_ca", flags.tls_ca,
                 "PEM CA bundle to verify a TLS coordinator (or CHORUS_TLS_CA).");
  app.add_option("--tls_cert", flags.tls_cert,
                 "PEM client certificate for mTLS (or CHORUS_TLS_CERT).");
  app.add_option("--tls_key", flags.tls_key, "PEM key of --tls_cert (or CHORUS_TLS_KEY).");
  app.add_option("--rank_uid_range", flags.rank_uid_range,
                 "FIRST-LAST: run the ranks of a job whose owner the coordinator's token file "
                 "maps to no Unix account (unix=) as a uid of this range of its own (gid = uid; "
                 "no passwd entry needed), released when the job's ranks here are gone. Needs "
                 "an agent running as root; choose uids no account of the machine uses. "
                 "docs/operating.md#rank-accounts");
  app.add_option("-v,--verbosity", flags.verbosity, "glog VLOG level.")->capture_default_str();
  app.set_version_flag("--version", std::string(chorus::kVersion));
}

// The agent's options from its flags: slots resolved, device checked, the
// client's security configured and the rank processes' environment set.
// An error says what to fix.
absl::StatusOr<chorus::AgentOptions> Configure(AgentFlags& flags) {
  const auto device =
      flags.device == "cuda" ? chorus::v1::ResourceSpec::CUDA : chorus::v1::ResourceSpec::CPU;
  absl::StatusOr<int> slots = chorus::ResolveSlots(flags.slots, device, flags.threads_per_slot,
                                                   chorus::SlotFacts::OfThisMachine());
  if (!slots.ok()) return slots.status();
  if (flags.slots == "auto") LOG(INFO) << "--slots auto: offering " << *slots << " slot(s)";
  if (absl::Status s = chorus::CheckDevice(device, *slots); !s.ok()) return s;
  absl::StatusOr<chorus::ClientSecurity> security =
      chorus::LoadClientSecurity(flags.token_file, flags.tls_ca, flags.tls_cert, flags.tls_key);
  if (!security.ok()) return security.status();
  // Rank processes inherit the environment, but not the agent's token: each
  // launch carries its job's credential, which the agent gives the job's
  // ranks as CHORUS_TOKEN (Note [Job credentials] in
  // common/job_credentials.h). TLS files they share, by absolute path.
  // The token's bytes are overwritten too: unsetenv only drops the pointer,
  // and /proc/PID/environ shows the memory the environment started in.
  if (char* token = std::getenv(chorus::kEnvToken); token != nullptr) {
    std::memset(token, 0, std::strlen(token));
  }
  unsetenv(chorus::kEnvToken);
  unsetenv(chorus::kEnvTokenFile);
  for (const auto& [flag, env] : {std::pair{&flags.tls_ca, chorus::kEnvTlsCa},
                                  std::pair{&flags.tls_cert, chorus::kEnvTlsCert},
                                  std::pair{&flags.tls_key, chorus::kEnvTlsKey}}) {
    if (!flag->empty()) setenv(env, std::filesystem::absolute(*flag).c_str(), 1);
  }
  chorus::ConfigureClient(*std::move(security));
  if (absl::StatusOr<std::vector<chorus::HostPort>> list =
          chorus::ParseHostPortList(flags.coordinator);
      !list.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--coordinator: ", list.status().message()));
  }
  if (flags.rank_host.empty()) {
    absl::StatusOr<std::string> local = LocalAddressTowards(flags.coordinator);
    if (!local.ok()) {
      return absl::Status(local.status().code(),
                          absl::StrCat(local.status().message(), "; pass --rank_host"));
    }
    flags.rank_host = *local;
  }
  setenv(chorus::kEnvRankHost, flags.rank_host.c_str(), 1);
  chorus::AgentOptions options;
  if (!flags.rank_uid_range.empty()) {
    absl::StatusOr<chorus::UidRange> range = chorus::ParseUidRange(flags.rank_uid_range);
    if (!range.ok()) return range.status();
    if (geteuid() != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("--rank_uid_range needs an agent running as root (this one runs as uid ",
                       geteuid(), "): only root may start processes as other uids"));
    }
    options.rank_uid_range = *range;
  }
  const char* tmp = std::getenv("TMPDIR");
  options.rank_temp_root = tmp != nullptr && *tmp == '/' ? tmp : "/tmp";
  options.coordinator = flags.coordinator;
  options.slots = *slots;
  options.device = device;
  options.threads_per_rank = flags.threads_per_rank;
  options.bind_cpus = flags.bind_cpus;
  options.rank_cgroups = flags.rank_cgroups;
  options.host = flags.host;
  options.rank_binary = flags.rank_binary;
  options.connect_timeout = absl::Seconds(flags.connect_timeout_seconds);
  return options;
}

// Runs the agent until it fails or SIGINT/SIGTERM stops it (ranks get
// SIGTERM, then SIGKILL after the grace period; nothing is left behind).
absl::Status RunUntilStopped(const chorus::AgentOptions& options) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  chorus::Agent agent(options);
  std::thread signals([&] {
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    agent.Stop();
  });
  absl::Status status = agent.Run();
  agent.Stop();
  pthread_kill(signals.native_handle(), SIGTERM);  // release the signal thread if no signal came
  signals.join();
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  // Undumpable: no process of another uid (a rank) may read this one's
  // memory, environment or descriptors through /proc or ptrace; its token
  // lives there (Note [Rank accounts] in worker/agent/rank_accounts.h).
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  CLI::App app{
      "chorus-worker: Chorus node agent, one per machine. Connects to the coordinator, offers "
      "--slots rank slots on --device (a number, or auto: CPUs / --threads_per_slot on cpu, the "
      "GPU count on cuda), starts one chorus-rank process per assigned slot and "
      "supervises it (own process group, output captured, exit reported). SIGINT/SIGTERM stop "
      "the ranks (SIGTERM, then SIGKILL after 5 s) and the agent. Reconnects if the coordinator "
      "restarts. Ranks keep decoded Fashion-MNIST in CHORUS_DATA_CACHE (default "
      "$HOME/.cache/chorus/datasets; off: no cache), shared by the ranks of this machine."};
  AgentFlags flags;
  flags.host = LocalHostName();
  AddFlags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  chorus::InitLogging(argv[0], flags.verbosity);
  absl::StatusOr<chorus::AgentOptions> options = Configure(flags);
  if (!options.ok()) {
    std::cerr << "chorus-worker: " << options.status().message() << "\n";
    return 2;
  }
  if (absl::Status status = RunUntilStopped(*options); !status.ok()) {
    std::cerr << "chorus-worker: " << status.message()
              << "; start chorus-coordinator first or fix --coordinator\n";
    return 1;
  }
  return 0;
}
