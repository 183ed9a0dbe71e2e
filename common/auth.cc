#include "common/auth.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/env_names.h"
#include "common/private_files.h"
#include "glog/logging.h"

namespace chorus {
namespace {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot read it"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Lines without comments and surrounding blanks, skipping empty ones.
std::vector<std::pair<int, std::string>> ContentLines(absl::string_view text) {
  std::vector<std::pair<int, std::string>> out;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = line.substr(0, line.find('#'));
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty()) out.emplace_back(number, std::string(line));
  }
  return out;
}

// Compares without stopping at the first difference, so the time taken does
// not tell how much of a guessed token was right.
bool SameToken(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

constexpr size_t kMaxUserNameLength = 64;

// User names appear in job records, listings and the status page: a small
// charset that needs no quoting anywhere.
bool IsSafeUserName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxUserNameLength || !absl::ascii_isalnum(name[0])) {
    return false;
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

constexpr size_t kMaxUnixNameLength = 32;

// What useradd accepts, less '$' (Samba machine accounts).
bool IsUnixAccountName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxUnixNameLength ||
      !(absl::ascii_isalpha(name[0]) || name[0] == '_')) {
    return false;
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

std::optional<Role> ParseTokenRole(absl::string_view word) {
  if (word == "admin") return Role::kAdmin;
  if (word == "user") return Role::kUser;
  if (word == "agent" || word == "worker") return Role::kAgent;
  return std::nullopt;
}

ClientSecurity& GlobalClientSecurity() {
  static ClientSecurity* security = new ClientSecurity();
  return *security;
}

std::string FromEnv(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

absl::StatusOr<TokenAuthorizer> TokenAuthorizer::FromText(absl::string_view text,
                                                          const std::string& source) {
  TokenAuthorizer auth;
  for (const auto& [number, line] : ContentLines(text)) {
    std::vector<std::string> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat(source, " line ", number);
    std::optional<std::string> unix_account;
    if (fields.size() >= 3 && absl::StartsWith(fields.back(), "unix=")) {
      unix_account = fields.back().substr(5);
      fields.pop_back();
    }
    std::optional<Role> role =
        fields.size() == 2 || fields.size() == 3 ? ParseTokenRole(fields[0]) : std::nullopt;
    if (!role.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where,
          ": expected \"ROLE TOKEN [USER] [unix=ACCOUNT]\" with ROLE admin, user or agent (e.g. "
          "\"user TOKEN alice unix=alice\"; the line is not shown: it may hold a token)"));
    }
    if (fields[1].size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tokens must be at least 16 characters (e.g. `openssl rand -hex 32`)"));
    }
    if (auth.tokens_.count(fields[1])) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the same token appears twice"));
    }
    if (fields.size() == 2 && *role == Role::kUser) {
      return absl::InvalidArgumentError(absl::StrCat(
          where,
          ": a user token needs the user's name: \"user TOKEN NAME\" (the owner of the "
          "jobs it submits)"));
    }
    // Old lines ("admin TOKEN", "worker TOKEN") name their role's word.
    std::string user = fields.size() == 3 ? fields[2] : fields[0];
    if (!IsSafeUserName(user)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the user name must be 1 to ", kMaxUserNameLength,
                       " letters, digits, '.', '_' or '-', starting with a letter or digit"));
    }
    if (unix_account.has_value()) {
      if (absl::Status s = auth.MapUnixAccount(*role, user, *unix_account, where); !s.ok()) {
        return s;
      }
    }
    auth.tokens_[fields[1]] = Identity{*role, std::move(user)};
  }
  if (auth.tokens_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     " has no tokens; add lines \"admin TOKEN NAME\", \"user TOKEN NAME\" and "
                     "\"agent TOKEN\""));
  }
  return auth;
}

// Note [Rank accounts] in worker/agent/rank_accounts.h: the account must be
// one the agents' passwd can look up, and one user runs as one account.
absl::Status TokenAuthorizer::MapUnixAccount(Role role, const std::string& user,
                                             const std::string& account, const std::string& where) {
  if (role == Role::kAgent) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": unix= belongs on user (or admin) lines: agent tokens submit no jobs"));
  }
  if (!IsUnixAccountName(account)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": unix=", account.empty() ? "(empty)" : account,
        " is not a Unix account name: 1 to ", kMaxUnixNameLength,
        " letters, digits, '_', '-' or '.', starting with a letter or '_' (e.g. unix=alice)"));
  }
  auto [it, added] = unix_accounts_.emplace(user, account);
  if (!added && it->second != account) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", user, " is mapped to Unix account ",
                                                   it->second, " on an earlier line and to ",
                                                   account, " here; one user runs as one account"));
  }
  return absl::OkStatus();
}

