// chorus-coordinator: the daemon every worker and user talks to.

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/memory.h"
#include "common/version.h"
#include "coordinator/etcd/etcd_coordinator_state.h"
#include "coordinator/etcd/state_url.h"
#include "coordinator/scheduling/scheduling_policy.h"
#include "coordinator/service/coordinator_process.h"
#include "coordinator/service/server.h"
#include "glog/logging.h"

namespace {

std::string DefaultStateDir() {
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg != nullptr && *xdg) {
    return std::string(xdg) + "/chorus";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home) {
    return std::string(home) + "/.local/state/chorus";
  }
  return "/var/lib/chorus";
}

// What the command line sets besides the server's options.
struct Flags {
  chorus::ServerOptions options;
  std::string port_file;
  std::string http_port_file;
  int verbosity = 0;
  bool check_flags = false;
  double recovery_grace_seconds = 30;
  double agent_reconnect_grace_seconds = 10;
  std::string scheduling_policy;
  double data_hello_seconds = 0;
  double data_io_seconds = 0;
  // --state and the etcd flags (docs/ha.md).
  std::string state;
  chorus::StateUrl state_url;
  chorus::EtcdCoordinatorStateOptions etcd;
  double leader_lease_seconds = 2;
  std::string advertise_address;
  bool mutex_deadlock_detection = false;
};

// Where it listens, who may call, where its state is.
void AddServingFlags(CLI::App& app, Flags& flags) {
  chorus::ServerOptions& options = flags.options;
  app.add_option("--listen", options.listen,
                 "HOST:PORT to serve on; port 0 picks a free one. A non-loopback address needs "
                 "--token_file.")
      ->capture_default_str();
  app.add_option("--token_file", options.token_file,
                 "Require bearer tokens, on loopback too: a file of lines \"ROLE TOKEN "
                 "[USER]\": \"admin TOKEN NAME\" (everything, every job), \"user TOKEN NAME\" "
                 "(submit; see, watch, cancel and read the logs and checkpoints of NAME's own "
                 "jobs) and \"agent TOKEN\" (node agents; \"worker\" is its old name); not "
                 "readable by others. Ranks get a credential of their own job instead. See "
                 "docs/security.md.");
  app.add_option("--tls_cert", options.tls_cert, "PEM certificate: serve TLS (with --tls_key).");
  app.add_option("--tls_key", options.tls_key, "PEM private key of --tls_cert.");
  app.add_option("--tls_client_ca", options.tls_client_ca,
                 "PEM CA bundle: require client certificates signed by it (mTLS).");
  app.add_option(
         "--checkpoint_data_port", options.checkpoint_data_port,
         "Port on --listen's host for checkpoint uploads (raw TCP beside gRPC, single-use "
         "tokens handed out over gRPC): 0 picks a free one, -1 turns it off and ranks upload "
         "over gRPC. Not used with --tls_cert (it is plaintext).")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
  app.add_option("--http_listen", options.http_listen,
                 "HOST:PORT of the HTTP port serving /metrics (Prometheus) and the status page; "
                 "\"off\" for none. Default: 127.0.0.1 on the port after --listen's (29651), a "
                 "free port when --listen's port is 0. A non-loopback address needs --token_file; "
                 "with --token_file every request needs an admin token (\"Authorization: Bearer "
                 "TOKEN\"), on loopback too.");
  app.add_option("--http_port_file", flags.http_port_file,
                 "Write the bound HTTP port to this file once listening (for scripts and tests).");
  app.add_flag("--enable_reflection", options.enable_reflection,
               "Serve gRPC server reflection (for grpcurl and similar tools).");
  app.add_option("--state_dir", options.state_dir,
                 "Directory for durable state; created if missing, locked while running, "
                 "kept private (mode 0700, files 0600).")
      ->capture_default_str();
  app.add_option("--port_file", flags.port_file,
                 "Write the bound port to this file once listening (for scripts and tests).");
  app.add_option("-v,--verbosity", flags.verbosity, "glog VLOG level.")->capture_default_str();
  app.add_flag("--mutex_deadlock_detection", flags.mutex_deadlock_detection,
               "Check the lock order at every mutex acquisition and abort on a cycle "
               "(abseil's debug-build check; about a tenth of a core at 16,384 ranks).")
      ->capture_default_str();
  app.add_flag("--check_flags", flags.check_flags,
               "Check the flags (addresses, ports that would collide, limits) and exit: 0 if "
               "they are sound, 1 with what is wrong. Touches no file and opens no port.");
}

