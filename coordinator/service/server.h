// CoordinatorServer: the coordinator's gRPC server and what it owns.
//
// It serves the standard gRPC health service (grpc.health.v1.Health),
// chorus.v1.AgentService and RankService.Join (placement and rendezvous),
// chorus.v1.StoreService (rendezvous key-value store) and chorus.v1.JobService
// (jobs persisted in SQLite under the state directory), and holds an
// exclusive lock on its state directory so two coordinators can never share
// one. The other chorus.v1 services attach here as they are built.
//
// Thread-safety: Start() returns a running server; Shutdown() and Wait() may
// be called from any thread, Shutdown() more than once.
//
// Example:
//   ServerOptions options;
//   options.listen = "127.0.0.1:0";
//   options.state_dir = "/tmp/chorus-state";
//   ASSIGN_OR_RETURN(auto server, CoordinatorServer::Start(options));
//   LOG(INFO) << "port " << server->port();
//   server->Shutdown(absl::Seconds(5));
#ifndef CHORUS_COORDINATOR_SERVICE_SERVER_H_
#define CHORUS_COORDINATOR_SERVICE_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/host_port.h"
#include "coordinator/scheduling/scheduling_policy.h"
#include "coordinator/state/leadership.h"

namespace grpc {
class Server;
class ServerCredentials;
}  // namespace grpc

namespace chorus {

class AgentServiceImpl;
class CheckpointDataServer;
class CheckpointServiceImpl;
class CheckpointStore;
class CheckpointUploads;
class CoordinatorMetrics;
class HttpServer;
class TokenAuthorizer;
class HealthService;
class JobManager;
class RankServiceImpl;
class Scheduler;
class JobServiceImpl;
class KeyValueStore;
class StateDirLock;
class StateStore;
class StoreServiceImpl;

// Largest gRPC message the coordinator sends or accepts (store values are
// limited to 16 MB; checkpoint chunks are far smaller).
inline constexpr int kMaxMessageBytes = 32 << 20;
// Largest --store_max_value_bytes: a value with its key and namespace must
// fit in one message.
inline constexpr int64_t kMaxValueLimit = kMaxMessageBytes - (1 << 20);
// gRPC connection upkeep (Note [Idle and dead connections] in server.cc).
inline constexpr absl::Duration kMaxConnectionIdle = absl::Minutes(10);
// A node agent cut off from the coordinator keeps its ranks for its
// reconnect window (60 s) and then stops them, so the coordinator must
// notice the silent connection and give the agent its reconnect grace well
// within that: 10 + 10 s, then --agent_reconnect_grace_seconds (10).
inline constexpr absl::Duration kKeepaliveTime = absl::Seconds(10);
inline constexpr absl::Duration kKeepaliveTimeout = absl::Seconds(10);
inline constexpr absl::Duration kHandshakeTimeout = absl::Seconds(20);

struct ServerOptions {
  // host:port; port 0 picks a free port. A non-loopback host needs
  // token_file (docs/coordinator.md: secure by default).
  std::string listen = "127.0.0.1:29650";
  // Created if missing; must be writable; locked for this process's lifetime.
  std::string state_dir;
  // Where checkpoint payloads are kept (CheckpointStore's root); empty =
  // state_dir/checkpoints. With the state in etcd it must be storage every
  // coordinator mounts at this same path (docs/ha.md).
  std::string checkpoint_dir;
  // Opens the durable state; null = SQLite in state_dir (StateStore::Open).
  // With --state etcd://, a coordinator that has won the leadership passes
  // EtcdCoordinatorState::OpenState (coordinator/etcd/etcd_coordinator_state.h).
  std::function<absl::StatusOr<std::unique_ptr<StateStore>>()> open_state;
  // "ROLE TOKEN" lines (common/auth.h); empty = no authentication.
  std::string token_file;
  // PEM server certificate and key: serve TLS instead of plaintext.
  std::string tls_cert;
  std::string tls_key;
  // PEM CA bundle: require client certificates it signed (mTLS).
  std::string tls_client_ca;
  // The checkpoint data port (raw TCP beside gRPC for checkpoint uploads,
  // coordinator/checkpoint/checkpoint_data_server.h) on --listen's host: 0 = any free
  // port, -1 = none (ranks upload over gRPC). Never with TLS: the data port
  // is plaintext, so a TLS coordinator takes uploads over gRPC only.
  int checkpoint_data_port = 0;
  // Serve gRPC server reflection (service and message descriptors).
  bool enable_reflection = false;
  // After a restart, how long jobs that were running wait for their ranks to
  // come back with their agents before they are failed.
  absl::Duration recovery_grace = absl::Seconds(30);
  // How long a running job that is not elastic waits for the ranks of an
  // agent whose stream ended to come back with it before it fails; zero:
  // it fails at once (Note [Agent reconnect grace] in running_job.h).
  absl::Duration agent_reconnect_grace = absl::Seconds(10);

