#include "coordinator/etcd/etcd_client.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/backoff.h"
#include "common/host_port.h"
#include "common/paths.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

// Largest etcd response Chorus reads: a page of a range is bounded by
// `limit`, but a value may be up to etcd's request limit (1.5 MiB by
// default, configurable), so leave room.
constexpr int kMaxReceiveBytes = 64 << 20;

// Note [Noticing a frozen etcd member]
// A frozen etcd member (SIGSTOPped, its VM paused) keeps its connections
// up, as a frozen coordinator does (Note [Noticing a frozen coordinator] in
// common/grpc_util.cc): round_robin keeps it READY and sends it every N-th
// call, each of which then waits out its attempt's deadline (Note [Retried
// calls]). So the channel pings a member it has read nothing from for
// kEtcdKeepaliveTime and drops the connection when the ping is not
// answered within kEtcdKeepaliveTimeout; the member's subchannel leaves
// READY and calls go to the other members until it answers again. etcd
// (3.4 and later) takes fewer pings than a coordinator: only while a call
// is open (its server's enforcement policy has PermitWithoutStream false,
// and pings on an idle connection soon get GOAWAY "too_many_pings"), and
// at most one per --grpc-keepalive-min-time (5 s by default). So the
// channel pings only while a call is open, which on the connection to a
// frozen member is nearly always (its calls all wait), and at twice etcd's
// minimum interval.
constexpr absl::Duration kEtcdKeepaliveTime = absl::Seconds(10);
constexpr absl::Duration kEtcdKeepaliveTimeout = absl::Seconds(5);

absl::Status CheckEndpoints(const std::string& endpoints) {
  if (endpoints.empty()) {
    return absl::InvalidArgumentError("etcd endpoints: none given (want HOST:PORT[,HOST:PORT...])");
  }
  for (absl::string_view endpoint : absl::StrSplit(endpoints, ',')) {
    absl::StatusOr<HostPort> address = ParseHostPort(endpoint);
    if (!address.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoints \"", endpoints, "\": ", address.status().message()));
    }
    if (address->port == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoints \"", endpoints, "\": ", endpoint, " has port 0"));
    }
  }
  return absl::OkStatus();
}

// One gRPC target naming every member: "ipv4:A:P,B:P" (or ipv6:), so one
// channel balances over them all. Names are resolved once, here.
absl::StatusOr<std::string> ChannelTarget(const std::string& endpoints) {
  std::vector<std::string> v4, v6;
  for (absl::string_view endpoint : absl::StrSplit(endpoints, ',')) {
    ASSIGN_OR_RETURN(HostPort address, ParseHostPort(endpoint));
    in_addr a4;
    in6_addr a6;
    if (inet_pton(AF_INET, address.host.c_str(), &a4) == 1) {
      v4.push_back(FormatHostPort(address.host, address.port));
      continue;
    }
    if (inet_pton(AF_INET6, address.host.c_str(), &a6) == 1) {
      v6.push_back(FormatHostPort(address.host, address.port));
      continue;
    }
    addrinfo hints{};
    hints.ai_family = AF_INET;
    addrinfo* found = nullptr;
    if (getaddrinfo(address.host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("etcd endpoints \"", endpoints,
                                                     "\": cannot resolve ", address.host));
    }
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text,
              sizeof(text));
    freeaddrinfo(found);
    v4.push_back(FormatHostPort(text, address.port));
  }
  if (!v4.empty() && !v6.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd endpoints \"", endpoints, "\": mixes IPv4 and IPv6 members; use one family"));
  }
  return v4.empty() ? absl::StrCat("ipv6:", absl::StrJoin(v6, ","))
                    : absl::StrCat("ipv4:", absl::StrJoin(v4, ","));
}