// Where the durable state is when it is not SQLite in --state_dir (docs/ha.md).
void AddStateFlags(CLI::App& app, Flags& flags) {
  app.add_option("--state", flags.state,
                 "Keep the durable state (jobs, events, checkpoint manifests) in etcd instead of "
                 "SQLite in --state_dir: etcd://HOST:PORT[,HOST:PORT...]/PREFIX. Coordinators "
                 "with the same --state elect one leader through an etcd lease (docs/ha.md).");
  app.add_option("--checkpoint_dir", flags.options.checkpoint_dir,
                 "Where checkpoint files are kept (default: --state_dir/checkpoints). With "
                 "--state etcd:// it is required and must be storage every coordinator shares.");
  chorus::EtcdOptions& etcd = flags.etcd.etcd;
  app.add_option("--etcd_ca", etcd.ca_file, "PEM CA of the etcd members: talk TLS to etcd.");
  app.add_option("--etcd_cert", etcd.cert_file, "PEM client certificate for etcd (mTLS).");
  app.add_option("--etcd_key", etcd.key_file, "PEM private key of --etcd_cert.");
  app.add_option("--etcd_user", etcd.user, "etcd user (etcd authentication).");
  app.add_option("--etcd_password_file", etcd.password_file,
                 "File holding --etcd_user's password.");
  app.add_option("--advertise_address", flags.advertise_address,
                 "With --state etcd://: HOST:PORT this coordinator publishes as the leader's "
                 "address, for followers to name and clients to dial (port 0: the port --listen "
                 "bound). Default: --listen's address, which must then not be a wildcard "
                 "(0.0.0.0, [::]).");
  app.add_option("--leader_lease_seconds", flags.leader_lease_seconds,
                 "Lease of the leader in etcd: a leader that cannot renew it stops within this "
                 "long, and another takes over about this long after the leader dies.")
      ->capture_default_str();
}

// Limits and timeouts (docs/reliability.md).
void AddLimitFlags(CLI::App& app, Flags& flags) {
  chorus::ServerOptions& options = flags.options;
  app.add_option(
         "--recovery_grace_seconds", flags.recovery_grace_seconds,
         "After a restart, how long jobs that were running wait for their ranks to come back "
         "with their agents before they fail.")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option(
         "--agent_reconnect_grace_seconds", flags.agent_reconnect_grace_seconds,
         "How long a running job without an elastic block waits for the ranks of an agent that "
         "lost contact (its stream ended) to come back with it before it fails; 0: it fails at "
         "once. Elastic jobs re-form without the agent's ranks at once.")
      ->capture_default_str();
  app.add_option("--max_pending_jobs", options.max_pending_jobs,
                 "Most jobs waiting PENDING at once; one more submission is refused "
                 "(RESOURCE_EXHAUSTED) until some have started, ended or been cancelled.")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--scheduling_policy", flags.scheduling_policy,
                 "A file of per-user scheduling limits: slots in use per device, queued jobs, "
                 "highest priority, and the fair-share half-life (docs/scheduling.md). Read at "
                 "start; an error names the file and line. Default: no limits, half-life 1h.");
  app.add_option("--metrics_max_user_series", options.metrics_max_user_series,
                 "At most this many users get series of their own on /metrics (those holding "
                 "the most slots); the others are summed into user \"(others)\" "
                 "(docs/observability.md).")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--metrics_max_failed_series", options.metrics_max_failed_series,
                 "The newest this many failed jobs have a series on /metrics that carries their "
                 "reason (chorus_job_failed_timestamp_seconds; docs/observability.md).")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--metrics_max_rank_series", options.metrics_max_rank_series,
                 "A running job with more ranks than this gets summary series on /metrics "
                 "instead of one series per rank (the ranks a diagnosis names keep theirs; "
                 "docs/observability.md).")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--store_max_keys_per_job", options.store_max_keys_per_job,
                 "Most rendezvous store keys one job may hold (all its generations).")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--store_max_bytes_per_job", options.store_max_bytes_per_job,
                 "Most bytes of store keys and values one job may hold.")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--store_max_value_bytes", options.store_max_value_bytes, "Largest store value.")
      ->check(CLI::Range(int64_t{1}, chorus::kMaxValueLimit))
      ->capture_default_str();
  app.add_option("--checkpoint_max_upload_bytes", options.checkpoint_max_upload_bytes,
                 "Largest checkpoint (all files of one upload) the checkpoint data port takes.")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  flags.data_hello_seconds = absl::ToDoubleSeconds(options.checkpoint_data_hello_timeout);
  app.add_option("--checkpoint_data_hello_timeout_seconds", flags.data_hello_seconds,
                 "How long the checkpoint data port waits for a new connection's hello.")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  flags.data_io_seconds = absl::ToDoubleSeconds(options.checkpoint_data_io_timeout);
  app.add_option("--checkpoint_data_timeout_seconds", flags.data_io_seconds,
                 "How long the checkpoint data port waits on each send or receive of a running "
                 "upload before it drops the upload (and deletes what it sent).")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