  // Limits (docs/reliability.md); each default is the named constant's.
  // Jobs waiting PENDING at once (JobManager::kDefaultMaxPendingJobs).
  int max_pending_jobs = 5000;
  // The administrator's scheduling limits (--scheduling_policy;
  // docs/scheduling.md); default: none.
  SchedulingPolicy scheduling_policy;
  // A running job with more ranks gets summary series on /metrics, not one
  // per rank (CoordinatorMetrics::kDefaultMaxRankSeries).
  int metrics_max_rank_series = 1024;
  // Users with series of their own on /metrics; the rest are summed
  // (CoordinatorMetrics::kDefaultMaxUserSeries).
  int metrics_max_user_series = 100;
  // Failed jobs whose reason is a series on /metrics
  // (CoordinatorMetrics::kDefaultMaxFailedSeries).
  int metrics_max_failed_series = 20;
  // Per-job store quotas (KeyValueStore::Limits).
  int64_t store_max_keys_per_job = 100000;
  int64_t store_max_bytes_per_job = int64_t{256} << 20;
  int64_t store_max_value_bytes = 16 << 20;
  // Largest checkpoint the data port takes
  // (CheckpointDataServer::kDefaultMaxUploadBytes).
  int64_t checkpoint_max_upload_bytes = int64_t{64} << 30;
  // How long the data port waits for a new connection's hello, and for each
  // send or receive of a running upload.
  absl::Duration checkpoint_data_hello_timeout = absl::Seconds(10);
  absl::Duration checkpoint_data_io_timeout = absl::Minutes(1);
  // The HTTP port (/metrics, the status page; docs/observability.md):
  // HOST:PORT, "off" for none, or empty for the default: 127.0.0.1 on the
  // port after --listen's (29651 beside the default 29650; a free port when
  // --listen's port is 0, or when that one is taken: the default never
  // stops the coordinator from starting). A non-loopback host needs
  // token_file: every
  // request must then carry an admin token ("Authorization: Bearer").
  std::string http_listen;
  // How long a new gRPC connection may take to set up TLS and start HTTP/2
  // (a peer that connects and sends nothing is closed after it).
  absl::Duration grpc_handshake_timeout = kHandshakeTimeout;
  // Appended to /metrics (Prometheus text): figures of the process around
  // the server, such as its leadership (coordinator/service/coordinator_process.h).
  std::function<std::string()> extra_metrics;
  // Whose election this server runs under (JobService.GetLeader reports
  // its id and since); null: a coordinator alone, leading since it started.
  const Leadership* leadership = nullptr;
};

// Checks every option that needs no file or socket: addresses, ports that
// would collide (the checkpoint data port on --listen's or the HTTP port),
// limits, TLS flags that go together. INVALID_ARGUMENT naming the flag.
// Start() calls it before it touches the state directory.
absl::Status ValidateServerOptions(const ServerOptions& options);

// options.checkpoint_dir, or state_dir/checkpoints when it is empty.
std::string CheckpointDir(const ServerOptions& options);

// Raises this process's soft limit on open files to its hard limit (each
// client connection, on the gRPC port or the data port, holds a descriptor)
// and returns the limit now in force. INTERNAL if it cannot be read.
absl::StatusOr<uint64_t> RaiseOpenFileLimit();

// True for 127.0.0.0/8, ::1 and localhost.
bool IsLoopbackHost(const std::string& host);

// What a server on `options`' ports needs, every option checked and every
// file it names read (tokens, TLS certificates) before any state is touched.
struct ListenPlan {
  ListenPlan();
  ListenPlan(ListenPlan&&);
  ~ListenPlan();
  std::unique_ptr<TokenAuthorizer> auth;
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::optional<HostPort> http_address;  // nullopt: no HTTP port
};
absl::StatusOr<ListenPlan> PlanListening(const ServerOptions& options);

class CoordinatorServer {
 public:
  // Validates `options`, locks the state directory and starts listening.
  // INVALID_ARGUMENT for a bad address, FAILED_PRECONDITION for an unusable
  // or locked state directory, UNAVAILABLE if the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const ServerOptions& options);

  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;
  // Shuts down (if not yet) and releases the state directory.
  ~CoordinatorServer();

