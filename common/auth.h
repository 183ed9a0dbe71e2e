// Who may call the coordinator: bearer tokens with roles and user names,
// and the client side that presents a token (and TLS credentials) on every
// call.
//
// Roles (Note [Roles and owners]): `admin` may call everything, for every
// job; `user` may submit jobs and watch, cancel, read the logs and
// checkpoints of the jobs it submitted (and list every job, others' without
// their details); `agent` (old name `worker`) may call only what node agents
// need (AgentService, RankService, StoreService, CheckpointService uploads).
// A job's credential (`job` role, Note [Job credentials] in
// common/job_credentials.h) is what a job's rank processes hold: it may call
// only RankService, StoreService and CheckpointService, and only for its own
// job. The health service is open.
//
// Server side: a TokenAuthorizer built from the coordinator's --token_file,
// whose lines are "ROLE TOKEN [USER] [unix=ACCOUNT]" (ROLE = admin | user |
// agent | worker; USER is required for `user` and defaults to the role's
// word otherwise; ACCOUNT, on user and admin lines, is the Unix account the
// user's jobs run as on the agents; '#' starts a comment), and which accepts the credentials of a
// JobCredentials secret once given one. Without a token file every call is
// allowed (an anonymous admin), which the coordinator permits only on
// loopback addresses.
//
// Client side: ConfigureClient sets, once per process, the token and TLS
// files that MakeCoordinatorChannel (common/grpc_util.h) uses for every
// channel it makes. A client token file holds the token alone (or one
// "ROLE TOKEN [USER]" line). Tokens are never logged or put in error
// messages. Token files readable by others are refused (Note [Private files]
// in common/private_files.h).
//
// Thread-safety: TokenAuthorizer is immutable after construction (and
// AcceptJobCredentials, called before serving); Caller is a value; call
// ConfigureClient before making channels.
//
// Example:
//   ASSIGN_OR_RETURN(TokenAuthorizer auth, TokenAuthorizer::FromFile("/etc/chorus/tokens"));
//   ASSIGN_OR_RETURN(Caller caller, auth.Identify(context->client_metadata()));
//   RETURN_IF_ERROR(caller.CheckRole(Role::kUser));
//   RETURN_IF_ERROR(caller.CheckOwner(job.job_id(), job.owner(), "cancel"));
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

// An admin may do everything; the other roles each have their own calls.
enum class Role {
  kJob = 0,
  kAgent = 1,
  kWorker = kAgent,  // the old name of kAgent
  kUser = 2,
  kAdmin = 3,
};

// "admin", "user", "agent" or "job".
const char* RoleName(Role role);

// Note [Roles and owners]
// A job belongs to the user who submitted it (Job.owner, the USER of the
// token file line of the submit's token; empty without a token file). What
// a call may do with a job follows from the caller's role and that owner:
//   admin  every job, every call (and the agent services);
//   user   submit; list every job, but others' only as the list view
//          (JobListView: id, owner, state, ranks, times; no spec but its
//          name and resources, no reason, metrics, logs or checkpoints);
//          everything else (get, status, watch, cancel, checkpoint now,
//          logs, checkpoints, resume from) only for its own jobs;
//   agent  no JobService call: agent tokens are for node agents;
//   job    only its own job's rank calls (Caller::CheckJob).
// Several tokens may name the same user (one per machine, or while one is
// being replaced): they are one owner. Errors name the job, its owner and
// who may do what was asked, never a token.

// Who a call comes from, once its token has been checked.
class Caller {
 public:
  // A caller with `role`'s rights, named `user` (the owner of the jobs it
  // submits). Without a token file, every caller is an anonymous admin.
  static Caller WithRole(Role role, std::string user = "") {
    return Caller(role, std::move(user), "");
  }
  // A rank process of job `job_id`, holding that job's credential.
  static Caller OfJob(std::string job_id) { return Caller(Role::kJob, "", std::move(job_id)); }

  Role role() const { return role_; }
  // The token file's user name; empty for a job's credential and on a
  // coordinator without a token file.
  const std::string& user() const { return user_; }
  // The job of a kJob caller.
  // REQUIRES: role() == Role::kJob.
  const std::string& job_id() const;

  // OK for an admin and for a caller of role `needed`; PERMISSION_DENIED
  // saying which token the call needs (and, for a job's credential, naming
  // the job) otherwise.
  absl::Status CheckRole(Role needed) const;
  // OK if the caller may `action` (e.g. "join", "write the key-value store")
  // for job `job_id` as its ranks and agents do: an agent or admin for any
  // job, a job's credential for its own. PERMISSION_DENIED naming both jobs
  // (or the user token's role) otherwise.
  absl::Status CheckJob(absl::string_view job_id, absl::string_view action) const;
  // OK if the caller may `action` (e.g. "cancel", "read the logs of") job
  // `job_id` owned by `owner` (Note [Roles and owners]): an admin always, a
  // user its own jobs, a job's credential its own job. PERMISSION_DENIED
  // such as "job-000004 belongs to alice; only alice or an admin may cancel
  // it" otherwise.
  absl::Status CheckOwner(absl::string_view job_id, absl::string_view owner,
                          absl::string_view action) const;

 private:
  Caller(Role role, std::string user, std::string job_id)
      : role_(role), user_(std::move(user)), job_id_(std::move(job_id)) {}

  Role role_;
  std::string user_;
  std::string job_id_;  // set for Role::kJob only
};

class TokenAuthorizer {
 public:
  // Lets every call through (no token file).
  TokenAuthorizer() = default;
  // INVALID_ARGUMENT naming the file and line for a malformed file (a bad
  // role, a missing or unsafe user name, a short or repeated token; the
  // line's text is not echoed: it may hold a token); NOT_FOUND if
  // unreadable.
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

  // Who the call's "authorization: Bearer TOKEN" says it is (an anonymous
  // admin, when there are no tokens); UNAUTHENTICATED if there is no token or it is
  // unknown.
  absl::StatusOr<Caller> Identify(const Metadata& metadata) const;
  // The same for a protocol other than gRPC (the coordinator's HTTP port):
  // `authorization` is the header's value, nullopt when the request has none.
  absl::StatusOr<Caller> IdentifyAuthorization(
      std::optional<absl::string_view> authorization) const;

  // The Unix account `user`'s jobs run as on the agents (`unix=` on the
  // user's lines; Note [Rank accounts] in worker/agent/rank_accounts.h);
  // empty when the file maps none.
  std::string UnixAccountOf(const std::string& user) const;
  bool maps_unix_accounts() const { return !unix_accounts_.empty(); }

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
  struct Identity {
    Role role;
    std::string user;
  };
  // Records FromText's unix=ACCOUNT for `user` (INVALID_ARGUMENT naming
  // `where` for a bad name, an agent line or a second account).
  absl::Status MapUnixAccount(Role role, const std::string& user, const std::string& account,
                              const std::string& where);

  std::map<std::string, Identity> tokens_;
  std::map<std::string, std::string> unix_accounts_;  // user -> Unix account
  std::optional<JobCredentials> job_credentials_;
};

// A fresh random token for a token file: 64 hex digits from the kernel's
// random source. FAILED_PRECONDITION if it cannot be drawn.
absl::StatusOr<std::string> NewToken();
// `name` made a valid token file user name: characters outside letters,
// digits, '.', '_' and '-' become '_', at most 64; `fallback` if empty.
std::string SafeUserName(absl::string_view name, absl::string_view fallback);

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
