#include "common/paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace chorus {
namespace {

namespace fs = std::filesystem;

void WriteProgram(const fs::path& path, fs::perms perms) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << "#!/bin/sh\n";
  fs::permissions(path, perms);
}

class CompanionBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  fs::path root_;
};

TEST_F(CompanionBinaryTest, AnInstalledTreeHasItBesideTheProgram) {
  WriteProgram(root_ / "bin/chorus-worker", fs::perms::owner_all);
  EXPECT_EQ(CompanionBinary((root_ / "bin").string(), "chorus-worker", "worker"),
            (root_ / "bin/chorus-worker").string());
}

TEST_F(CompanionBinaryTest, TheBuildTreeHasItInItsPackage) {
  WriteProgram(root_ / "worker/chorus-worker", fs::perms::owner_all);
  fs::create_directories(root_ / "client");
  EXPECT_EQ(CompanionBinary((root_ / "client").string(), "chorus-worker", "worker"),
            (root_ / "client/../worker/chorus-worker").string());
}

TEST_F(CompanionBinaryTest, AFileThatIsNotExecutableIsPassedOver) {
  WriteProgram(root_ / "bin/chorus-worker", fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(CompanionBinary((root_ / "bin").string(), "chorus-worker", "worker"),
            (root_ / "bin/../worker/chorus-worker").string());
}

TEST_F(CompanionBinaryTest, NeitherThereNamesWhereABuildPutsIt) {
  EXPECT_EQ(CompanionBinary((root_ / "bin").string(), "chorus-rank", "worker"),
            (root_ / "bin/../worker/chorus-rank").string());
}

TEST(NormalPathTest, OneFormWithoutTrailingSlashes) {
  EXPECT_EQ(NormalPath("/mnt/ckpt/"), "/mnt/ckpt");
  EXPECT_EQ(NormalPath("/mnt//ckpt//"), "/mnt/ckpt");
  EXPECT_EQ(NormalPath("/mnt/./a/../ckpt"), "/mnt/ckpt");
  EXPECT_EQ(NormalPath("/"), "/");
  EXPECT_EQ(NormalPath("//"), "/");
  EXPECT_EQ(NormalPath("data/x.pt"), "data/x.pt");
  EXPECT_EQ(NormalPath("./x.pt"), "x.pt");
  EXPECT_EQ(NormalPath(""), "");
  for (const char* path : {"/mnt/ckpt/", "/a/./b//", "rel/../x/"}) {
    EXPECT_EQ(NormalPath(NormalPath(path)), NormalPath(path)) << path;
  }
}

// A /proc file of a process reaped between open and read fails the read;
// an istreambuf_iterator turned that into an uncaught exception that aborted
// a rank's supervisor. A directory fails read(2) the same way, every time.
TEST(ReadSmallFileTest, AFailedReadIsNoValueNotAnException) {
  EXPECT_EQ(ReadSmallFile("/proc/self"), std::nullopt) << "read(2) of a directory fails";
  EXPECT_EQ(ReadSmallFile("/nonexistent/file"), std::nullopt);
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/small";
  std::ofstream(path) << "12345 (a b) S 1";
  EXPECT_EQ(ReadSmallFile(path), "12345 (a b) S 1");
  EXPECT_EQ(ReadSmallFile(path, 5), "12345");
  const std::optional<std::string> stat = ReadSmallFile("/proc/self/stat");
  ASSERT_TRUE(stat.has_value());
  EXPECT_EQ(stat->substr(0, stat->find(' ')), std::to_string(::getpid()));
}

}  // namespace
}  // namespace chorus
