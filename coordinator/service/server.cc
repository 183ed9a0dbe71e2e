#include "coordinator/service/server.h"

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/auth.h"
#include "common/env_names.h"
#include "common/grpc_util.h"
#include "common/host_port.h"
#include "common/job_credentials.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "coordinator/checkpoint/checkpoint_data_server.h"
#include "coordinator/checkpoint/checkpoint_store.h"
#include "coordinator/checkpoint/checkpoint_uploads.h"
#include "coordinator/http/coordinator_metrics.h"
#include "coordinator/http/http_server.h"
#include "coordinator/http/status_routes.h"
#include "coordinator/scheduling/scheduler.h"
#include "coordinator/service/agent_service.h"
#include "coordinator/service/checkpoint_service.h"
#include "coordinator/service/health_service.h"
#include "coordinator/service/job_service.h"
#include "coordinator/service/rpc_metrics.h"
#include "coordinator/service/store_service.h"
#include "coordinator/state/job_manager.h"
#include "coordinator/state/key_value_store.h"
#include "coordinator/state/state_dir_lock.h"
#include "coordinator/state/state_store.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/server_credentials.h"

namespace chorus {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot read it"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (buffer.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": not a PEM file"));
  }
  return buffer.str();
}

// Plaintext, TLS (--tls_cert/--tls_key) or mTLS (plus --tls_client_ca).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const ServerOptions& options) {
  if (options.agent_reconnect_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--agent_reconnect_grace_seconds must be >= 0 (0: a job fails as soon as an agent it "
        "runs on loses contact), got ",
        absl::ToDoubleSeconds(options.agent_reconnect_grace)));
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (options.tls_cert.empty()) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions tls;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(options.tls_cert, "--tls_cert"));
  ASSIGN_OR_RETURN(pair.private_key, ReadPem(options.tls_key, "--tls_key"));
  tls.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca.empty()) {
    ASSIGN_OR_RETURN(tls.pem_root_certs, ReadPem(options.tls_client_ca, "--tls_client_ca"));
    tls.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(tls);
}

// Where the HTTP port listens (ServerOptions::http_listen); nullopt for
// "off". `grpc_port` is the port --listen asked for.
absl::StatusOr<std::optional<HostPort>> HttpAddress(const std::string& http_listen, int grpc_port) {
  if (http_listen == "off") return std::optional<HostPort>();
  if (http_listen.empty()) {
    HostPort defaults;
    defaults.host = "127.0.0.1";
    defaults.port = grpc_port == 0 ? 0 : grpc_port + 1;
    if (defaults.port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("--listen port ", grpc_port,
                       ": the default --http_listen port (the next one) would be past 65535; "
                       "pass --http_listen HOST:PORT or --http_listen off"));
    }
    return std::optional<HostPort>(defaults);
  }
  absl::StatusOr<HostPort> parsed = ParseHostPort(http_listen);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--http_listen: ", parsed.status().message(),
                                                   " (or \"off\" for no HTTP port)"));
  }
  return std::optional<HostPort>(*parsed);
}

}  // namespace

absl::StatusOr<uint64_t> RaiseOpenFileLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot read the open-file limit: ", std::strerror(errno)));
  }
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) return raised.rlim_cur;
    LOG(WARNING) << "cannot raise the open-file limit from " << limit.rlim_cur << " to "
                 << limit.rlim_max << ": " << std::strerror(errno);
  }
  return limit.rlim_cur;
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

std::string CheckpointDir(const ServerOptions& options) {
  return options.checkpoint_dir.empty() ? options.state_dir + "/checkpoints"
                                        : options.checkpoint_dir;
}

