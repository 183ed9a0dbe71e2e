#include "common/auth.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

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
  EXPECT_THAT(role.status().message(), HasSubstr("tokens line 1: expected \"admin TOKEN\""));
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

TEST(ClientSecurityTest, TokenFromFileOrEnvironmentAndTlsFilesChecked) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  std::ofstream(dir + "/bare.token") << "  " << kAdmin << "\n";
  std::ofstream(dir + "/role.token") << "# mine\nworker " << kWorker << "\n";
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

}  // namespace
}  // namespace chorus