  // The port actually bound (differs from the option when it was 0).
  int port() const { return port_; }
  // host:port clients should dial.
  const std::string& address() const { return address_; }
  // The checkpoint data port; 0 when there is none.
  int checkpoint_data_port() const;
  // The HTTP port; 0 when there is none.
  int http_port() const;
  // http://HOST:PORT of the HTTP port; empty when there is none.
  const std::string& http_url() const { return http_url_; }

  // Stops accepting calls; in-flight calls get until `grace` to finish and are
  // then cancelled.
  void Shutdown(absl::Duration grace);
  // Blocks until the server has shut down.
  void Wait();

 private:
  // Start builds it in steps; each fills the members it names.
  CoordinatorServer() = default;
  // Locks the state directory, opens the state database and the jobs, and
  // recovers the checkpoint store (lock_, state_, jobs_, checkpoints_).
  absl::Status OpenState(const ServerOptions& options);
  // The scheduler (taking back the jobs that were running), the services
  // and the checkpoint data port.
  absl::Status BuildServices(const ServerOptions& options);
  // Starts the gRPC server (server_, port_, address_).
  absl::Status Serve(const ServerOptions& options,
                     std::shared_ptr<grpc::ServerCredentials> credentials);
  // Starts the HTTP port at `http_address` (none if nullopt).
  absl::Status ServeHttp(const ServerOptions& options, const std::optional<HostPort>& http_address);

  // Released last: the state directory is ours until everything using it is gone.
  std::unique_ptr<StateDirLock> lock_;
  // Outlives the scheduler and the gRPC server, which count into it.
  std::unique_ptr<CoordinatorMetrics> metrics_;
  // Services are declared before server_ so that they outlive it.
  std::unique_ptr<TokenAuthorizer> auth_;
  std::unique_ptr<StateStore> state_;
  std::unique_ptr<CheckpointStore> checkpoints_;
  std::unique_ptr<CheckpointUploads> checkpoint_uploads_;
  std::unique_ptr<CheckpointServiceImpl> checkpoint_service_;
  std::unique_ptr<CheckpointDataServer> checkpoint_data_;  // null without a data port
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<AgentServiceImpl> agent_service_;
  std::unique_ptr<RankServiceImpl> rank_service_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<KeyValueStore> kv_;
  std::unique_ptr<StoreServiceImpl> store_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  // Declared after what its handlers read, so it stops first.
  std::unique_ptr<HttpServer> http_;
  std::string http_url_;

  // JobService.GetLeader answers with this server (and `leadership`'s id
  // and since, when there is one).
  void ReportLeader(const Leadership* leadership);

  // Expires rendezvous joins past their deadline; stopped in the destructor.
  void StartTicker();
  // Forgets the store keys of jobs that have ended (or that this
  // coordinator never had), so the store holds live jobs' keys only.
  void DropKeysOfEndedJobs();
  absl::Mutex ticker_mu_;
  bool ticker_stop_ ABSL_GUARDED_BY(ticker_mu_) = false;
  std::thread ticker_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SERVICE_SERVER_H_