absl::Status ValidateServerOptions(const ServerOptions& options) {
  absl::StatusOr<HostPort> listen = ParseHostPort(options.listen);
  if (!listen.ok())
    return absl::InvalidArgumentError(absl::StrCat("--listen: ", listen.status().message()));
  ASSIGN_OR_RETURN(std::optional<HostPort> http, HttpAddress(options.http_listen, listen->port));
  const int data_port = options.checkpoint_data_port;
  if (data_port < -1 || data_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_data_port ", data_port, ": must be a port in [0, 65535], or -1 for none"));
  }
  // Port 0 asks for a free port, so only fixed ports can collide. The data
  // port binds --listen's host; the HTTP port may bind another, but a
  // wildcard or loopback address overlaps either way, so equal port numbers
  // are refused whatever the hosts.
  if (data_port > 0 && data_port == listen->port) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_data_port ", data_port, " is also --listen's port (",
                     options.listen, "); give the data port its own, e.g. ", data_port + 2));
  }
  if (data_port > 0 && http.has_value() && data_port == http->port) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_data_port ", data_port, " is also the HTTP port (",
        options.http_listen.empty() ? "--http_listen's default, the port after --listen's"
                                    : absl::StrCat("--http_listen ", options.http_listen),
        "); give the data port its own (the shipped configuration uses 29652), or pass "
        "--http_listen HOST:PORT"));
  }
  if (options.store_max_keys_per_job < 1 || options.store_max_bytes_per_job < 1 ||
      options.store_max_value_bytes < 1 || options.store_max_value_bytes > kMaxValueLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--store_max_keys_per_job, --store_max_bytes_per_job and --store_max_value_bytes must "
        "be positive, and --store_max_value_bytes at most ",
        kMaxValueLimit, " (gRPC messages are limited to ", kMaxMessageBytes, " bytes); got ",
        options.store_max_keys_per_job, ", ", options.store_max_bytes_per_job, ", ",
        options.store_max_value_bytes));
  }
  if (options.agent_reconnect_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--agent_reconnect_grace_seconds must be >= 0 (0: a job fails as soon as an agent it "
        "runs on loses contact), got ",
        absl::ToDoubleSeconds(options.agent_reconnect_grace)));
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (options.tls_cert.empty() && !options.tls_client_ca.empty()) {
    return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
  }
  return absl::OkStatus();
}

ListenPlan::ListenPlan() = default;
ListenPlan::ListenPlan(ListenPlan&&) = default;
ListenPlan::~ListenPlan() = default;

// Every option is checked, and every file it names read, before the state
// directory is touched: recovery removes files there.
absl::StatusOr<ListenPlan> PlanListening(const ServerOptions& options) {
  RETURN_IF_ERROR(ValidateServerOptions(options));
  const HostPort listen = *ParseHostPort(options.listen);
  ListenPlan prepared;
  prepared.auth = std::make_unique<TokenAuthorizer>();
  if (!options.token_file.empty()) {
    ASSIGN_OR_RETURN(TokenAuthorizer loaded, TokenAuthorizer::FromFile(options.token_file));
    *prepared.auth = std::move(loaded);
  }
  const bool tokens = prepared.auth->enabled();
  if (!IsLoopbackHost(listen.host) && !tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen ", options.listen,
        ": a coordinator reachable from other machines must check who calls it, or anyone on "
        "the network could run code on your workers. Pass --token_file FILE with lines "
        "\"admin TOKEN\" and \"worker TOKEN\" (and --tls_cert/--tls_key so tokens do not travel "
        "in the clear), or listen on 127.0.0.1"));
  }
  ASSIGN_OR_RETURN(prepared.http_address, HttpAddress(options.http_listen, listen.port));
  if (prepared.http_address.has_value() && !IsLoopbackHost(prepared.http_address->host) &&
      !tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_listen ", options.http_listen,
        ": metrics and job status reachable from other machines must be protected; pass "
        "--token_file FILE (requests then need \"Authorization: Bearer ADMIN_TOKEN\"), or "
        "listen on 127.0.0.1"));
  }
  ASSIGN_OR_RETURN(prepared.credentials, ServerCredentials(options));
  if (!IsLoopbackHost(listen.host) && options.tls_cert.empty()) {
    LOG(WARNING) << "--listen " << options.listen
                 << " without TLS: tokens and training data cross the network in plaintext";
  }
  if (options.enable_reflection) {
    // gRPC's reflection library registers itself for every server built
    // after it is loaded, so it is loaded only when asked for: linked in,
    // it would always be on.
    if (dlopen("libgrpc++_reflection.so", RTLD_NOW | RTLD_GLOBAL) == nullptr &&
        dlopen("libgrpc++_reflection.so.1.51", RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("--enable_reflection: cannot load gRPC's reflection library (", dlerror(),
                       "); install libgrpc++-dev or run without --enable_reflection"));
    }
  }
  return prepared;
}