absl::StatusOr<std::string> ReadOptionFile(const std::string& path, const char* flag) {
  std::optional<std::string> text = ReadSmallFile(path);
  if (!text.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, ": cannot read ", path, " (does it exist and is it readable?)"));
  }
  return *std::move(text);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(const EtcdOptions& options) {
  if (options.ca_file.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadOptionFile(options.ca_file, "--etcd_ca"));
  if (!options.cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadOptionFile(options.cert_file, "--etcd_cert"));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadOptionFile(options.key_file, "--etcd_key"));
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(end.back() + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

absl::Status ValidateEtcdOptions(const EtcdOptions& options) {
  RETURN_IF_ERROR(CheckEndpoints(options.endpoints));
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError("--etcd_cert and --etcd_key go together: give both or neither");
  }
  if (!options.cert_file.empty() && options.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--etcd_cert needs --etcd_ca (the CA that signed the etcd members' certificates)");
  }
  if (options.user.empty() != options.password_file.empty()) {
    return absl::InvalidArgumentError(
        "--etcd_user and --etcd_password_file go together: give both or neither");
  }
  if (options.call_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd call timeout must be > 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const EtcdOptions& options) {
  RETURN_IF_ERROR(ValidateEtcdOptions(options));
  ASSIGN_OR_RETURN(std::string target, ChannelTarget(options.endpoints));
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials, Credentials(options));
  std::string password;
  if (!options.password_file.empty()) {
    ASSIGN_OR_RETURN(password, ReadOptionFile(options.password_file, "--etcd_password_file"));
    password = std::string(absl::StripTrailingAsciiWhitespace(password));
  }
  grpc::ChannelArguments args;
  args.SetLoadBalancingPolicyName("round_robin");
  args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
  // Members that come back are noticed within a second, not after gRPC's
  // default reconnect backoff of up to two minutes.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  // Note [Noticing a frozen etcd member].
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kEtcdKeepaliveTime)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kEtcdKeepaliveTimeout)));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  std::unique_ptr<EtcdClient> client(new EtcdClient(
      options, grpc::CreateCustomChannel(target, credentials, args), std::move(password)));
  if (!options.user.empty()) {
    RETURN_IF_ERROR(client->Authenticate(absl::Now() + options.call_timeout));
  }
  return client;
}

EtcdClient::EtcdClient(EtcdOptions options, std::shared_ptr<grpc::Channel> channel,
                       std::string password)
    : options_(std::move(options)),
      name_(absl::StrCat("etcd at ", options_.endpoints)),
      password_(std::move(password)),
      channel_(std::move(channel)),
      kv_(etcdserverpb::KV::NewStub(channel_)),
      lease_(etcdserverpb::Lease::NewStub(channel_)),
      watch_(etcdserverpb::Watch::NewStub(channel_)),
      maintenance_(etcdserverpb::Maintenance::NewStub(channel_)),
      auth_(etcdserverpb::Auth::NewStub(channel_)) {}

// Note [etcd's own deadline]
// The client's deadline travels with each call, and a member that cannot commit
// a proposal before it (no quorum, a raft leader that died with the request)
// answers with the context's error as UNKNOWN "context deadline exceeded"
// rather than DEADLINE_EXCEEDED, often just before the client's own timer
// fires. It means the same thing: this attempt found no quorum in time, another
// member or a later attempt may.
bool IsEtcdUnavailable(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return true;
    case grpc::StatusCode::UNKNOWN:
      return absl::StrContains(status.error_message(), "context deadline exceeded");
    default:
      return false;
  }
}

absl::Status EtcdClient::ToStatus(const char* what, const grpc::Status& status) const {
  const std::string detail = absl::StrCat(name_, ": ", what, ": ");
  if (status.ok()) return absl::OkStatus();
  if (IsEtcdUnavailable(status)) {
    return absl::UnavailableError(
        absl::StrCat(detail, "unreachable or no quorum (", status.error_message(), ")"));
  }
  switch (status.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat(detail, status.error_message(),
                                       " (check --etcd_user/--etcd_password_file and the "
                                       "user's role on the prefix)"));
    default:
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat(detail, status.error_message()));
  }
}

absl::Status EtcdClient::Authenticate(absl::Time deadline) {
  etcdserverpb::AuthenticateRequest request;
  request.set_name(options_.user);
  request.set_password(password_);
  etcdserverpb::AuthenticateResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  context.set_wait_for_ready(true);
  RETURN_IF_ERROR(ToStatus("authenticate", auth_->Authenticate(&context, request, &response)));
  absl::MutexLock lock(&mu_);
  token_ = response.token();
  return absl::OkStatus();
}

