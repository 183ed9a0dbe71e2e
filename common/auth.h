// Who may call the coordinator: bearer tokens with roles, and the client side
// that presents a token (and TLS credentials) on every call.
//
// Roles: `admin` may call everything (submit, cancel, status, logs, and the
// worker services); `worker` may call only what agents and ranks need
// (AgentService, RankService, StoreService, CheckpointService). A job's
// credential (`job` role, Note [Job credentials] in common/job_credentials.h)
// is what a job's rank processes hold: it may call only RankService,
// StoreService and CheckpointService, and only for its own job. The health
// service is open.
//
// Server side: a TokenAuthorizer built from the coordinator's --token_file,
// whose lines are "ROLE TOKEN" (ROLE = admin | worker; '#' starts a comment),
// and which accepts the credentials of a JobCredentials secret once given
// one. Without a token file every call is allowed, which the coordinator
// permits only on loopback addresses.
//
// Client side: ConfigureClient sets, once per process, the token and TLS
// files that MakeCoordinatorChannel (common/grpc_util.h) uses for every
// channel it makes. A client token file holds the token alone (or one
// "ROLE TOKEN" line). Tokens are never logged or put in error messages.
// Token files readable by others are refused (Note [Private files] in
// common/private_files.h).
//
// Thread-safety: TokenAuthorizer is immutable after construction (and
// AcceptJobCredentials, called before serving); Caller is a value; call
// ConfigureClient before making channels.
//
// Example:
//   ASSIGN_OR_RETURN(TokenAuthorizer auth, TokenAuthorizer::FromFile("/etc/chorus/tokens"));
//   RETURN_IF_ERROR(auth.Check(context->client_metadata(), Role::kAdmin));
//   RETURN_IF_ERROR(auth.CheckJob(context->client_metadata(), request.job_id(), "join"));
#ifndef CHORUS_COMMON_AUTH_H_
#define CHORUS_COMMON_AUTH_H_

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/job_credentials.h"
#include "grpcpp/support/string_ref.h"

namespace chorus {

// Each role may do what the ones below it may.
enum class Role { kJob = 0, kWorker = 1, kAdmin = 2 };

// Who a call comes from, once its token has been checked.
class Caller {
 public:
  // A caller with `role`'s rights over every job. Without a token file,
  // every caller is an admin.
  static Caller WithRole(Role role) { return Caller(role, ""); }
  // A rank process of job `job_id`, holding that job's credential.
  static Caller OfJob(std::string job_id) { return Caller(Role::kJob, std::move(job_id)); }

  Role role() const { return role_; }
  // The job of a kJob caller.
  // REQUIRES: role() == Role::kJob.
  const std::string& job_id() const;

  // OK if the role covers `needed`; PERMISSION_DENIED saying which token the
  // call needs (and, for a job's credential, naming the job) otherwise.
  absl::Status CheckRole(Role needed) const;
  // OK if the caller may `action` (e.g. "join", "write the key-value store")
  // for job `job_id`: a worker or admin for any job, a job's credential for
  // its own. PERMISSION_DENIED naming both jobs otherwise.
  absl::Status CheckJob(absl::string_view job_id, absl::string_view action) const;

 private:
  Caller(Role role, std::string job_id) : role_(role), job_id_(std::move(job_id)) {}

  Role role_;
  std::string job_id_;  // set for Role::kJob only
};

class TokenAuthorizer {
 public:
  // Lets every call through (no token file).
  TokenAuthorizer() = default;
  // INVALID_ARGUMENT naming the file and line for a malformed file (the line's
  // text is not echoed: it may hold a token); NOT_FOUND if unreadable.
  static absl::StatusOr<TokenAuthorizer> FromFile(const std::string& path);
  static absl::StatusOr<TokenAuthorizer> FromText(absl::string_view text,
                                                  const std::string& source);

  using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

  bool enabled() const { return !tokens_.empty(); }

  // From now on, also accepts the job credentials `credentials` makes (as
  // Role::kJob callers). Only meaningful when enabled(): without tokens
  // every call is allowed. REQUIRES: called before the first check.
  void AcceptJobCredentials(JobCredentials credentials);
  // The credentials accepted; null when none are.
  const JobCredentials* job_credentials() const {
    return job_credentials_ ? &*job_credentials_ : nullptr;
  }

  // Who the call's "authorization: Bearer TOKEN" says it is (an admin, when
  // there are no tokens); UNAUTHENTICATED if there is no token or it is
  // unknown.
  absl::StatusOr<Caller> Identify(const Metadata& metadata) const;
  // The same for a protocol other than gRPC (the coordinator's HTTP port):
  // `authorization` is the header's value, nullopt when the request has none.
  absl::StatusOr<Caller> IdentifyAuthorization(
      std::optional<absl::string_view> authorization) const;

  // OK if the call's token has a role that covers `needed`; UNAUTHENTICATED
  // if there is none or it is unknown; PERMISSION_DENIED if its role is too
  // weak (Caller::CheckRole).
  absl::Status Check(const Metadata& metadata, Role needed) const;
  absl::Status CheckAuthorization(std::optional<absl::string_view> authorization,
                                  Role needed) const;
  // OK if the call may `action` for job `job_id` (Caller::CheckJob).
  absl::Status CheckJob(const Metadata& metadata, absl::string_view job_id,
                        absl::string_view action) const;

 private:
  std::map<std::string, Role> tokens_;
  std::optional<JobCredentials> job_credentials_;
};

struct ClientSecurity {
  std::string token;         // sent as "authorization: Bearer TOKEN"; empty = none
  std::string tls_ca_pem;    // non-empty = TLS, verifying the server against it
  std::string tls_cert_pem;  // client certificate for mTLS (with tls_key_pem)
  std::string tls_key_pem;
};

// Reads the files named by the flags, falling back to the environment for
// what is unset: CHORUS_TOKEN (the token itself) or CHORUS_TOKEN_FILE,
// CHORUS_TLS_CA, CHORUS_TLS_CERT, CHORUS_TLS_KEY (paths). Errors name the
// flag (or variable) and the file; a token file readable by others is
// refused (FAILED_PRECONDITION with the chmod that fixes it); a client
// certificate needs its key and a CA.
absl::StatusOr<ClientSecurity> LoadClientSecurity(const std::string& token_file,
                                                  const std::string& tls_ca,
                                                  const std::string& tls_cert,
                                                  const std::string& tls_key);
// Sets the process-wide client security used by MakeCoordinatorChannel.
void ConfigureClient(ClientSecurity security);
const ClientSecurity& ClientSecurityConfig();

}  // namespace chorus

#endif  // CHORUS_COMMON_AUTH_H_