namespace {

// Test aid: CHORUS_TEST_FAILPOINT=checkpoint:STAGE (mid_chunk, before_fsync,
// before_rename, before_manifest, after_manifest) ends the process there, as
// abruptly as kill -9, to check that commits are crash-consistent.
CheckpointStore::Failpoint CheckpointFailpointFromEnvironment() {
  const char* fp = std::getenv(kEnvTestFailpoint);
  if (fp == nullptr || !absl::StartsWith(fp, "checkpoint:")) return nullptr;
  const std::string stage = std::string(fp).substr(std::strlen("checkpoint:"));
  LOG(WARNING) << "test failpoint armed: the coordinator exits at checkpoint stage " << stage;
  return [stage](CheckpointStore::Stage at) {
    if (stage == CheckpointStore::StageName(at)) _exit(75);
  };
}

// The gRPC server's settings (Note [Idle and dead connections]).
void ConfigureGrpc(grpc::ServerBuilder& builder, const ServerOptions& options) {
  // gRPC sets SO_REUSEPORT by default, which would let a second coordinator
  // bind the same port and silently take half the calls.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // Note [Idle and dead connections]
  // Every service is on the callback API, so an open connection costs a
  // descriptor and some memory, never a thread, and idle ones cannot starve
  // real clients of threads. They are still reclaimed: a connection with no
  // call for kMaxConnectionIdle gets a GOAWAY (a client reconnects on its next
  // call, unnoticed), one whose peer stops answering HTTP/2 pings (a crashed
  // host, a cut network) is closed within kKeepaliveTime + kKeepaliveTimeout
  // (an agent's: its stream ends and its reconnect grace starts; with a
  // minute's keepalive an agent cut off for good stopped its ranks at the end
  // of its own reconnect window before the coordinator noticed), and a new
  // connection must finish its TLS handshake and start HTTP/2 within
  // options.grpc_handshake_timeout (kHandshakeTimeout; gRPC's default is 120
  // s), so a peer that connects and sends nothing is closed after it. Clients
  // watch the server the same way, much more often: every coordinator channel
  // pings after kCoordinatorKeepaliveTime (2 s) without reading, with or
  // without calls, so that a frozen leader is noticed in seconds (Note
  // [Noticing a frozen coordinator] in common/grpc_util.cc). gRPC's default
  // server policy would count each such ping a strike (more than one per 5
  // minutes while the server sends no data) and after two answer GOAWAY
  // "too_many_pings", closing the connection and its streams;
  // AcceptCoordinatorKeepalive accepts a ping every kCoordinatorKeepaliveTime /
  // 2 and sets no limit on strikes.
  AcceptCoordinatorKeepalive(builder);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(kMaxConnectionIdle)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(kKeepaliveTime)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(kKeepaliveTimeout)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(
      GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.grpc_handshake_timeout)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const ServerOptions& options) {
  ASSIGN_OR_RETURN(ListenPlan prepared, PlanListening(options));
  std::unique_ptr<CoordinatorServer> coordinator(new CoordinatorServer());
  coordinator->auth_ = std::move(prepared.auth);
  RETURN_IF_ERROR(coordinator->OpenState(options));
  RETURN_IF_ERROR(coordinator->BuildServices(options));
  RETURN_IF_ERROR(coordinator->Serve(options, prepared.credentials));
  RETURN_IF_ERROR(coordinator->ServeHttp(options, prepared.http_address));
  coordinator->ReportLeader(options.leadership);
  coordinator->health_->SetStatus("", grpc::health::v1::HealthCheckResponse::SERVING);
  // Note [Following the leader] in common/grpc_util.cc: the full server
  // runs only while this coordinator leads (coordinator/service/leader_loop.h).
  coordinator->health_->SetStatus(kLeaderHealthService,
                                  grpc::health::v1::HealthCheckResponse::SERVING);
  LOG(INFO) << "coordinator listening on " << coordinator->address_
            << (options.tls_cert.empty() ? "" : " (TLS")
            << (options.tls_client_ca.empty() ? "" : ", client certificates required")
            << (options.tls_cert.empty() ? "" : ")")
            << (coordinator->auth_->enabled() ? ", tokens required" : "") << ", state in "
            << coordinator->state_->path() << ", checkpoints in " << CheckpointDir(options)
            << (coordinator->checkpoint_data_ != nullptr
                    ? absl::StrCat(", checkpoint data port ", coordinator->checkpoint_data_->port())
                    : "")
            << (coordinator->http_ != nullptr
                    ? absl::StrCat(", HTTP (metrics, status page) on ",
                                   absl::StripPrefix(coordinator->http_url_, "http://"))
                    : "");
  coordinator->StartTicker();
  return coordinator;
}

absl::Status CoordinatorServer::OpenState(const ServerOptions& options) {
  ASSIGN_OR_RETURN(lock_, StateDirLock::Acquire(options.state_dir));
  ASSIGN_OR_RETURN(state_,
                   options.open_state ? options.open_state() : StateStore::Open(options.state_dir));
  if (auth_->enabled()) {
    // Note [Job credentials]: ranks get these instead of the worker token;
    // coordinators sharing a state share the secret (Note [Shared job
    // credentials] in coordinator/etcd/etcd_state_store.cc).
    ASSIGN_OR_RETURN(JobCredentials job_credentials,
                     state_->LoadJobCredentials(options.state_dir + "/job_credentials.key"));
    auth_->AcceptJobCredentials(std::move(job_credentials));
  }
  ASSIGN_OR_RETURN(jobs_, JobManager::Create(*state_, nullptr, options.max_pending_jobs));
  checkpoints_ = std::make_unique<CheckpointStore>(CheckpointDir(options), *state_,
                                                   CheckpointFailpointFromEnvironment());
  std::vector<CheckpointStore::SharedJob> shared_jobs;
  RETURN_IF_ERROR(state_->ForEachJob([&](v1::Job job) {
    if (job.spec().checkpoint().storage() == v1::CheckpointSpec::SHARED_DIR) {
      shared_jobs.push_back({SharedCheckpointRoot(job.spec().checkpoint()), job.job_id()});
    }
  }));
  return checkpoints_->Recover(shared_jobs);
}

absl::Status CoordinatorServer::BuildServices(const ServerOptions& options) {
  metrics_ = std::make_unique<CoordinatorMetrics>(options.metrics_max_rank_series,
                                                  options.metrics_max_user_series,
                                                  options.metrics_max_failed_series);
  SchedulerOptions scheduler_options;  // the address is set once the server has bound
  scheduler_options.metrics = metrics_.get();
  scheduler_options.scheduling_policy = options.scheduling_policy;
  scheduler_options.agent_reconnect_grace = options.agent_reconnect_grace;
  scheduler_options.resume_resolver = [store = checkpoints_.get()](
                                          const std::string& resume_from,
                                          std::vector<std::string>* skipped) {
    const size_t colon = resume_from.find(':');
    int64_t step = 0;
    if (colon != std::string::npos) (void)absl::SimpleAtoi(resume_from.substr(colon + 1), &step);
    return store->FindLoadable(resume_from.substr(0, colon), step, skipped);
  };
  scheduler_options.newest_committed =
      [store = checkpoints_.get()](
          const std::string& job_id,
          std::vector<std::string>*) -> absl::StatusOr<v1::CheckpointManifest> {
    ASSIGN_OR_RETURN(std::vector<v1::CheckpointManifest> committed, store->List(job_id));
    if (committed.empty()) return absl::NotFoundError("no committed checkpoint");
    return committed.back();  // by step
  };
  scheduler_ = std::make_unique<Scheduler>(*jobs_, nullptr, std::move(scheduler_options));
  // Jobs that were running when the coordinator stopped are taken back; their
  // agents reconnect with the ranks they kept running.
  ASSIGN_OR_RETURN(std::vector<v1::Job> running_jobs, jobs_->List({v1::Job::RUNNING}, 0));
  scheduler_->Recover(std::move(running_jobs), options.recovery_grace);
  job_service_ = std::make_unique<JobServiceImpl>(*jobs_, *scheduler_, *auth_, checkpoints_.get());
  checkpoint_uploads_ = std::make_unique<CheckpointUploads>(
      *checkpoints_,
      [scheduler = scheduler_.get()](const std::string& job_id, int64_t generation, int rank) {
        return scheduler->reads().GrantUpload(job_id, generation, rank);
      });
  checkpoint_service_ = std::make_unique<CheckpointServiceImpl>(
      *checkpoints_, *checkpoint_uploads_, *auth_,
      [jobs = jobs_.get()](const std::string& job_id) {
        absl::StatusOr<v1::Job> job = jobs->Get(job_id);
        return job.ok() ? job->resume_from() : std::string();
      },
      [jobs = jobs_.get()](const std::string& job_id) -> absl::StatusOr<std::string> {
        absl::StatusOr<v1::Job> job = jobs->Get(job_id);
        if (!job.ok()) return job.status();
        return job->owner();
      });
  if (options.checkpoint_data_port >= 0 && options.tls_cert.empty()) {
    CheckpointDataServer::Options data_options;
    data_options.hello_timeout = options.checkpoint_data_hello_timeout;
    data_options.io_timeout = options.checkpoint_data_io_timeout;
    data_options.max_upload_bytes = options.checkpoint_max_upload_bytes;
    ASSIGN_OR_RETURN(checkpoint_data_,
                     CheckpointDataServer::Start(ParseHostPort(options.listen)->host,
                                                 options.checkpoint_data_port, *checkpoint_uploads_,
                                                 data_options));
    checkpoint_uploads_->set_data_port(checkpoint_data_->port());
  } else if (options.checkpoint_data_port >= 0) {
    LOG(INFO)
        << "no checkpoint data port with TLS (it is plaintext): checkpoints are uploaded over gRPC";
  }
  agent_service_ = std::make_unique<AgentServiceImpl>(
      *scheduler_, *auth_,
      [jobs = jobs_.get()](const std::string& job_id) -> absl::StatusOr<std::string> {
        absl::StatusOr<v1::Job> job = jobs->Get(job_id);
        if (!job.ok()) return job.status();
        return job->owner();
      });
  rank_service_ = std::make_unique<RankServiceImpl>(*scheduler_, *auth_);
  health_ = std::make_unique<HealthService>();
  KeyValueStore::Limits store_limits;
  store_limits.max_keys_per_job = static_cast<size_t>(options.store_max_keys_per_job);
  store_limits.max_bytes_per_job = static_cast<size_t>(options.store_max_bytes_per_job);
  store_limits.max_value_bytes = static_cast<size_t>(options.store_max_value_bytes);
  kv_ = std::make_unique<KeyValueStore>(nullptr, store_limits);
  store_service_ = std::make_unique<StoreServiceImpl>(*kv_, *auth_);
  return absl::OkStatus();
}

absl::Status CoordinatorServer::Serve(const ServerOptions& options,
                                      std::shared_ptr<grpc::ServerCredentials> credentials) {
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(options.listen, std::move(credentials), &bound_port);
  ConfigureGrpc(builder, options);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<RpcMetricsFactory>(*metrics_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.RegisterService(health_.get());
  builder.RegisterService(store_service_.get());
  builder.RegisterService(job_service_.get());
  builder.RegisterService(agent_service_.get());
  builder.RegisterService(rank_service_.get());
  builder.RegisterService(checkpoint_service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || bound_port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "--listen ", options.listen, ": cannot listen (is the port in use by another process?)"));
  }
  port_ = bound_port;
  address_ = FormatHostPort(ParseHostPort(options.listen)->host, bound_port);
  scheduler_->set_coordinator_address(address_);
  return absl::OkStatus();
}