std::string TokenAuthorizer::UnixAccountOf(const std::string& user) const {
  auto it = unix_accounts_.find(user);
  return it == unix_accounts_.end() ? "" : it->second;
}

absl::StatusOr<TokenAuthorizer> TokenAuthorizer::FromFile(const std::string& path) {
  if (absl::Status s = CheckTokenFileIsPrivate(path, "--token_file"); !s.ok()) return s;
  absl::StatusOr<std::string> text = ReadWholeFile(path, "--token_file");
  if (!text.ok()) return text.status();
  return FromText(*text, absl::StrCat("--token_file ", path));
}

const std::string& Caller::job_id() const {
  CHECK(role_ == Role::kJob) << "Caller::job_id of a caller that is not a job's";
  return job_id_;
}

const char* RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kUser:
      return "user";
    case Role::kAgent:
      return "agent";
    case Role::kJob:
      return "job";
  }
  return "unknown";
}

absl::Status Caller::CheckRole(Role needed) const {
  if (role_ == Role::kAdmin || role_ == needed) return absl::OkStatus();
  const char* const needs = needed == Role::kAdmin  ? "an admin token"
                            : needed == Role::kUser ? "a user or admin token"
                                                    : "an agent or admin token";
  if (role_ == Role::kJob) {
    return absl::PermissionDeniedError(absl::StrCat(
        "this call needs ", needs, "; the token given is the credential of job ", job_id_,
        ", which may only make the calls of that job's ranks"));
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "this call needs ", needs, "; the token given is ", user_, "'s, with the ", RoleName(role_),
      " role", role_ == Role::kAgent ? " (agent tokens are for node agents only)" : ""));
}

absl::Status Caller::CheckJob(absl::string_view job_id, absl::string_view action) const {
  if (role_ == Role::kAdmin || role_ == Role::kAgent) return absl::OkStatus();
  if (role_ == Role::kUser) {
    return absl::PermissionDeniedError(
        absl::StrCat("a user token (", user_, "'s) may not ", action, " for job ", job_id,
                     ": that is for node agents and the job's ranks"));
  }
  if (job_id == job_id_) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("the credential of job ", job_id_, " may not ", action, " for job ", job_id,
                   ": a job's ranks may reach only their own job"));
}

absl::Status Caller::CheckOwner(absl::string_view job_id, absl::string_view owner,
                                absl::string_view action) const {
  switch (role_) {
    case Role::kAdmin:
      return absl::OkStatus();
    case Role::kUser:
      if (!owner.empty() && owner == user_) return absl::OkStatus();
      if (owner.empty()) {
        return absl::PermissionDeniedError(absl::StrCat(
            job_id,
            " has no owner (it was submitted while the coordinator had no token file); "
            "only an admin may ",
            action, " it"));
      }
      return absl::PermissionDeniedError(absl::StrCat(job_id, " belongs to ", owner, "; only ",
                                                      owner, " or an admin may ", action, " it"));
    case Role::kAgent:
      return absl::PermissionDeniedError(
          absl::StrCat("an agent token may not ", action, " ", job_id,
                       ": agent tokens are for node agents; use a user or admin token"));
    case Role::kJob:
      return CheckJob(job_id, action);
  }
  return absl::PermissionDeniedError("unknown role");
}

void TokenAuthorizer::AcceptJobCredentials(JobCredentials credentials) {
  job_credentials_.emplace(std::move(credentials));
}

absl::StatusOr<Caller> TokenAuthorizer::Identify(const Metadata& metadata) const {
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return IdentifyAuthorization(std::nullopt);
  return IdentifyAuthorization(absl::string_view(it->second.data(), it->second.size()));
}

