#include "common/private_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Runs the test body under umask 0, which leaves new files readable and
// writable by all: the modes asserted come from the code, not the umask.
class PrivateFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    old_umask_ = ::umask(0);
    dir_ = std::string(std::getenv("TEST_TMPDIR")) + "/" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { ::umask(old_umask_); }

  mode_t old_umask_ = 0;
  std::string dir_;
};

TEST_F(PrivateFilesTest, DirectoryIsCreatedOrTightenedTo0700) {
  ASSERT_TRUE(MakePrivateDirectory(dir_ + "/state", "--state_dir").ok());
  EXPECT_EQ(ModeOf(dir_ + "/state"), 0700u);
  ASSERT_EQ(::chmod((dir_ + "/state").c_str(), 0755), 0);
  ASSERT_TRUE(MakePrivateDirectory(dir_ + "/state", "--state_dir").ok());
  EXPECT_EQ(ModeOf(dir_ + "/state"), 0700u);
}

TEST_F(PrivateFilesTest, FileIsCreatedOrTightenedTo0600AndKeepsItsContents) {
  std::filesystem::create_directories(dir_);
  ASSERT_TRUE(MakePrivateFile(dir_ + "/new.db").ok());
  EXPECT_EQ(ModeOf(dir_ + "/new.db"), 0600u);
  std::ofstream(dir_ + "/old.db") << "contents";
  ASSERT_EQ(ModeOf(dir_ + "/old.db"), 0666u) << "the umask of this test makes 0666 files";
  ASSERT_TRUE(MakePrivateFile(dir_ + "/old.db").ok());
  EXPECT_EQ(ModeOf(dir_ + "/old.db"), 0600u);
  std::ifstream in(dir_ + "/old.db");
  std::string contents;
  in >> contents;
  EXPECT_EQ(contents, "contents");
}

TEST_F(PrivateFilesTest, WrittenFileIs0600AndNeverReplaced) {
  std::filesystem::create_directories(dir_);
  ASSERT_TRUE(WritePrivateFile(dir_ + "/secret", "s3cret").ok());
  EXPECT_EQ(ModeOf(dir_ + "/secret"), 0600u);
  absl::Status again = WritePrivateFile(dir_ + "/secret", "other");
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  std::ifstream in(dir_ + "/secret");
  std::string contents;
  in >> contents;
  EXPECT_EQ(contents, "s3cret");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_),
                          std::filesystem::directory_iterator()),
            1)
      << "no temporary file is left behind";
}

TEST_F(PrivateFilesTest, OpenedFileIs0600AndAWiderOneIsTightened) {
  std::filesystem::create_directories(dir_);
  int fd = OpenPrivateFile(dir_ + "/MANIFEST", O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "abc", 3), 3);
  ::close(fd);
  EXPECT_EQ(ModeOf(dir_ + "/MANIFEST"), 0600u);
  ASSERT_EQ(::chmod((dir_ + "/MANIFEST").c_str(), 0644), 0);
  fd = OpenPrivateFile(dir_ + "/MANIFEST", O_WRONLY | O_APPEND);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_EQ(ModeOf(dir_ + "/MANIFEST"), 0600u);
  EXPECT_EQ(OpenPrivateFile(dir_ + "/missing/MANIFEST", O_WRONLY), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(PrivateFilesTest, ATreeOthersCouldReadIsTightenedEverywhere) {
  std::filesystem::create_directories(dir_ + "/job-1/000000000010");
  std::ofstream(dir_ + "/job-1/000000000010/model.pt") << "weights";
  std::ofstream(dir_ + "/job-1/000000000010/MANIFEST") << "m";
  ASSERT_EQ(ModeOf(dir_ + "/job-1/000000000010"), 0777u);
  ASSERT_EQ(ModeOf(dir_ + "/job-1/000000000010/model.pt"), 0666u);
  TightenPrivateTree(dir_, "checkpoint directory");
  for (const std::string& path : {dir_, dir_ + "/job-1", dir_ + "/job-1/000000000010"}) {
    EXPECT_EQ(ModeOf(path), 0700u) << path;
  }
  EXPECT_EQ(ModeOf(dir_ + "/job-1/000000000010/model.pt"), 0600u);
  EXPECT_EQ(ModeOf(dir_ + "/job-1/000000000010/MANIFEST"), 0600u);
  std::ifstream in(dir_ + "/job-1/000000000010/model.pt");
  std::string contents;
  in >> contents;
  EXPECT_EQ(contents, "weights");
}

TEST_F(PrivateFilesTest, TokenFileReadableByOthersIsRefusedWithTheFix) {
  std::filesystem::create_directories(dir_);
  const std::string path = dir_ + "/tokens";
  std::ofstream(path) << "admin 0123456789abcdef\n";
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  absl::Status open = CheckTokenFileIsPrivate(path, "token file");
  EXPECT_EQ(open.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(open.message(),
            "token file " + path + " is readable by others (mode 0644); chmod 600 " + path);
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  EXPECT_THAT(CheckTokenFileIsPrivate(path, "--token_file").message(),
              HasSubstr("--token_file " + path + " is readable by others (mode 0640)"))
      << "a group-readable file of one's own is refused too";
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  EXPECT_TRUE(CheckTokenFileIsPrivate(path, "token file").ok());
  ASSERT_EQ(::chmod(path.c_str(), 0400), 0);
  EXPECT_TRUE(CheckTokenFileIsPrivate(path, "token file").ok());
  EXPECT_TRUE(CheckTokenFileIsPrivate(dir_ + "/missing", "token file").ok());
}

TEST_F(PrivateFilesTest, AnotherUsersFileMayBeSharedThroughItsGroupButNotWithTheWorld) {
  struct stat st {};
  // /etc/passwd: root's and world-readable on every Linux.
  ASSERT_EQ(::stat("/etc/passwd", &st), 0);
  ASSERT_NE(st.st_mode & S_IROTH, 0u);
  EXPECT_EQ(CheckTokenFileIsPrivate("/etc/passwd", "token file").code(),
            absl::StatusCode::kFailedPrecondition);
  // root:shadow 0640 where present: what root:chorus 0640 looks like to
  // the chorus user.
  if (::geteuid() != 0 && ::stat("/etc/shadow", &st) == 0 && st.st_uid == 0 &&
      (st.st_mode & S_IRWXO) == 0) {
    EXPECT_TRUE(CheckTokenFileIsPrivate("/etc/shadow", "token file").ok());
  }
}

}  // namespace
}  // namespace chorus