absl::Status CoordinatorServer::ServeHttp(const ServerOptions& options,
                                          const std::optional<HostPort>& http_address) {
  if (!http_address.has_value()) return absl::OkStatus();
  HttpServer::Options http_options;
  http_options.host = http_address->host;
  http_options.port = http_address->port;
  // With a token file every page needs an admin token, on loopback too: the
  // pages show every job's owner, progress and metrics.
  http_options.require_token = auth_->enabled() || !IsLoopbackHost(http_address->host);
  http_options.auth = auth_.get();
  const StatusSources sources{jobs_.get(), scheduler_.get(), metrics_.get(), checkpoints_.get(),
                              options.extra_metrics};
  absl::StatusOr<std::unique_ptr<HttpServer>> started =
      HttpServer::Start(http_options, StatusRoutes(sources));
  if (!started.ok() && absl::IsUnavailable(started.status()) && options.http_listen.empty() &&
      http_options.port != 0) {
    // Only the default was asked for: a coordinator restarted on its old
    // port must not fail because something took the next one meanwhile.
    LOG(WARNING) << "HTTP port " << http_options.port
                 << " (the default, after --listen's) is in use; serving HTTP on a free port";
    http_options.port = 0;
    started = HttpServer::Start(http_options, StatusRoutes(sources));
  }
  if (!started.ok()) return started.status();
  http_ = *std::move(started);
  http_url_ = absl::StrCat("http://", FormatHostPort(http_address->host, http_->port()));
  job_service_->set_status_page_base(http_url_);
  return absl::OkStatus();
}

