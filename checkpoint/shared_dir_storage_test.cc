#include "checkpoint/shared_dir_storage.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/fake_checkpoint_service.h"
#include "checkpoint/layout.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(base != nullptr ? base : "/tmp", "/shared_dir_storage_", name, "_", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

CheckpointFileSource Source(std::string name, std::string bytes) {
  return {std::move(name),
          [bytes = std::move(bytes)](const CheckpointByteSink& out) -> absl::Status {
            // Pieces of 100 KB: the storage's 256 KB buffer fills and flushes.
            for (size_t offset = 0; offset < bytes.size(); offset += 100 << 10) {
              if (absl::Status s = out(absl::string_view(bytes).substr(offset, 100 << 10)); !s.ok())
                return s;
            }
            return absl::OkStatus();
          }};
}

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 31 + seed);
  return s;
}

class SharedDirStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    shared_ = TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    coordinator_ = std::make_unique<FakeCheckpointService>(shared_);
    ASSERT_TRUE(coordinator_->Start().ok());
  }

  std::string shared_;
  std::unique_ptr<FakeCheckpointService> coordinator_;
};

TEST_F(SharedDirStorageTest, StoreWritesTheFilesAndAsksTheCoordinatorToCommitThem) {
  absl::StatusOr<std::unique_ptr<SharedDirCheckpointStorage>> storage =
      SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_, "", "job-000004",
                                         /*generation=*/2, /*rank=*/0);
  ASSERT_TRUE(storage.ok()) << storage.status();
  const std::string model = Pattern(700 << 10, 1);
  const std::string state = Pattern(123, 2);
  absl::Status s =
      (*storage)->Store(40, {Source(kModelFile, model), Source(kTrainStateFile, state)});
  ASSERT_TRUE(s.ok()) << s;

  // The commit request is the manifest of what was written.
  const std::vector<v1::CommitCheckpointRequest> commits = coordinator_->commits();
  ASSERT_EQ(commits.size(), 1u);
  const v1::CommitCheckpointRequest& commit = commits[0];
  EXPECT_EQ(commit.job_id(), "job-000004");
  EXPECT_EQ(commit.step(), 40);
  EXPECT_EQ(commit.generation(), 2);
  EXPECT_EQ(commit.rank(), 0);
  EXPECT_THAT(commit.staging_dir(), StartsWith(absl::StrCat(".staging-40-r0-", ::getpid(), "-")));
  ASSERT_EQ(commit.files_size(), 2);
  EXPECT_EQ(commit.files(0).name(), kModelFile);
  EXPECT_EQ(commit.files(0).size(), static_cast<int64_t>(model.size()));
  EXPECT_EQ(commit.files(0).crc32c(), Crc32c(model));
  EXPECT_EQ(commit.files(1).name(), kTrainStateFile);
  EXPECT_EQ(commit.files(1).size(), static_cast<int64_t>(state.size()));
  EXPECT_EQ(commit.files(1).crc32c(), Crc32c(state));
  // Every byte was in the staged files when the coordinator looked (they
  // were written and synced before the Commit call) ...
  EXPECT_EQ(coordinator_->committed_staging_paths().size(), 2u);
  // ... which now are the committed checkpoint.
  const std::string committed = absl::StrCat(shared_, "/job-000004/40");
  EXPECT_TRUE(ReadFile(committed + "/model.pt") == model);
  EXPECT_EQ(ReadFile(committed + "/train_state.pt"), state);
  EXPECT_FALSE(fs::exists(absl::StrCat(shared_, "/job-000004/", commit.staging_dir())));
}

TEST_F(SharedDirStorageTest, EachStoreStagesInADirectoryOfItsOwn) {
  auto storage =
      SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_, "", "job-000004", 1, 3);
  ASSERT_TRUE(storage.ok()) << storage.status();
  ASSERT_TRUE((*storage)->Store(10, {Source(ModelFileName(3), "a")}).ok());
  ASSERT_TRUE((*storage)->Store(20, {Source(ModelFileName(3), "b")}).ok());
  const std::vector<v1::CommitCheckpointRequest> commits = coordinator_->commits();
  ASSERT_EQ(commits.size(), 2u);
  EXPECT_THAT(commits[0].staging_dir(), StartsWith(".staging-10-r3-"));
  EXPECT_THAT(commits[1].staging_dir(), StartsWith(".staging-20-r3-"));
  EXPECT_EQ(ReadFile(shared_ + "/job-000004/20/model.rank3.pt"), "b");
}

