#include "common/auth.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAdmin[] = "admin-0123456789abcdef";
constexpr char kWorker[] = "worker-0123456789abcdef";

std::multimap<grpc::string_ref, grpc::string_ref> Metadata(const std::string& value) {
  static std::string* stored = new std::string;
  *stored = value;
  return {{"authorization", *stored}};
}

TokenAuthorizer Authorizer() {
  auto auth = TokenAuthorizer::FromText(
      std::string("# tokens\nadmin ") + kAdmin + "\n\nworker " + kWorker + "  # the agents\n",
      "tokens");
  EXPECT_TRUE(auth.ok()) << auth.status();
  return *auth;
}

TEST(TokenAuthorizerTest, RolesAndTheAuthMatrix) {
  TokenAuthorizer auth = Authorizer();
  EXPECT_TRUE(auth.enabled());
  EXPECT_TRUE(auth.Check(Metadata(std::string("Bearer ") + kAdmin), Role::kAdmin).ok());
  EXPECT_TRUE(auth.Check(Metadata(std::string("Bearer ") + kAdmin), Role::kWorker).ok());
  EXPECT_TRUE(auth.Check(Metadata(std::string("Bearer ") + kWorker), Role::kWorker).ok());

  absl::Status weak = auth.Check(Metadata(std::string("Bearer ") + kWorker), Role::kAdmin);
  EXPECT_EQ(weak.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(weak.message(), HasSubstr("needs an admin token"));

  EXPECT_EQ(auth.Check({}, Role::kWorker).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(auth.Check({}, Role::kWorker).message(), HasSubstr("--token_file"));
  absl::Status wrong = auth.Check(Metadata("Bearer not-a-known-token-at-all"), Role::kWorker);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(wrong.message(), Not(HasSubstr("not-a-known")));
  EXPECT_EQ(auth.Check(Metadata(kAdmin), Role::kWorker).code(), absl::StatusCode::kUnauthenticated)
      << "the Bearer scheme is required";
  // A prefix of a valid token is not valid.
  EXPECT_EQ(
      auth.Check(Metadata(std::string("Bearer ") + std::string(kAdmin).substr(0, 10)), Role::kAdmin)
          .code(),
      absl::StatusCode::kUnauthenticated);

  TokenAuthorizer open;
  EXPECT_FALSE(open.enabled());
  EXPECT_TRUE(open.Check({}, Role::kAdmin).ok());
}

TEST(TokenAuthorizerTest, AnHttpAuthorizationHeaderIsCheckedLikeGrpcMetadata) {
  TokenAuthorizer auth = Authorizer();
  EXPECT_TRUE(auth.CheckAuthorization(std::string("Bearer ") + kAdmin, Role::kAdmin).ok());
  EXPECT_EQ(auth.CheckAuthorization(std::string("Bearer ") + kWorker, Role::kAdmin).code(),
            absl::StatusCode::kPermissionDenied);
  absl::Status missing = auth.CheckAuthorization(std::nullopt, Role::kAdmin);
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(missing.message(), HasSubstr("--token_file"));
  EXPECT_EQ(auth.CheckAuthorization(std::string("Basic ") + kAdmin, Role::kAdmin).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.CheckAuthorization("Bearer ", Role::kAdmin).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(TokenAuthorizer().CheckAuthorization(std::nullopt, Role::kAdmin).ok());
}

TEST(TokenAuthorizerTest, MalformedFilesNameTheLineButNeverTheToken) {
  auto role = TokenAuthorizer::FromText("root secret-token-1234567890\n", "tokens");
  EXPECT_EQ(role.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(role.status().message(),
              HasSubstr("tokens line 1: expected \"ROLE TOKEN [USER] [unix=ACCOUNT]\""));
  EXPECT_THAT(role.status().message(), Not(HasSubstr("secret")));
  auto shorty = TokenAuthorizer::FromText("# c\nadmin short\n", "tokens");
  EXPECT_THAT(shorty.status().message(), HasSubstr("tokens line 2: tokens must be at least 16"));
  EXPECT_THAT(TokenAuthorizer::FromText("# nothing\n", "tokens").status().message(),
              HasSubstr("has no tokens"));
  auto twice = TokenAuthorizer::FromText(
      std::string("admin ") + kAdmin + "\nworker " + kAdmin + "\n", "tokens");
  EXPECT_THAT(twice.status().message(), HasSubstr("line 2: the same token appears twice"));
  EXPECT_EQ(TokenAuthorizer::FromFile("/nonexistent/tokens").status().code(),
            absl::StatusCode::kNotFound);
}

constexpr char kAlice[] = "alice-0123456789abcdef";
constexpr char kAlice2[] = "alice-2-0123456789abcdef";
constexpr char kBob[] = "bob-0123456789abcdef";
constexpr char kAgent[] = "agent-0123456789abcdef";

TokenAuthorizer Users() {
  auto auth = TokenAuthorizer::FromText(
      absl::StrCat("admin ", kAdmin, " root\nuser ", kAlice, " alice\nuser\t", kAlice2,
                   "\talice  # her laptop\nuser ", kBob, " bob\nagent ", kAgent, "\nworker ",
                   kWorker, "\n"),
      "tokens");
  EXPECT_TRUE(auth.ok()) << auth.status();
  return *auth;
}

Caller Identify(const TokenAuthorizer& auth, const std::string& token) {
  absl::StatusOr<Caller> caller = auth.Identify(Metadata("Bearer " + token));
  EXPECT_TRUE(caller.ok()) << caller.status();
  return caller.ok() ? *caller : Caller::OfJob("none");
}

TEST(TokenAuthorizerTest, LinesNameUsersAndOldLinesNameTheirRole) {
  TokenAuthorizer auth = Users();
  const std::map<std::string, std::pair<Role, std::string>> want = {
      {kAdmin, {Role::kAdmin, "root"}},  {kAlice, {Role::kUser, "alice"}},
      {kAlice2, {Role::kUser, "alice"}}, {kBob, {Role::kUser, "bob"}},
      {kAgent, {Role::kAgent, "agent"}}, {kWorker, {Role::kAgent, "worker"}}};
  for (const auto& [token, identity] : want) {
    Caller caller = Identify(auth, token);
    EXPECT_EQ(caller.role(), identity.first) << identity.second;
    EXPECT_EQ(caller.user(), identity.second);
  }
  // The old file format still loads: admin and worker lines name their role.
  Caller old_admin = Identify(Authorizer(), kAdmin);
  EXPECT_EQ(old_admin.role(), Role::kAdmin);
  EXPECT_EQ(old_admin.user(), "admin");
  EXPECT_EQ(Identify(Authorizer(), kWorker).role(), Role::kAgent);
  // Without a token file: an anonymous admin.
  absl::StatusOr<Caller> anonymous = TokenAuthorizer().Identify({});
  ASSERT_TRUE(anonymous.ok());
  EXPECT_EQ(anonymous->role(), Role::kAdmin);
  EXPECT_EQ(anonymous->user(), "");
}

TEST(TokenAuthorizerTest, EachRoleHasItsOwnCalls) {
  TokenAuthorizer auth = Users();
  const Caller admin = Identify(auth, kAdmin);
  const Caller alice = Identify(auth, kAlice);
  const Caller agent = Identify(auth, kAgent);
  for (Role needed : {Role::kAdmin, Role::kUser, Role::kAgent}) {
    EXPECT_TRUE(admin.CheckRole(needed).ok());
  }
  EXPECT_TRUE(alice.CheckRole(Role::kUser).ok());
  EXPECT_TRUE(agent.CheckRole(Role::kAgent).ok());
  absl::Status agent_submits = agent.CheckRole(Role::kUser);
  EXPECT_EQ(agent_submits.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(agent_submits.message(),
            "this call needs a user or admin token; the token given is agent's, with the agent "
            "role (agent tokens are for node agents only)");
  EXPECT_EQ(alice.CheckRole(Role::kAgent).code(), absl::StatusCode::kPermissionDenied)
      << "a user token does not connect agents";
  EXPECT_EQ(alice.CheckRole(Role::kAdmin).code(), absl::StatusCode::kPermissionDenied);
  // Rank and agent calls for a job: agents and admins, never users.
  EXPECT_TRUE(agent.CheckJob("job-000001", "join").ok());
  absl::Status user_joins = alice.CheckJob("job-000001", "join");
  EXPECT_EQ(user_joins.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(user_joins.message(), HasSubstr("alice's"));
}

TEST(TokenAuthorizerTest, OwnersAndAdminsMayActOnAJobOthersMayNot) {
  TokenAuthorizer auth = Users();
  EXPECT_TRUE(Identify(auth, kAlice).CheckOwner("job-000004", "alice", "cancel").ok());
  EXPECT_TRUE(Identify(auth, kAlice2).CheckOwner("job-000004", "alice", "cancel").ok())
      << "two tokens of one user are one owner";
  EXPECT_TRUE(Identify(auth, kAdmin).CheckOwner("job-000004", "alice", "cancel").ok());
  absl::Status bob = Identify(auth, kBob).CheckOwner("job-000004", "alice", "cancel");
  EXPECT_EQ(bob.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(bob.message(), "job-000004 belongs to alice; only alice or an admin may cancel it");
  absl::Status unowned = Identify(auth, kBob).CheckOwner("job-000001", "", "read the logs of");
  EXPECT_EQ(unowned.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(unowned.message(), HasSubstr("only an admin may read the logs of it"));
  absl::Status agent = Identify(auth, kAgent).CheckOwner("job-000004", "alice", "watch");
  EXPECT_EQ(agent.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(agent.message(), HasSubstr("an agent token may not watch job-000004"));
  EXPECT_TRUE(Caller::OfJob("job-000004").CheckOwner("job-000004", "alice", "read").ok());
  EXPECT_EQ(Caller::OfJob("job-000005").CheckOwner("job-000004", "alice", "read").code(),
            absl::StatusCode::kPermissionDenied);
}

// Note [Rank accounts] in worker/agent/rank_accounts.h.
TEST(TokenAuthorizerTest, UserLinesMayNameTheUnixAccountTheirJobsRunAs) {
  auto auth = TokenAuthorizer::FromText(
      absl::StrCat("admin ", kAdmin, " root unix=ops\nuser ", kAlice, " alice unix=alice\nuser ",
                   kAlice2, " alice  # the same account from her laptop's line\nuser\t", kBob,
                   "\tbob\t unix=_bob-2.x\nagent ", kAgent, "\n"),
      "tokens");
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_TRUE(auth->maps_unix_accounts());
  EXPECT_EQ(auth->UnixAccountOf("alice"), "alice");
  EXPECT_EQ(auth->UnixAccountOf("bob"), "_bob-2.x");
  EXPECT_EQ(auth->UnixAccountOf("root"), "ops");
  EXPECT_EQ(auth->UnixAccountOf("carol"), "");
  // The token and user of a line with unix= are read as without it.
  EXPECT_EQ(Identify(*auth, kAlice).user(), "alice");
  EXPECT_EQ(Identify(*auth, kBob).role(), Role::kUser);
  EXPECT_FALSE(Users().maps_unix_accounts());
  EXPECT_EQ(Users().UnixAccountOf("alice"), "");
}

TEST(TokenAuthorizerTest, MalformedUserLinesAreRefusedNamingTheLine) {
  const std::string ok_line = absl::StrCat("admin ", kAdmin, " root\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {absl::StrCat("user ", kAlice, "\n"), "line 2: a user token needs the user's name"},
      {absl::StrCat("user ", kAlice, " al/ice\n"), "line 2: the user name must be 1 to 64"},
      {absl::StrCat("user ", kAlice, " -alice\n"), "line 2: the user name must be"},
      {absl::StrCat("user ", kAlice, " ", std::string(65, 'a'), "\n"), "line 2: the user name"},
      {absl::StrCat("user ", kAlice, " alice extra\n"),
       "line 2: expected \"ROLE TOKEN [USER] [unix=ACCOUNT]\""},
      {absl::StrCat("owner ", kAlice, " alice\n"),
       "line 2: expected \"ROLE TOKEN [USER] [unix=ACCOUNT]\""},
      {absl::StrCat("user ", kAdmin, " alice\n"), "line 2: the same token appears twice"},
      {absl::StrCat("user ", kAlice, " unix=alice\n"),
       "line 2: a user token needs the user's name"},
      {absl::StrCat("user ", kAlice, " alice unix=\n"),
       "line 2: unix=(empty) is not a Unix account"},
      {absl::StrCat("user ", kAlice, " alice unix=1alice\n"), "line 2: unix=1alice is not a Unix"},
      {absl::StrCat("user ", kAlice, " alice unix=al:ice\n"), "line 2: unix=al:ice is not a Unix"},
      {absl::StrCat("user ", kAlice, " alice unix=", std::string(33, 'a'), "\n"),
       "line 2: unix=aaaa"},
      {absl::StrCat("agent ", kAgent, " agent unix=chorus\n"),
       "line 2: unix= belongs on user (or admin) lines"},
      {absl::StrCat("user ", kAlice, " alice unix=alice\nuser ", kBob, " alice unix=bob\n"),
       "line 3: alice is mapped to Unix account alice on an earlier line and to bob here"},
      {absl::StrCat("user ", kAlice, " alice unix=alice extra\n"), "line 2: expected \"ROLE"},
  };
  for (const auto& [line, want] : cases) {
    auto auth = TokenAuthorizer::FromText(ok_line + line, "/etc/chorus/tokens");
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_THAT(auth.status().message(), HasSubstr("/etc/chorus/tokens " + want));
    EXPECT_THAT(auth.status().message(), Not(HasSubstr("0123456789abcdef")));
  }
}

TEST(ClientSecurityTest, AClientReadsTheTokenOfAUserLine) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/alice.token";
  {
    std::ofstream out(path);
    out << "user " << kAlice << " alice\n";
  }
  chmod(path.c_str(), 0600);
  absl::StatusOr<ClientSecurity> security = LoadClientSecurity(path, "", "", "");
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_EQ(security->token, kAlice);
}

TEST(ClientSecurityTest, TokenFromFileOrEnvironmentAndTlsFilesChecked) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  std::ofstream(dir + "/bare.token") << "  " << kAdmin << "\n";
  std::ofstream(dir + "/role.token") << "# mine\nworker " << kWorker << "\n";
  ASSERT_EQ(::chmod((dir + "/bare.token").c_str(), 0600), 0);
  ASSERT_EQ(::chmod((dir + "/role.token").c_str(), 0400), 0);
  auto bare = LoadClientSecurity(dir + "/bare.token", "", "", "");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->token, kAdmin);
  EXPECT_TRUE(bare->tls_ca_pem.empty());
  auto with_role = LoadClientSecurity(dir + "/role.token", "", "", "");
  ASSERT_TRUE(with_role.ok()) << with_role.status();
  EXPECT_EQ(with_role->token, kWorker);

  setenv("CHORUS_TOKEN", "from-the-environment-0000", 1);
  auto env = LoadClientSecurity("", "", "", "");
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->token, "from-the-environment-0000");
  unsetenv("CHORUS_TOKEN");

  auto missing = LoadClientSecurity("", "/nonexistent/ca.pem", "", "");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("--tls_ca /nonexistent/ca.pem"));
  EXPECT_THAT(LoadClientSecurity("", "", dir + "/bare.token", "").status().message(),
              HasSubstr("--tls_cert and --tls_key go together"));
  EXPECT_THAT(
      LoadClientSecurity("", "", dir + "/bare.token", dir + "/bare.token").status().message(),
      HasSubstr("--tls_cert needs --tls_ca"));
}

TEST(ClientSecurityTest, TokenFileReadableByOthersIsRefusedSayingHowToFixIt) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string path = dir + "/open.token";
  std::ofstream(path) << kWorker << "\n";
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  auto flag = LoadClientSecurity(path, "", "", "");
  EXPECT_EQ(flag.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(flag.status().message(),
            "--token_file " + path + " is readable by others (mode 0644); chmod 600 " + path);
  setenv("CHORUS_TOKEN_FILE", path.c_str(), 1);
  EXPECT_THAT(LoadClientSecurity("", "", "", "").status().message(),
              HasSubstr("CHORUS_TOKEN_FILE " + path + " is readable by others"));
  unsetenv("CHORUS_TOKEN_FILE");
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  EXPECT_TRUE(LoadClientSecurity(path, "", "", "").ok());
}

TEST(TokenAuthorizerTest, ServerTokenFileReadableByOthersIsRefused) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/server.tokens";
  std::ofstream(path) << "admin " << kAdmin << "\n";
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  auto open = TokenAuthorizer::FromFile(path);
  EXPECT_EQ(open.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(open.status().message(),
              HasSubstr("--token_file " + path + " is readable by others (mode 0640); chmod 600"));
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  EXPECT_TRUE(TokenAuthorizer::FromFile(path).ok());
}

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef";

// What a program's CHORUS_TOKEN may do (Note [Job credentials]).
TEST(JobCredentialTest, ACredentialActsForItsOwnJobOnly) {
  TokenAuthorizer auth = Authorizer();
  JobCredentials credentials(kSecret);
  auth.AcceptJobCredentials(credentials);
  ASSERT_NE(auth.job_credentials(), nullptr);
  const auto mine = Metadata("Bearer " + credentials.For("job-000001"));

  absl::StatusOr<Caller> caller = auth.Identify(mine);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->role(), Role::kJob);
  EXPECT_EQ(caller->job_id(), "job-000001");
  EXPECT_TRUE(auth.Check(mine, Role::kJob).ok());
  EXPECT_TRUE(auth.CheckJob(mine, "job-000001", "join").ok());

  absl::Status other = auth.CheckJob(mine, "job-000002", "write the key-value store");
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(other.message(),
            "the credential of job job-000001 may not write the key-value store for job "
            "job-000002: a job's ranks may reach only their own job");

  // Agent calls (AgentService) need an agent token, admin calls an admin's.
  absl::Status agent = auth.Check(mine, Role::kAgent);
  EXPECT_EQ(agent.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(agent.message(), HasSubstr("needs an agent or admin token"));
  EXPECT_THAT(agent.message(), HasSubstr("credential of job job-000001"));
  absl::Status admin = auth.Check(mine, Role::kAdmin);
  EXPECT_EQ(admin.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(admin.message(), HasSubstr("needs an admin token"));
  EXPECT_EQ(auth.CheckAuthorization("Bearer " + credentials.For("job-000001"), Role::kAdmin).code(),
            absl::StatusCode::kPermissionDenied)
      << "the HTTP port's admin pages too";

  // Worker and admin tokens act for every job.
  EXPECT_TRUE(auth.CheckJob(Metadata(std::string("Bearer ") + kWorker), "job-000002", "join").ok());
  EXPECT_TRUE(auth.CheckJob(Metadata(std::string("Bearer ") + kAdmin), "job-000002", "join").ok());
}

TEST(JobCredentialTest, ForeignOrForgedCredentialsAreUnknownAndNotEchoed) {
  TokenAuthorizer auth = Authorizer();
  auth.AcceptJobCredentials(JobCredentials(kSecret));
  const std::string foreign =
      JobCredentials("fedcba9876543210fedcba9876543210").For("job-000001");
  absl::Status s = auth.Check(Metadata("Bearer " + foreign), Role::kJob);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(s.message(), HasSubstr("job credential is not valid for this coordinator"));
  EXPECT_THAT(s.message(), Not(HasSubstr(foreign.substr(foreign.rfind(':') + 1))));

  // An authorizer that accepts no job credentials knows none.
  TokenAuthorizer plain = Authorizer();
  EXPECT_EQ(plain.job_credentials(), nullptr);
  EXPECT_EQ(plain.Check(Metadata("Bearer " + JobCredentials(kSecret).For("job-000001")),
                        Role::kJob)
                .code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(JobCredentialTest, WithoutTokensNothingChanges) {
  TokenAuthorizer open;
  absl::StatusOr<Caller> caller = open.Identify({});
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->role(), Role::kAdmin);
  EXPECT_TRUE(open.CheckJob({}, "job-000002", "join").ok());
}

}  // namespace
}  // namespace chorus