void CoordinatorServer::ReportLeader(const Leadership* leadership) {
  const absl::Time started = absl::Now();
  job_service_->set_leader([this, leadership, started] {
    // This server runs only while its coordinator leads: it is the leader.
    const std::optional<LeaderInfo> info =
        leadership != nullptr ? leadership->Leader() : std::nullopt;
    v1::CoordinatorLeader leader;
    if (info.has_value()) leader.set_id(info->id);
    leader.set_address(address_);
    leader.set_http_url(http_url_);
    const absl::Time since =
        info.has_value() && info->since != absl::InfinitePast() ? info->since : started;
    leader.set_since_unix_us(absl::ToUnixMicros(since));
    return leader;
  });
}

void CoordinatorServer::StartTicker() {
  ticker_ = std::thread([this] {
    absl::MutexLock lock(&ticker_mu_);
    for (int64_t tick = 1; !ticker_stop_; ++tick) {
      ticker_mu_.AwaitWithTimeout(absl::Condition(&ticker_stop_), absl::Milliseconds(100));
      if (ticker_stop_) break;
      ticker_mu_.Unlock();
      scheduler_->Tick();
      if (tick % 100 == 0) DropKeysOfEndedJobs();  // every 10 s
      ticker_mu_.Lock();
    }
  });
}