// Checks what needs no file or socket; empty if the flags are sound.
std::string CheckFlags(const Flags& flags) {
  if (flags.options.http_listen == "off" && !flags.http_port_file.empty()) {
    return "--http_port_file needs an HTTP port (--http_listen off)";
  }
  absl::Status valid = chorus::ValidateServerOptions(flags.options);
  if (valid.ok() && flags.state_url.kind == chorus::StateUrl::Kind::kEtcd) {
    valid = chorus::ValidateEtcdCoordinatorStateOptions(flags.etcd);
    if (valid.ok()) {
      valid = chorus::ValidateAdvertisedAddress(flags.options.listen, flags.advertise_address);
    }
  } else if (valid.ok() && !flags.advertise_address.empty()) {
    return "--advertise_address is for coordinators sharing --state etcd://...: a coordinator "
           "alone publishes no address";
  }
  return valid.ok() ? "" : std::string(valid.message());
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// Parses --state into `flags`; empty if it is sound.
std::string ParseStateFlags(Flags& flags) {
  absl::StatusOr<chorus::StateUrl> url = chorus::ParseStateUrl(flags.state);
  if (!url.ok()) return std::string(url.status().message());
  flags.state_url = *url;
  flags.etcd.url = *url;
  flags.etcd.lease_ttl = absl::Seconds(flags.leader_lease_seconds);
  flags.etcd.checkpoint_dir = flags.options.checkpoint_dir;
  flags.etcd.self.id = absl::StrCat(HostName(), ":", getpid());
  flags.etcd.self.address =
      flags.advertise_address.empty() ? flags.options.listen : flags.advertise_address;
  return "";
}

// Writes `port` whole under a temporary name and renames it, so a reader
// never sees a partial file. Nothing to do for an empty path.
bool WritePortFile(const std::string& path, const char* flag, int port) {
  if (path.empty()) return true;
  std::ofstream out(path + ".tmp");
  out << port << "\n";
  out.close();
  if (!out || std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
    std::cerr << "chorus-coordinator: " << flag << " " << path << ": cannot write\n";
    return false;
  }
  return true;
}

// Runs a CoordinatorProcess over `leadership` (with a follower server while
// another coordinator leads, when `follow`) until SIGINT/SIGTERM, which give
// leadership up; the exit status. `on_listening` (if set) learns the ports
// once the first server has bound them, before the port files are written.
int RunProcess(const Flags& flags, const sigset_t& stop_signals, chorus::ServerOptions options,
               chorus::Leadership& leadership, bool follow,
               std::function<void(const chorus::LeaderLoop::Ports&)> on_listening = nullptr) {
  bool port_files_written = true;  // only the loop's thread
  std::unique_ptr<chorus::CoordinatorProcess> process;
  process = std::make_unique<chorus::CoordinatorProcess>(
      std::move(options), leadership, follow, [&](const chorus::LeaderLoop::Ports& ports) {
        if (on_listening) on_listening(ports);
        // The HTTP port's file first: a script that waits for --port_file finds both.
        port_files_written = WritePortFile(flags.http_port_file, "--http_port_file", ports.http) &&
                             WritePortFile(flags.port_file, "--port_file", ports.grpc);
        if (!port_files_written) process->Stop();
      });
  std::atomic<bool> ended{false};
  std::thread signals([&process, &ended, stop_signals] {
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    if (ended) return;
    LOG(INFO) << "received " << strsignal(signal_number) << ", shutting down";
    process->Stop();
  });
  const absl::Status ran = process->Run();
  // Releases the signal thread when the loop ended by itself (a startup
  // error, an election that cannot go on).
  ended = true;
  pthread_kill(signals.native_handle(), SIGTERM);
  signals.join();
  if (!ran.ok()) {
    std::cerr << "chorus-coordinator: " << ran.message() << "\n";
    return 1;
  }
  if (!port_files_written) return 1;
  LOG(INFO) << "coordinator stopped";
  return 0;
}

// With --state etcd://: follows (a follower server on the ports) while
// another coordinator leads, serves while this one leads, and follows again
// when leadership is lost; its writes are fenced from the moment it is not
// the leader. A signal stops it (exit 0).
int ServeFromEtcd(const Flags& flags, const sigset_t& stop_signals) {
  auto etcd = chorus::EtcdCoordinatorState::Connect(flags.etcd);
  if (!etcd.ok()) {
    std::cerr << "chorus-coordinator: " << etcd.status().message() << "\n";
    return 1;
  }
  // A --checkpoint_dir that is not the cluster's (another cluster's PREFIX,
  // storage that is not shared) is refused now rather than once elected;
  // an etcd it cannot read yet is no reason not to start: it says so as
  // NOT_SERVING (Note [A follower that cannot elect]).
  if (absl::Status dir = (*etcd)->CheckCheckpointDirectory(); absl::IsFailedPrecondition(dir)) {
    std::cerr << "chorus-coordinator: " << dir.message() << "\n";
    return 1;
  } else if (!dir.ok()) {
    LOG(WARNING) << "cannot check --checkpoint_dir against " << flags.state
                 << " yet: " << dir.message();
  }
  chorus::ServerOptions options = flags.options;
  options.open_state = [state = etcd->get()] { return state->OpenState(); };
  LOG(INFO) << "campaigning for the leadership of " << flags.state;
  chorus::EtcdLeadership& leadership = (*etcd)->leadership();
  // The leader record names the ports actually bound (the follower binds
  // them before the first campaign), not --listen's port 0.
  auto advertise = [&flags, &leadership](const chorus::LeaderLoop::Ports& ports) {
    chorus::AdvertisedAddress self =
        chorus::AdvertisedAddressOf(flags.options, flags.advertise_address, ports);
    leadership.SetSelfAddress(std::move(self.grpc), std::move(self.http_url));
  };
  return RunProcess(flags, stop_signals, std::move(options), leadership, /*follow=*/true,
                    advertise);
}

// Serves until SIGINT or SIGTERM; the exit status.
int Serve(const char* argv0, const Flags& flags) {
  chorus::InitLogging(argv0, flags.verbosity);
  // Note [Lock-order checks]
  // Debian's abseil is built without NDEBUG, so every absl::Mutex
  // acquisition in the process (gRPC's per-call mutexes included) updates a
  // global lock-order graph, and a mutex's destruction removes it again:
  // 10 % of the coordinator's CPU in a 16,384-rank re-formation
  // (docs/benchmarks.md). A release build of abseil skips this; the
  // coordinator does too unless asked. The unit tests keep the library's
  // default (abort on a cycle), and the tsan pass checks lock order as well.
  absl::SetMutexDeadlockDetectionMode(flags.mutex_deadlock_detection
                                          ? absl::OnDeadlockCycle::kAbort
                                          : absl::OnDeadlockCycle::kIgnore);
  // Every connection holds a descriptor; the usual soft limit (1024) would
  // cap the coordinator near a thousand clients.
  if (absl::StatusOr<uint64_t> files = chorus::RaiseOpenFileLimit(); files.ok()) {
    LOG(INFO) << "open-file limit " << *files;
  } else {
    LOG(WARNING) << files.status().message();
  }
  // Signals are taken synchronously by one thread only (RunProcess);
  // gRPC's threads, created after this, inherit the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  if (flags.state_url.kind == chorus::StateUrl::Kind::kEtcd) {
    return ServeFromEtcd(flags, stop_signals);
  }
  // One coordinator with its own state leads alone, from the start
  // (coordinator/state/leadership.h).
  chorus::SoleLeadership leadership(
      chorus::LeaderInfo{absl::StrCat(HostName(), ":", getpid()), flags.options.listen, "", {}});
  return RunProcess(flags, stop_signals, flags.options, leadership, /*follow=*/false);
}

}  // namespace

