#include "common/job_credentials.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef";

TEST(JobCredentialsTest, ACredentialNamesItsJobAndOnlyThatSecretAcceptsIt) {
  JobCredentials credentials(kSecret);
  const std::string one = credentials.For("job-000001");
  EXPECT_THAT(one, HasSubstr("job-000001"));
  EXPECT_EQ(one, credentials.For("job-000001")) << "derived, not drawn: the same every time";
  EXPECT_NE(one, credentials.For("job-000002"));
  EXPECT_THAT(credentials.JobOf(one), Optional(std::string("job-000001")));
  EXPECT_TRUE(JobCredentials::LooksLikeOne(one));

  JobCredentials other("fedcba9876543210fedcba9876543210");
  EXPECT_EQ(other.JobOf(one), std::nullopt) << "another coordinator's secret";

  // Renaming the job in a credential, or changing its tag, breaks it.
  std::string renamed = one;
  renamed.replace(renamed.find("job-000001"), 10, "job-000002");
  EXPECT_EQ(credentials.JobOf(renamed), std::nullopt);
  std::string flipped = one;
  flipped.back() = flipped.back() == '0' ? '1' : '0';
  EXPECT_EQ(credentials.JobOf(flipped), std::nullopt);
  EXPECT_EQ(credentials.JobOf(one.substr(0, one.size() - 1)), std::nullopt);
  EXPECT_EQ(credentials.JobOf("worker-0123456789abcdef"), std::nullopt);
  EXPECT_EQ(credentials.JobOf("chorus-job::"), std::nullopt);
  EXPECT_FALSE(JobCredentials::LooksLikeOne("worker-0123456789abcdef"));
}

TEST(JobCredentialsTest, SecretIsDrawnOnceKeptPrivateAndReadBackAfterARestart) {
  const mode_t old_umask = ::umask(0);  // the mode comes from the code, not the umask
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/secret_once";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/job_credentials.key";

  auto first = JobCredentials::LoadOrCreate(path);
  ASSERT_TRUE(first.ok()) << first.status();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the secret is the owner's only, whatever the umask";
  auto again = JobCredentials::LoadOrCreate(path);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->For("job-000003"), first->For("job-000003"))
      << "credentials of running jobs survive a coordinator restart";

  std::filesystem::remove_all(dir + "/second");
  std::filesystem::create_directories(dir + "/second");
  auto fresh = JobCredentials::LoadOrCreate(dir + "/second/job_credentials.key");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_NE(fresh->For("job-000003"), first->For("job-000003")) << "each state dir draws its own";

  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  auto exposed = JobCredentials::LoadOrCreate(path);
  EXPECT_EQ(exposed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(exposed.status().message(),
              HasSubstr("readable by others (mode 0644); chmod 600 " + path));

  std::filesystem::remove(path);
  {
    std::ofstream short_file(path);
    short_file << "short\n";
  }
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  EXPECT_THAT(JobCredentials::LoadOrCreate(path).status().message(),
              HasSubstr("holds 5 characters"));
  ::umask(old_umask);
}

}  // namespace
}  // namespace chorus