void CoordinatorServer::DropKeysOfEndedJobs() {
  for (const std::string& job_id : kv_->Jobs()) {
    absl::StatusOr<v1::Job> job = jobs_->Get(job_id);
    if (!job.ok() || JobManager::IsTerminal(job->state())) kv_->DropJob(job_id);
  }
}

CoordinatorServer::~CoordinatorServer() {
  Shutdown(absl::ZeroDuration());
  Wait();
  {
    absl::MutexLock lock(&ticker_mu_);
    ticker_stop_ = true;
  }
  if (ticker_.joinable()) ticker_.join();
}

void CoordinatorServer::Shutdown(absl::Duration grace) {
  // Health first, so watchers learn NOT_SERVING and their streams end before
  // the server waits for in-flight calls.
  // Start may have failed part of the way: only what was built is shut down.
  if (health_ != nullptr) health_->Shutdown();
  if (http_ != nullptr) http_->Shutdown();
  // Note [A stopping coordinator keeps its agents] (agent_service.cc).
  if (agent_service_ != nullptr) agent_service_->Stop();
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  if (checkpoint_data_ != nullptr) checkpoint_data_->Shutdown();
}

int CoordinatorServer::http_port() const { return http_ != nullptr ? http_->port() : 0; }

int CoordinatorServer::checkpoint_data_port() const {
  return checkpoint_data_ != nullptr ? checkpoint_data_->port() : 0;
}

void CoordinatorServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace chorus