absl::StatusOr<Caller> TokenAuthorizer::IdentifyAuthorization(
    std::optional<absl::string_view> authorization) const {
  if (tokens_.empty()) return Caller::WithRole(Role::kAdmin);
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(
        "this coordinator requires a token: pass --token_file (or set CHORUS_TOKEN)");
  }
  absl::string_view value = *authorization;
  if (!absl::ConsumePrefix(&value, "Bearer ")) {
    return absl::UnauthenticatedError("the authorization header must be \"Bearer TOKEN\"");
  }
  for (const auto& [token, identity] : tokens_) {
    if (SameToken(token, value)) return Caller::WithRole(identity.role, identity.user);
  }
  if (JobCredentials::LooksLikeOne(value)) {
    std::optional<std::string> job =
        job_credentials_ ? job_credentials_->JobOf(value) : std::nullopt;
    if (job.has_value()) return Caller::OfJob(*std::move(job));
    return absl::UnauthenticatedError(
        "the job credential is not valid for this coordinator (another coordinator made it, "
        "or its secret under --state_dir was replaced)");
  }
  return absl::UnauthenticatedError("the token is not valid for this coordinator");
}

absl::Status TokenAuthorizer::Check(const Metadata& metadata, Role needed) const {
  absl::StatusOr<Caller> caller = Identify(metadata);
  return caller.ok() ? caller->CheckRole(needed) : caller.status();
}

absl::Status TokenAuthorizer::CheckAuthorization(std::optional<absl::string_view> authorization,
                                                 Role needed) const {
  absl::StatusOr<Caller> caller = IdentifyAuthorization(authorization);
  return caller.ok() ? caller->CheckRole(needed) : caller.status();
}

absl::Status TokenAuthorizer::CheckJob(const Metadata& metadata, absl::string_view job_id,
                                       absl::string_view action) const {
  absl::StatusOr<Caller> caller = Identify(metadata);
  return caller.ok() ? caller->CheckJob(job_id, action) : caller.status();
}

absl::StatusOr<std::string> NewToken() {
  unsigned char bytes[32];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot draw a token: getrandom: ", std::strerror(errno)));
    }
    filled += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token.push_back(kHex[b >> 4]);
    token.push_back(kHex[b & 15]);
  }
  return token;
}

std::string SafeUserName(absl::string_view name, absl::string_view fallback) {
  std::string safe(name.substr(0, kMaxUserNameLength));
  for (char& c : safe) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') c = '_';
  }
  if (!safe.empty() && !absl::ascii_isalnum(safe[0])) safe[0] = 'u';
  return safe.empty() ? std::string(fallback) : safe;
}

absl::StatusOr<ClientSecurity> LoadClientSecurity(const std::string& token_file,
                                                  const std::string& tls_ca,
                                                  const std::string& tls_cert,
                                                  const std::string& tls_key) {
  ClientSecurity security;
  struct Source {
    std::string path;
    std::string what;
  };
  auto pick = [](const std::string& flag_value, const char* flag, const char* env) {
    return flag_value.empty() ? Source{FromEnv(env), env} : Source{flag_value, flag};
  };
  const Source token = pick(token_file, "--token_file", kEnvTokenFile);
  if (!token.path.empty()) {
    if (absl::Status s = CheckTokenFileIsPrivate(token.path, token.what); !s.ok()) return s;
    absl::StatusOr<std::string> text = ReadWholeFile(token.path, token.what);
    if (!text.ok()) return text.status();
    std::vector<std::pair<int, std::string>> lines = ContentLines(*text);
    if (lines.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(token.what, " ", token.path, " holds no token"));
    }
    std::vector<std::string> fields =
        absl::StrSplit(lines[0].second, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    // "TOKEN", or a line of the coordinator's file: "ROLE TOKEN [USER]".
    security.token = fields.size() == 1 ? fields[0] : fields[1];
  } else {
    security.token = FromEnv(kEnvToken);
  }
  const Source ca = pick(tls_ca, "--tls_ca", kEnvTlsCa);
  const Source cert = pick(tls_cert, "--tls_cert", kEnvTlsCert);
  const Source key = pick(tls_key, "--tls_key", kEnvTlsKey);
  if (cert.path.empty() != key.path.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together (a client certificate and its key)");
  }
  if (!cert.path.empty() && ca.path.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert needs --tls_ca: client certificates are only sent over TLS");
  }
  for (auto [source, out] :
       {std::pair{&ca, &security.tls_ca_pem}, std::pair{&cert, &security.tls_cert_pem},
        std::pair{&key, &security.tls_key_pem}}) {
    if (source->path.empty()) continue;
    absl::StatusOr<std::string> pem = ReadWholeFile(source->path, source->what);
    if (!pem.ok()) return pem.status();
    *out = std::move(*pem);
  }
  return security;
}

void ConfigureClient(ClientSecurity security) { GlobalClientSecurity() = std::move(security); }

const ClientSecurity& ClientSecurityConfig() { return GlobalClientSecurity(); }

}  // namespace chorus