int main(int argc, char** argv) {
  // Checkpoint uploads arrive as a stream of 4 MB messages that gRPC and
  // protobuf allocate and free one after another; with glibc's adaptive
  // defaults the next chunk often faulted fresh memory in, a page at a time
  // (the final 201 MB upload of checkpoint_bench's job took 0.39-0.87 s;
  // 0.23-0.28 s with these settings and the upload reusing its buffers).
  chorus::MemoryReuseOptions reuse;
  reuse.trim_threshold = size_t{256} << 20;
  chorus::KeepFreedMemoryForReuse(reuse);
  CLI::App app{
      "chorus-coordinator: rendezvous, job queue, checkpoints and hang detection for Chorus "
      "training jobs. Serves gRPC (with the standard health service) until SIGINT/SIGTERM."};
  Flags flags;
  flags.options.state_dir = DefaultStateDir();
  AddServingFlags(app, flags);
  AddLimitFlags(app, flags);
  AddStateFlags(app, flags);
  app.set_version_flag("--version", std::string(chorus::kVersion));
  CLI11_PARSE(app, argc, argv);
  flags.options.recovery_grace = absl::Seconds(flags.recovery_grace_seconds);
  // NaN is refused as a negative grace (ValidateServerOptions).
  flags.options.agent_reconnect_grace = std::isnan(flags.agent_reconnect_grace_seconds)
                                            ? -absl::InfiniteDuration()
                                            : absl::Seconds(flags.agent_reconnect_grace_seconds);
  flags.options.checkpoint_data_hello_timeout = absl::Seconds(flags.data_hello_seconds);
  flags.options.checkpoint_data_io_timeout = absl::Seconds(flags.data_io_seconds);
  if (const std::string wrong = ParseStateFlags(flags); !wrong.empty()) {
    std::cerr << "chorus-coordinator: " << wrong << "\n";
    return 1;
  }
  if (const std::string wrong = CheckFlags(flags); !wrong.empty()) {
    std::cerr << "chorus-coordinator: " << wrong << "\n";
    return 1;
  }
  if (!flags.scheduling_policy.empty()) {
    absl::StatusOr<chorus::SchedulingPolicy> policy =
        chorus::LoadSchedulingPolicy(flags.scheduling_policy);
    if (!policy.ok()) {
      std::cerr << "chorus-coordinator: " << policy.status().message() << "\n";
      return 1;
    }
    flags.options.scheduling_policy = *std::move(policy);
  }
  if (flags.check_flags) {
    std::cout << "chorus-coordinator: flags are sound\n";
    return 0;
  }
  return Serve(argv[0], flags);
}