TEST_F(SharedDirStorageTest, ARefusedCommitRemovesTheStagedFilesAndNamesTheDirectory) {
  coordinator_->set_store_error(absl::FailedPreconditionError("generation 1 is over"));
  auto storage =
      SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_, "", "job-000004", 1, 0);
  ASSERT_TRUE(storage.ok()) << storage.status();
  absl::Status s = (*storage)->Store(40, {Source(kModelFile, "weights")});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("storing checkpoint step 40 in ", shared_, "/job-000004: ")));
  EXPECT_THAT(s.message(), HasSubstr("generation 1 is over"));
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(shared_ + "/job-000004"))
    left.push_back(entry.path().string());
  EXPECT_TRUE(left.empty()) << left.front();
}

TEST_F(SharedDirStorageTest, AFileThatCannotBeCreatedIsNamedAndNothingIsCommitted) {
  auto storage =
      SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_, "", "job-000004", 1, 0);
  ASSERT_TRUE(storage.ok()) << storage.status();
  absl::Status s = (*storage)->Store(40, {Source("no-such-subdir/model.pt", "weights")});
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_THAT(s.message(), HasSubstr("cannot create "));
  EXPECT_THAT(s.message(), HasSubstr("/no-such-subdir/model.pt: No such file or directory"));
  EXPECT_TRUE(coordinator_->commits().empty());
}

TEST_F(SharedDirStorageTest, CreateRefusesADirectoryThatIsNotThere) {
  // With the cluster's namespace too: the directory the user named is the
  // one that must be mounted, and the one the message names.
  for (const std::string space : {"", "3f9a1c2b4d5e"}) {
    auto missing = SharedDirCheckpointStorage::Create(
        coordinator_->channel(), shared_ + "/not-mounted", space, "job-1", 1, 0);
    EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(missing.status().message(),
                HasSubstr(absl::StrCat("checkpoint.shared_dir ", shared_,
                                       "/not-mounted is not a directory on this host")));
  }
  EXPECT_FALSE(std::filesystem::exists(shared_ + "/not-mounted")) << "nothing is created there";
  // A cluster's namespace is made under a mounted directory.
  auto spaced = SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_,
                                                   "3f9a1c2b4d5e", "job-3", 1, 0);
  ASSERT_TRUE(spaced.ok()) << spaced.status();
  EXPECT_TRUE(std::filesystem::is_directory(shared_ + "/3f9a1c2b4d5e/job-3"));
  // The job's directory cannot be made: a file is in the way.
  std::ofstream(shared_ + "/job-2") << "in the way";
  auto blocked =
      SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_, "", "job-2", 1, 0);
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      blocked.status().message(),
      HasSubstr(absl::StrCat("checkpoint.shared_dir: cannot create or write ", shared_, "/job-2")));
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Note [A shared checkpoint directory]: under umask 0, which would leave
// everything readable and writable by all, the job's directory and its
// checkpoints are the ranks' user's only.
TEST_F(SharedDirStorageTest, TheJobsDirectoryAndFilesAreTheRanksUsersOnlyWhateverTheUmask) {
  const mode_t old_umask = ::umask(0);
  ASSERT_EQ(::chmod(shared_.c_str(), 01777), 0);  // shared by several users, as /tmp
  auto spaced = SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_, "3f9a1c2b4d5e",
                                                   "job-000003", 1, 0);
  ASSERT_TRUE(spaced.ok()) << spaced.status();
  auto storage =
      SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_, "", "job-000004", 1, 0);
  ASSERT_TRUE(storage.ok()) << storage.status();
  ASSERT_TRUE((*storage)->Store(40, {Source(kModelFile, "weights")}).ok());
  ::umask(old_umask);
  EXPECT_EQ(ModeOf(shared_ + "/3f9a1c2b4d5e"), 01777u)
      << "the cluster's namespace takes the root's mode, so other users make their jobs there";
  EXPECT_EQ(ModeOf(shared_ + "/3f9a1c2b4d5e/job-000003"), 0700u);
  const std::string job = shared_ + "/job-000004";
  EXPECT_EQ(ModeOf(job), 0700u);
  EXPECT_EQ(ModeOf(job + "/40"), 0700u);
  EXPECT_EQ(ModeOf(job + "/40/model.pt"), 0600u);
}