// Note [Retried calls]
// A call that fails with UNAVAILABLE (the member it went to died, lost its
// quorum, or its raft leader changed) is sent again, to whichever member the
// channel picks next, until the call's deadline. Each attempt gets a third of
// the call's time (at least 0.5 s): a request a member forwarded to a raft
// leader that then died is dropped by etcd and would otherwise hang until
// etcd's own request timeout (5 s and more), while a new raft leader is elected
// within about one election timeout. That is safe because every write Chorus
// makes is idempotent: a put of a whole value, or a transaction whose compare
// makes a repeat either a no-op or a failure the caller checks
// (EtcdLeadership's campaign reads the key back and recognizes its own lease).
// An expired auth token is renewed once.
template <typename Call>
absl::Status EtcdClient::Run(const char* what, absl::Duration timeout, Call call) {
  const absl::Time deadline = absl::Now() + timeout;
  const absl::Duration attempt_timeout = std::max(timeout / 3, absl::Milliseconds(500));
  BackoffOptions delays;  // Note [Backoff] in common/backoff.cc
  delays.initial = absl::Milliseconds(50);
  delays.max = absl::Milliseconds(500);
  Backoff backoff(delays);
  bool renewed_token = false;
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + attempt_timeout)));
    context.set_wait_for_ready(true);
    {
      absl::MutexLock lock(&mu_);
      if (!token_.empty()) context.AddMetadata("token", token_);
    }
    const grpc::Status status = call(&context);
    if (status.ok()) return absl::OkStatus();
    const bool bad_token = status.error_code() == grpc::StatusCode::UNAUTHENTICATED &&
                           !options_.user.empty() && !renewed_token;
    if (bad_token) {
      renewed_token = true;
      RETURN_IF_ERROR(Authenticate(deadline));
      continue;
    }
    const absl::Duration delay = backoff.Next();
    if (!IsEtcdUnavailable(status) || absl::Now() + delay >= deadline) {
      return ToStatus(what, status);
    }
    absl::SleepFor(delay);
  }
}

absl::StatusOr<etcdserverpb::RangeResponse> EtcdClient::Range(
    const etcdserverpb::RangeRequest& request) {
  etcdserverpb::RangeResponse response;
  range_calls_.fetch_add(1);
  RETURN_IF_ERROR(Run("range", options_.call_timeout, [&](grpc::ClientContext* context) {
    return kv_->Range(context, request, &response);
  }));
  return response;
}

absl::StatusOr<etcdserverpb::PutResponse> EtcdClient::Put(const etcdserverpb::PutRequest& request) {
  etcdserverpb::PutResponse response;
  RETURN_IF_ERROR(Run("put", options_.call_timeout, [&](grpc::ClientContext* context) {
    return kv_->Put(context, request, &response);
  }));
  return response;
}

absl::StatusOr<etcdserverpb::DeleteRangeResponse> EtcdClient::DeleteRange(
    const etcdserverpb::DeleteRangeRequest& request) {
  etcdserverpb::DeleteRangeResponse response;
  RETURN_IF_ERROR(Run("delete", options_.call_timeout, [&](grpc::ClientContext* context) {
    return kv_->DeleteRange(context, request, &response);
  }));
  return response;
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(const etcdserverpb::TxnRequest& request) {
  etcdserverpb::TxnResponse response;
  RETURN_IF_ERROR(Run("transaction", options_.call_timeout, [&](grpc::ClientContext* context) {
    return kv_->Txn(context, request, &response);
  }));
  return response;
}

absl::StatusOr<etcdserverpb::LeaseGrantResponse> EtcdClient::LeaseGrant(absl::Duration ttl) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1))));
  etcdserverpb::LeaseGrantResponse response;
  RETURN_IF_ERROR(Run("lease grant", options_.call_timeout, [&](grpc::ClientContext* context) {
    return lease_->LeaseGrant(context, request, &response);
  }));
  if (!response.error().empty()) {
    return absl::UnavailableError(absl::StrCat(name_, ": lease grant: ", response.error()));
  }
  return response;
}

