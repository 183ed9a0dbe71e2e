// Who may call the coordinator: bearer tokens with roles, and the client side
// that presents a token (and TLS credentials) on every call.
//
// Roles: `admin` may call everything (submit, cancel, status, logs, and the
// worker services); `worker` may call only what agents and ranks need
// (AgentService, RankService, StoreService). The health service is open.
//
// Server side: a TokenAuthorizer built from the coordinator's --token_file,
// whose lines are "ROLE TOKEN" (ROLE = admin | worker; '#' starts a comment).
// Without a token file every call is allowed, which the coordinator permits
// only on loopback addresses.
//
// Client side: ConfigureClient sets, once per process, the token and TLS
// files that MakeCoordinatorChannel (common/grpc_util.h) uses for every
// channel it makes. A client token file holds the token alone (or one
// "ROLE TOKEN" line). Tokens are never logged or put in error messages.
//
// Thread-safety: TokenAuthorizer is immutable after construction; call
// ConfigureClient before making channels.
//
// Example:
//   ASSIGN_OR_RETURN(TokenAuthorizer auth, TokenAuthorizer::FromFile("/etc/chorus/tokens"));
//   RETURN_IF_ERROR(auth.Check(context->client_metadata(), Role::kAdmin));
#ifndef CHORUS_COMMON_AUTH_H_
#define CHORUS_COMMON_AUTH_H_

#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/string_ref.h"

namespace chorus {

enum class Role { kWorker = 1, kAdmin = 2 };

class TokenAuthorizer {
 public:
  // Lets every call through (no token file).
  TokenAuthorizer() = default;
  // INVALID_ARGUMENT naming the file and line for a malformed file (the line's
  // text is not echoed: it may hold a token); NOT_FOUND if unreadable.
  static absl::StatusOr<TokenAuthorizer> FromFile(const std::string& path);
  static absl::StatusOr<TokenAuthorizer> FromText(absl::string_view text,
                                                  const std::string& source);

  bool enabled() const { return !tokens_.empty(); }

  // OK if the call's "authorization: Bearer TOKEN" names a token whose role
  // covers `needed`; UNAUTHENTICATED if there is none or it is unknown;
  // PERMISSION_DENIED if its role is too weak.
  absl::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                     Role needed) const;
  // The same check for a protocol other than gRPC (the coordinator's HTTP
  // port): `authorization` is the header's value, nullopt when the request
  // has none.
  absl::Status CheckAuthorization(std::optional<absl::string_view> authorization,
                                  Role needed) const;

 private:
  std::map<std::string, Role> tokens_;
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
// flag (or variable) and the file; a client certificate needs its key and a
// CA.
absl::StatusOr<ClientSecurity> LoadClientSecurity(const std::string& token_file,
                                                  const std::string& tls_ca,
                                                  const std::string& tls_cert,
                                                  const std::string& tls_key);
// Sets the process-wide client security used by MakeCoordinatorChannel.
void ConfigureClient(ClientSecurity security);
const ClientSecurity& ClientSecurityConfig();

}  // namespace chorus

#endif  // CHORUS_COMMON_AUTH_H_