TEST_F(SharedDirStorageTest, AWorldWritableRootWithoutTheStickyBitIsRefused) {
  ASSERT_EQ(::chmod(shared_.c_str(), 0777), 0);
  auto refused =
      SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_, "", "job-1", 1, 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            absl::StrCat("checkpoint.shared_dir: ", shared_,
                         " is writable by every user (mode 0777) but lacks the sticky bit, so "
                         "any user could rename or remove other jobs' checkpoint directories; "
                         "make it like /tmp: chmod 1777 ",
                         shared_));
  EXPECT_FALSE(fs::exists(shared_ + "/job-1"));
}

TEST_F(SharedDirStorageTest, AJobDirectoryOfAnOlderVersionIsTightenedOneOfAnotherUserRefused) {
  ASSERT_TRUE(fs::create_directories(shared_ + "/job-1"));
  ASSERT_EQ(::chmod((shared_ + "/job-1").c_str(), 0755), 0);
  auto tightened =
      SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_, "", "job-1", 1, 0);
  ASSERT_TRUE(tightened.ok()) << tightened.status();
  EXPECT_EQ(ModeOf(shared_ + "/job-1"), 0700u);

  // A link another user put where the job's directory goes is refused.
  fs::create_directory_symlink("/etc", shared_ + "/job-2");
  auto linked =
      SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_, "", "job-2", 1, 0);
  EXPECT_EQ(linked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(linked.status().message(), HasSubstr("something other than a directory"));
  if (::geteuid() != 0) GTEST_SKIP() << "giving a directory to another user needs root";
  ASSERT_TRUE(fs::create_directories(shared_ + "/job-3"));
  ASSERT_EQ(::chown((shared_ + "/job-3").c_str(), 65534, 65534), 0);
  auto others =
      SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_, "", "job-3", 1, 0);
  EXPECT_EQ(others.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(others.status().message(),
              HasSubstr(absl::StrCat(shared_,
                                     "/job-3 belongs to uid 65534, not to uid 0 the job's ranks "
                                     "run as; another user made it")));
}

TEST_F(SharedDirStorageTest, LoadReadsTheCommittedDirectoryAndChecksIt) {
  auto storage =
      SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_, "", "job-000004", 1, 0);
  ASSERT_TRUE(storage.ok()) << storage.status();
  const std::string model = Pattern(300 << 10, 7);
  ASSERT_TRUE(
      (*storage)->Store(40, {Source(kModelFile, model), Source(kTrainStateFile, "state")}).ok());
  std::optional<v1::CheckpointManifest> manifest = coordinator_->Manifest(40);
  ASSERT_TRUE(manifest.has_value());
  EXPECT_EQ(manifest->directory(), shared_ + "/job-000004/40");
  absl::StatusOr<std::vector<CheckpointFileData>> loaded = (*storage)->Load(*manifest);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 2u);
  EXPECT_TRUE((*loaded)[0].bytes == model);
  EXPECT_EQ((*loaded)[1].bytes, "state");

  // A file changed after the commit is DATA_LOSS naming it.
  std::ofstream(manifest->directory() + "/train_state.pt", std::ios::trunc) << "STATE";
  absl::StatusOr<std::vector<CheckpointFileData>> damaged = (*storage)->Load(*manifest);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(damaged.status().message(),
              HasSubstr(manifest->directory() +
                        "/train_state.pt does not match its recorded size and checksum"));
  // So is a missing one.
  fs::remove(manifest->directory() + "/train_state.pt");
  absl::StatusOr<std::vector<CheckpointFileData>> missing = (*storage)->Load(*manifest);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(missing.status().message(),
              HasSubstr(manifest->directory() + "/train_state.pt: No such file"));
}

TEST_F(SharedDirStorageTest, LoadDownloadsWhenTheDirectoryIsNotVisibleHere) {
  auto storage =
      SharedDirCheckpointStorage::Create(coordinator_->channel(), shared_, "", "job-000004", 1, 0);
  ASSERT_TRUE(storage.ok()) << storage.status();
  ASSERT_TRUE((*storage)->Store(40, {Source(kModelFile, "weights")}).ok());
  std::optional<v1::CheckpointManifest> manifest = coordinator_->Manifest(40);
  ASSERT_TRUE(manifest.has_value());
  manifest->set_directory("/mnt/elsewhere/job-000004/40");  // another host's mount
  absl::StatusOr<std::vector<CheckpointFileData>> loaded = (*storage)->Load(*manifest);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 1u);
  EXPECT_EQ((*loaded)[0].bytes, "weights");
}

}  // namespace
}  // namespace chorus