absl::Status EtcdClient::LeaseRevoke(int64_t lease_id) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease_id);
  etcdserverpb::LeaseRevokeResponse response;
  return Run("lease revoke", options_.call_timeout, [&](grpc::ClientContext* context) {
    return lease_->LeaseRevoke(context, request, &response);
  });
}

absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> EtcdClient::LeaseKeepAliveOnce(
    int64_t lease_id, absl::Duration timeout) {
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease_id);
  etcdserverpb::LeaseKeepAliveResponse response;
  RETURN_IF_ERROR(Run("lease keep-alive", timeout, [&](grpc::ClientContext* context) {
    auto stream = lease_->LeaseKeepAlive(context);
    if (!stream->Write(request)) return stream->Finish();
    if (!stream->Read(&response)) return stream->Finish();
    context->TryCancel();  // one answer is all we wait for
    (void)stream->Finish();
    return grpc::Status::OK;
  }));
  return response;
}

absl::StatusOr<etcdserverpb::StatusResponse> EtcdClient::MemberStatus() {
  etcdserverpb::StatusResponse response;
  RETURN_IF_ERROR(Run("status", options_.call_timeout, [&](grpc::ClientContext* context) {
    return maintenance_->Status(context, etcdserverpb::StatusRequest(), &response);
  }));
  return response;
}


bool EtcdWaitCanceller::Attach(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  context_ = context;
  return true;
}

void EtcdWaitCanceller::Detach() {
  absl::MutexLock lock(&mu_);
  context_ = nullptr;
}

void EtcdWaitCanceller::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

// Note [Watching the leader key]
// A coordinator that does not lead waits for the leader key's deletion on
// etcd's Watch stream, from the revision at which it last read the key, so no
// deletion in between is missed (EtcdLeadership::Campaign). Two ways a watch
// can stay silent although the key went are covered here: "hasleader" metadata
// makes a member that lost its raft leader (a partitioned minority, which would
// see no more events) cancel the watch at once, as etcd's own clientv3 asks
// with WithRequireLeader; and the channel's keepalive drops a frozen member's
// connection (Note [Noticing a frozen etcd member]). A watch that breaks anyway
// ends with UNAVAILABLE, and the caller reads the key again.
absl::Status EtcdClient::WaitForDeletion(const std::string& key, int64_t start_revision,
                                         absl::Time deadline, EtcdWaitCanceller* canceller) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  context.AddMetadata("hasleader", "true");
  {
    absl::MutexLock lock(&mu_);
    if (!token_.empty()) context.AddMetadata("token", token_);
  }
  if (canceller != nullptr && !canceller->Attach(&context)) {
    return absl::CancelledError("the wait for the leader key was cancelled");
  }
  std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>>
      stream = watch_->Watch(&context);
  etcdserverpb::WatchRequest request;
  etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
  create->set_key(key);
  create->set_start_revision(start_revision);
  create->add_filters(etcdserverpb::WatchCreateRequest::NOPUT);
  absl::Status result;
  bool deleted = false;
  etcdserverpb::WatchResponse response;
  if (stream->Write(request)) {
    while (!deleted && result.ok() && stream->Read(&response)) {
      if (response.canceled()) {
        result = absl::UnavailableError(
            absl::StrCat(name_, ": watch of ", key, " cancelled by etcd (", response.cancel_reason(),
                         response.compact_revision() > 0
                             ? absl::StrCat("; compacted to ", response.compact_revision())
                             : "",
                         ")"));
      }
      for (const etcdserverpb::Event& event : response.events()) {
        deleted = deleted || event.type() == etcdserverpb::Event::DELETE;
      }
    }
  }
  if (deleted || !result.ok()) context.TryCancel();  // ends the stream for Finish
  const grpc::Status finished = stream->Finish();
  if (canceller != nullptr) canceller->Detach();
  if (deleted) return absl::OkStatus();
  if (!result.ok()) return result;
  if (finished.error_code() == grpc::StatusCode::CANCELLED) {
    return absl::CancelledError("the wait for the leader key was cancelled");
  }
  if (finished.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || absl::Now() >= deadline) {
    return absl::DeadlineExceededError(absl::StrCat("no deletion of ", key, " by the deadline"));
  }
  return ToStatus("watch", finished.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                        "the watch stream ended")
                                         : finished);
}

}  // namespace chorus
