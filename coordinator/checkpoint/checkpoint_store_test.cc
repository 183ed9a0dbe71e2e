#include "coordinator/checkpoint/checkpoint_store.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sqlite3.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The chunks of one file, split every `chunk` bytes.
std::vector<v1::CheckpointChunk> Chunks(const std::string& name, const std::string& data,
                                        size_t chunk = 7) {
  std::vector<v1::CheckpointChunk> out;
  for (size_t offset = 0; offset < data.size() || out.empty(); offset += chunk) {
    v1::CheckpointChunk& c = out.emplace_back();
    c.set_file_name(name);
    c.set_offset(offset);
    c.set_data(data.substr(offset, chunk));
    c.set_chunk_crc32c(Crc32c(c.data()));
    if (offset + chunk >= data.size()) {
      c.set_last(true);
      c.set_file_size(data.size());
      c.set_file_crc32c(Crc32c(data));
    }
  }
  return out;
}

absl::StatusOr<v1::CheckpointManifest> Put(CheckpointStore& store, const std::string& job,
                                           int64_t step, int keep_last = 0) {
  auto upload = store.BeginUpload(job, step);
  if (!upload.ok()) return upload.status();
  for (const auto& file :
       {std::pair<std::string, std::string>{"model.pt", "weights of step " + std::to_string(step)},
        {"train_state.pt", "optimizer and sampler state"}}) {
    for (const v1::CheckpointChunk& c : Chunks(file.first, file.second)) {
      if (absl::Status s = (*upload)->AddChunk(c); !s.ok()) return s;
    }
  }
  v1::CheckpointManifest info;
  info.set_world_size(2);
  info.set_strategy("ddp");
  return (*upload)->Commit(info, keep_last);
}

// Path of `file` in the committed checkpoint `job`/`step`.
std::string FileOf(CheckpointStore& store, const std::string& job, int64_t step,
                   const std::string& file) {
  const auto all = store.List(job);
  for (const auto& m : *all) {
    if (m.step() == step) return store.FilePath(m, file);
  }
  return "";
}

std::vector<int64_t> Steps(CheckpointStore& store, const std::string& job) {
  std::vector<int64_t> steps;
  const auto all = store.List(job);  // the loop must not range over a temporary's value
  for (const auto& m : *all) steps.push_back(m.step());
  return steps;
}

TEST(CheckpointStoreTest, CommitListRetentionAndFindLoadable) {
  const std::string dir = TempDir("commit");
  auto state = StateStore::Open(dir);
  ASSERT_TRUE(state.ok()) << state.status();
  CheckpointStore store(dir + "/checkpoints", **state);
  ASSERT_TRUE(store.Recover().ok());
  auto m = Put(store, "job-000001", 100);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->files_size(), 2);
  EXPECT_EQ(m->files(0).name(), "model.pt");
  EXPECT_EQ(m->files(0).crc32c(), Crc32c("weights of step 100"));
  EXPECT_TRUE(m->files(0).sha256().empty()) << "manifests record CRC-32C";
  EXPECT_TRUE(m->directory().empty()) << "stored under the coordinator's own root";
  EXPECT_EQ(m->world_size(), 2);
  std::ifstream in(FileOf(store, "job-000001", 100, "model.pt"));
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "weights of step 100");
  EXPECT_EQ(Put(store, "job-000001", 100).status().code(), absl::StatusCode::kAlreadyExists);

  ASSERT_TRUE(Put(store, "job-000001", 200, /*keep_last=*/2).ok());
  ASSERT_TRUE(Put(store, "job-000001", 300, /*keep_last=*/2).ok());
  EXPECT_EQ(Steps(store, "job-000001"), (std::vector<int64_t>{200, 300}));
  store.WaitForRemovals();
  EXPECT_FALSE(std::filesystem::exists(dir + "/checkpoints/job-000001/000000000100"));

  std::vector<std::string> skipped;
  EXPECT_EQ(store.FindLoadable("job-000001", 0, &skipped)->step(), 300);
  EXPECT_EQ(store.FindLoadable("job-000001", 200, &skipped)->step(), 200);
  EXPECT_EQ(store.FindLoadable("job-000001", 250, &skipped).status().code(),
            absl::StatusCode::kNotFound);
  // A damaged newest checkpoint is skipped with a reason; the previous one loads.
  std::ofstream(FileOf(store, "job-000001", 300, "model.pt"), std::ios::app) << "garbage";
  auto loadable = store.FindLoadable("job-000001", 0, &skipped);
  ASSERT_TRUE(loadable.ok()) << loadable.status();
  EXPECT_EQ(loadable->step(), 200);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0], HasSubstr("step 300 is unusable: model.pt does not match"));
  std::filesystem::remove(FileOf(store, "job-000001", 200, "train_state.pt"));
  skipped.clear();
  EXPECT_EQ(store.FindLoadable("job-000001", 0, &skipped).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(skipped.size(), 2u);
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Note [Private files] in common/private_files.h: under umask 0, which
// would leave everything readable and writable by all, every job's
// checkpoints are the coordinator's user's only; a tree an older version
// left readable is tightened when the store starts.
TEST(CheckpointStoreTest, CheckpointsAreTheCoordinatorsUsersOnlyWhateverTheUmask) {
  const std::string dir = TempDir("modes");
  auto state = StateStore::Open(dir + "/state");
  ASSERT_TRUE(state.ok()) << state.status();
  const mode_t old_umask = ::umask(0);
  const std::string root = dir + "/checkpoint_dir";
  {
    CheckpointStore store(root, **state);
    ASSERT_TRUE(store.Recover().ok());
    ASSERT_TRUE(Put(store, "job-000001", 100).ok());
  }
  const std::string step = root + "/job-000001/000000000100";
  for (const std::string& d : {root, root + "/job-000001", step}) EXPECT_EQ(ModeOf(d), 0700u) << d;
  for (const char* f : {"model.pt", "train_state.pt", "MANIFEST"}) {
    EXPECT_EQ(ModeOf(step + "/" + f), 0600u) << f;
  }
  for (const std::string& d : {root, root + "/job-000001", step}) ::chmod(d.c_str(), 0755);
  ::chmod((step + "/model.pt").c_str(), 0644);
  {
    CheckpointStore store(root, **state);
    ASSERT_TRUE(store.Recover().ok());
  }
  ::umask(old_umask);
  for (const std::string& d : {root, root + "/job-000001", step}) EXPECT_EQ(ModeOf(d), 0700u) << d;
  EXPECT_EQ(ModeOf(step + "/model.pt"), 0600u);
}

TEST(CheckpointStoreTest, CorruptChunksBadNamesAndUnfinishedUploadsAreRefused) {
  const std::string dir = TempDir("refuse");
  auto state = StateStore::Open(dir);
  CheckpointStore store(dir + "/checkpoints", **state);
  ASSERT_TRUE(store.Recover().ok());
  auto upload = store.BeginUpload("job-000002", 5);
  ASSERT_TRUE(upload.ok());
  std::vector<v1::CheckpointChunk> chunks = Chunks("model.pt", "0123456789abcdefghij");
  chunks[1].set_data("XXXXXXX");  // flipped in transit; its CRC-32C no longer matches
  ASSERT_TRUE((*upload)->AddChunk(chunks[0]).ok());
  absl::Status bad = (*upload)->AddChunk(chunks[1]);
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.message(),
              HasSubstr("model.pt: the chunk at offset 7 does not match its CRC-32C"));
  upload->reset();
  EXPECT_TRUE(Steps(store, "job-000002").empty());
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir + "/checkpoints/job-000002"),
                          std::filesystem::directory_iterator()),
            0)
      << "an abandoned upload leaves nothing behind";

  auto wrong_total = store.BeginUpload("job-000002", 6);
  std::vector<v1::CheckpointChunk> c = Chunks("model.pt", "abc");
  c.back().set_file_crc32c(Crc32c("abd"));
  EXPECT_EQ((*wrong_total)->AddChunk(c.back()).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store.BeginUpload("../etc", 1).status().code(), absl::StatusCode::kInvalidArgument);
  auto names = store.BeginUpload("job-000002", 7);
  EXPECT_EQ((*names)->AddChunk(Chunks("../x", "a")[0]).code(), absl::StatusCode::kInvalidArgument);
  auto unfinished = store.BeginUpload("job-000002", 8);
  ASSERT_TRUE((*unfinished)->AddChunk(Chunks("model.pt", "0123456789abcdefghij")[0]).ok());
  EXPECT_THAT((*unfinished)->Commit({}, 0).status().message(),
              HasSubstr("model.pt was not finished"));
}

// A process that commits a checkpoint and dies at `stage`; afterwards the
// store, reopened and recovered, lists only complete checkpoints and the
// newest complete one loads.
TEST(CheckpointStoreTest, CrashAtEveryStageOfTheCommitLeavesOnlyCompleteCheckpoints) {
  for (CheckpointStore::Stage stage :
       {CheckpointStore::Stage::kMidChunk, CheckpointStore::Stage::kBeforeFsync,
        CheckpointStore::Stage::kBeforeRename, CheckpointStore::Stage::kBeforeManifest,
        CheckpointStore::Stage::kAfterManifest}) {
    SCOPED_TRACE(CheckpointStore::StageName(stage));
    const std::string dir = TempDir(std::string("crash_") + CheckpointStore::StageName(stage));
    {
      auto state = StateStore::Open(dir);
      CheckpointStore store(dir + "/checkpoints", **state);
      ASSERT_TRUE(store.Recover().ok());
      ASSERT_TRUE(Put(store, "job-000003", 10).ok());
    }
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto state = StateStore::Open(dir);
      CheckpointStore store(dir + "/checkpoints", **state, [stage](CheckpointStore::Stage at) {
        if (at == stage) _exit(42);  // as abrupt as kill -9: no destructors, no flush
      });
      (void)Put(store, "job-000003", 20);
      _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 42) << "the failpoint was reached";

    auto state = StateStore::Open(dir);
    CheckpointStore store(dir + "/checkpoints", **state);
    ASSERT_TRUE(store.Recover().ok());
    const bool committed = stage == CheckpointStore::Stage::kAfterManifest;
    const std::vector<int64_t> expected =
        committed ? std::vector<int64_t>{10, 20} : std::vector<int64_t>{10};
    EXPECT_EQ(Steps(store, "job-000003"), expected);
    std::vector<std::string> skipped;
    auto newest = store.FindLoadable("job-000003", 0, &skipped);
    ASSERT_TRUE(newest.ok()) << newest.status();
    EXPECT_EQ(newest->step(), committed ? 20 : 10);
    EXPECT_TRUE(skipped.empty());
    int entries = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir + "/checkpoints/job-000003")) {
      EXPECT_FALSE(e.path().filename().string().rfind(".staging", 0) == 0) << e.path();
      ++entries;
    }
    EXPECT_EQ(entries, committed ? 2 : 1) << "recovery removed the half-written checkpoint";
  }
}

// Runs `sql` on the state database in `dir` through a connection of its own
// (how a test makes the store's next write fail: a trigger that refuses it).
void ExecOnDatabase(const std::string& dir, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/chorus.db").c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << (error ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

// The manifest row is the commit point. A commit whose manifest write fails
// has renamed its directory into place already; a retry of that upload (the
// failure is UNAVAILABLE, which ranks retry) must not be told the step is
// ALREADY_EXISTS — it would count as stored while no manifest names it, and
// the next start deletes the directory. The retry commits it for real.
TEST(CheckpointStoreTest, ARetryAfterAFailedManifestWriteCommitsInsteadOfReportingItExists) {
  const std::string dir = TempDir("manifest_write_fails");
  auto state = StateStore::Open(dir);
  ASSERT_TRUE(state.ok()) << state.status();
  CheckpointStore store(dir + "/checkpoints", **state);
  ASSERT_TRUE(store.Recover().ok());
  ExecOnDatabase(dir,
                 "CREATE TRIGGER refuse BEFORE INSERT ON checkpoints "
                 "BEGIN SELECT RAISE(ABORT, 'disk I/O error (injected)'); END;");
  absl::StatusOr<v1::CheckpointManifest> first = Put(store, "job-000005", 30);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), absl::StatusCode::kUnavailable) << first.status();
  EXPECT_THAT(first.status().message(), HasSubstr("disk I/O error (injected)"));
  EXPECT_TRUE(Steps(store, "job-000005").empty());

  ExecOnDatabase(dir, "DROP TRIGGER refuse;");
  absl::StatusOr<v1::CheckpointManifest> retry = Put(store, "job-000005", 30);
  ASSERT_TRUE(retry.ok()) << retry.status() << " (a step without a manifest is not committed)";
  EXPECT_EQ(Steps(store, "job-000005"), std::vector<int64_t>{30});
  EXPECT_EQ(Put(store, "job-000005", 30).status().code(), absl::StatusCode::kAlreadyExists)
      << "once the manifest is durable, the step exists";

  // The next start keeps it, and it loads.
  CheckpointStore restarted(dir + "/checkpoints", **state);
  ASSERT_TRUE(restarted.Recover().ok());
  std::vector<std::string> skipped;
  absl::StatusOr<v1::CheckpointManifest> loaded =
      restarted.FindLoadable("job-000005", 30, &skipped);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(skipped.empty());
  std::ifstream in(FileOf(restarted, "job-000005", 30, "model.pt"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "weights of step 30");
}

// What a rank does for storage SHARED_DIR: its files in a staging directory
// under <shared>/<job>/; returns the request's file list.
std::vector<v1::CheckpointFile> Stage(
    const std::string& shared, const std::string& job, const std::string& staging,
    const std::vector<std::pair<std::string, std::string>>& files) {
  const std::string dir = shared + "/" + job + "/" + staging;
  std::filesystem::create_directories(dir);
  std::vector<v1::CheckpointFile> out;
  for (const auto& [name, data] : files) {
    std::ofstream(dir + "/" + name, std::ios::binary) << data;
    v1::CheckpointFile& f = out.emplace_back();
    f.set_name(name);
    f.set_size(static_cast<int64_t>(data.size()));
    f.set_crc32c(Crc32c(data));
  }
  return out;
}

absl::StatusOr<v1::CheckpointManifest> PutShared(CheckpointStore& store, const std::string& shared,
                                                 const std::string& job, int64_t step,
                                                 int keep_last = 0) {
  const std::string staging = ".staging-" + std::to_string(step) + "-r0-1-0";
  auto files = Stage(shared, job, staging,
                     {{"model.pt", "weights of step " + std::to_string(step)},
                      {"train_state.pt", "optimizer state"}});
  auto upload = store.AdoptStaged(shared, job, step, staging, files);
  if (!upload.ok()) return upload.status();
  v1::CheckpointManifest info;
  info.set_world_size(1);
  info.set_strategy("ddp");
  return (*upload)->Commit(info, keep_last);
}

TEST(CheckpointStoreTest, SharedDirCommitChecksFilesAndRecordsTheDirectory) {
  const std::string dir = TempDir("shared");
  const std::string shared = dir + "/nfs";
  auto state = StateStore::Open(dir);
  CheckpointStore store(dir + "/checkpoints", **state);
  ASSERT_TRUE(store.Recover().ok());
  auto m = PutShared(store, shared, "job-000007", 10);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->directory(), shared + "/job-000007/000000000010");
  ASSERT_EQ(m->files_size(), 2);
  EXPECT_EQ(m->files(0).crc32c(), Crc32c("weights of step 10"));
  EXPECT_TRUE(m->files(0).sha256().empty());
  EXPECT_EQ(store.FilePath(*m, "model.pt"), shared + "/job-000007/000000000010/model.pt");
  EXPECT_FALSE(std::filesystem::exists(shared + "/job-000007/.staging-10-r0-1-0"))
      << "renamed into place";
  EXPECT_FALSE(std::filesystem::exists(dir + "/checkpoints/job-000007"))
      << "nothing under the coordinator's root";
  EXPECT_EQ(PutShared(store, shared, "job-000007", 10).status().code(),
            absl::StatusCode::kAlreadyExists);

  // Retention deletes in the shared directory; a damaged file is found by its CRC-32C.
  ASSERT_TRUE(PutShared(store, shared, "job-000007", 20, /*keep_last=*/2).ok());
  ASSERT_TRUE(PutShared(store, shared, "job-000007", 30, /*keep_last=*/2).ok());
  EXPECT_EQ(Steps(store, "job-000007"), (std::vector<int64_t>{20, 30}));
  store.WaitForRemovals();
  EXPECT_FALSE(std::filesystem::exists(shared + "/job-000007/000000000010"));
  std::vector<std::string> skipped;
  EXPECT_EQ(store.FindLoadable("job-000007", 0, &skipped)->step(), 30);
  {
    std::fstream f(FileOf(store, "job-000007", 30, "model.pt"),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put('X');  // same size, other bytes
  }
  auto loadable = store.FindLoadable("job-000007", 0, &skipped);
  ASSERT_TRUE(loadable.ok()) << loadable.status();
  EXPECT_EQ(loadable->step(), 20);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0], HasSubstr("model.pt does not match its recorded size and CRC-32C"));
}

// A shared_dir given with a trailing slash once had its committed steps
// deleted by the next start: the manifest said "dir//job/step", recovery
// compared "dir/job/step".
TEST(CheckpointStoreTest, RestartKeepsSharedCheckpointsWhateverTheirDirectorysSpelling) {
  const std::string dir = TempDir("shared_slash");
  const std::string shared = dir + "/nfs";
  {
    auto state = StateStore::Open(dir);
    CheckpointStore store(dir + "/checkpoints", **state);
    ASSERT_TRUE(store.Recover().ok());
    auto m = PutShared(store, shared + "/", "job-000001", 30);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->directory(), shared + "/job-000001/000000000030") << "stored in one form";
    ASSERT_TRUE(PutShared(store, shared + "/./", "job-000001", 90).ok());
    // A manifest recorded before directories were normalized.
    Stage(shared, "job-000001", "000000000120", {{"model.pt", "w"}});
    v1::CheckpointManifest legacy = *m;
    legacy.set_step(120);
    legacy.set_directory(shared + "//job-000001/000000000120");
    ASSERT_TRUE((*state)->SaveManifest(legacy).ok());
  }
  for (const std::string& root : {shared + "/", shared, shared + "//"}) {
    SCOPED_TRACE(root);
    auto state = StateStore::Open(dir);
    CheckpointStore store(dir + "/checkpoints", **state);
    ASSERT_TRUE(store.Recover({{root, "job-000001"}}, absl::ZeroDuration()).ok());
    EXPECT_EQ(Steps(store, "job-000001"), (std::vector<int64_t>{30, 90, 120}));
    for (const char* step : {"000000000030", "000000000090", "000000000120"}) {
      EXPECT_TRUE(std::filesystem::exists(shared + "/job-000001/" + step)) << step;
    }
  }
}

// Pages of `path` in the page cache, or -1 when that cannot be told.
int ResidentPages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size == 0) {
    ::close(fd);
    return -1;
  }
  void* map = ::mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return -1;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((st.st_size + page - 1) / page);
  int resident = -1;
  if (::mincore(map, st.st_size, in_core.data()) == 0) {
    resident = 0;
    for (unsigned char c : in_core) resident += c & 1;
  }
  ::munmap(map, st.st_size);
  return resident;
}

TEST(CheckpointStoreTest, CommittedFilesLeaveThePageCache) {
  const std::string dir = TempDir("page_cache");
  struct statfs fs;
  ASSERT_EQ(::statfs(dir.c_str(), &fs), 0);
  if (fs.f_type == TMPFS_MAGIC)
    GTEST_SKIP() << dir << " is on tmpfs, whose pages cannot be dropped";
  const std::string shared = dir + "/nfs";
  auto state = StateStore::Open(dir);
  CheckpointStore store(dir + "/checkpoints", **state);
  ASSERT_TRUE(store.Recover().ok());
  const std::string data(4 << 20, 'w');

  // Uploaded: dropped after the fsync.
  auto upload = store.BeginUpload("job-000003", 10);
  ASSERT_TRUE(upload.ok()) << upload.status();
  for (const v1::CheckpointChunk& c : Chunks("model.pt", data, 1 << 20))
    ASSERT_TRUE((*upload)->AddChunk(c).ok());
  v1::CheckpointManifest info;
  info.set_world_size(1);
  auto m = (*upload)->Commit(info, 0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(ResidentPages(store.FilePath(*m, "model.pt")), 0);

  // Shared directory: the rank's file is read back to check it, then dropped.
  // (Another step: a job's step is committed once, whatever its storage.)
  const std::string staging = ".staging-20-r0-1-0";
  auto files = Stage(shared, "job-000003", staging, {{"model.pt", data}});
  ASSERT_GT(ResidentPages(shared + "/job-000003/" + staging + "/model.pt"), 0) << "just written";
  {  // the rank fsyncs before it asks for the commit
    const int fd =
        ::open((shared + "/job-000003/" + staging + "/model.pt").c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::fsync(fd), 0);
    ::close(fd);
  }
  auto adopted = store.AdoptStaged(shared, "job-000003", 20, staging, files);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  m = (*adopted)->Commit(info, 0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(ResidentPages(store.FilePath(*m, "model.pt")), 0);
  // Still readable, from the disk.
  std::ifstream in(store.FilePath(*m, "model.pt"), std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), data);
}

TEST(CheckpointStoreTest, SharedDirRefusesBadNamesWrongFilesAndDirectoriesItCannotSee) {
  const std::string dir = TempDir("shared_refuse");
  const std::string shared = dir + "/nfs";
  auto state = StateStore::Open(dir);
  CheckpointStore store(dir + "/checkpoints", **state);
  ASSERT_TRUE(store.Recover().ok());
  auto files = Stage(shared, "job-000008", ".staging-5-r0-1-0", {{"model.pt", "0123456789"}});
  for (const char* bad : {"../job-000009", "staging-5", ".staging-5/..", ".staging-", "."}) {
    SCOPED_TRACE(bad);
    auto upload = store.AdoptStaged(shared, "job-000008", 5, bad, files);
    EXPECT_EQ(upload.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(store.AdoptStaged("relative/dir", "job-000008", 5, ".staging-5-r0-1-0", files)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.AdoptStaged(shared, "../x", 5, ".staging-5-r0-1-0", files).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto missing = store.AdoptStaged(shared, "job-000008", 5, ".staging-5-r0-9-0", files);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(), HasSubstr("the coordinator cannot see"));

  std::vector<v1::CheckpointFile> wrong = files;
  wrong[0].set_crc32c(Crc32c("0123456788"));
  auto damaged = store.AdoptStaged(shared, "job-000008", 5, ".staging-5-r0-1-0", wrong);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(damaged.status().message(), HasSubstr(".staging-5-r0-1-0/model.pt holds 10 bytes"));
  EXPECT_TRUE(std::filesystem::exists(shared + "/job-000008/.staging-5-r0-1-0/model.pt"))
      << "a refused directory is left to the rank that wrote it";

  std::vector<v1::CheckpointFile> unlisted =
      Stage(shared, "job-000008", ".staging-6-r0-1-0", {{"model.pt", "a"}, {"extra.bin", "b"}});
  unlisted.pop_back();
  EXPECT_THAT(
      store.AdoptStaged(shared, "job-000008", 6, ".staging-6-r0-1-0", unlisted).status().message(),
      HasSubstr("extra.bin is in the staging directory but not in the request"));
  std::vector<v1::CheckpointFile> absent = files;
  absent[0].set_name("other.pt");
  EXPECT_EQ(store.AdoptStaged(shared, "job-000008", 5, ".staging-5-r0-1-0", absent).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Adopted and dropped without a commit: the directory goes.
  {
    auto adopted = store.AdoptStaged(shared, "job-000008", 5, ".staging-5-r0-1-0", files);
    ASSERT_TRUE(adopted.ok()) << adopted.status();
  }
  EXPECT_FALSE(std::filesystem::exists(shared + "/job-000008/.staging-5-r0-1-0"));
  EXPECT_TRUE(Steps(store, "job-000008").empty());
}

TEST(CheckpointStoreTest, SharedDirCrashAtEveryStageLeavesOnlyCompleteCheckpoints) {
  for (CheckpointStore::Stage stage :
       {CheckpointStore::Stage::kBeforeFsync, CheckpointStore::Stage::kBeforeRename,
        CheckpointStore::Stage::kBeforeManifest, CheckpointStore::Stage::kAfterManifest}) {
    SCOPED_TRACE(CheckpointStore::StageName(stage));
    const std::string dir =
        TempDir(std::string("shared_crash_") + CheckpointStore::StageName(stage));
    const std::string shared = dir + "/nfs";
    {
      auto state = StateStore::Open(dir);
      CheckpointStore store(dir + "/checkpoints", **state);
      ASSERT_TRUE(store.Recover().ok());
      ASSERT_TRUE(PutShared(store, shared, "job-000004", 10).ok());
    }
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto state = StateStore::Open(dir);
      CheckpointStore store(dir + "/checkpoints", **state, [stage](CheckpointStore::Stage at) {
        if (at == stage) _exit(42);
      });
      (void)PutShared(store, shared, "job-000004", 20);
      _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    // The files of a shared-directory upload were checked and fsynced by
    // the rank: there is no per-file fsync stage on the coordinator.
    const bool reached = stage != CheckpointStore::Stage::kBeforeFsync;
    ASSERT_EQ(WEXITSTATUS(status), reached ? 42 : 0);
    if (!reached) continue;

    // A staging directory some rank is still writing stays; a stale one goes.
    Stage(shared, "job-000004", ".staging-30-r1-7-0", {{"model.pt", "being written"}});
    auto state = StateStore::Open(dir);
    CheckpointStore store(dir + "/checkpoints", **state);
    ASSERT_TRUE(store.Recover({{shared, "job-000004"}}).ok());
    const bool committed = stage == CheckpointStore::Stage::kAfterManifest;
    EXPECT_EQ(Steps(store, "job-000004"),
              committed ? std::vector<int64_t>({10, 20}) : std::vector<int64_t>({10}));
    std::vector<std::string> skipped;
    auto newest = store.FindLoadable("job-000004", 0, &skipped);
    ASSERT_TRUE(newest.ok()) << newest.status();
    EXPECT_EQ(newest->step(), committed ? 20 : 10);
    EXPECT_EQ(std::filesystem::exists(shared + "/job-000004/000000000020"), committed)
        << "a renamed but uncommitted step directory is removed";
    EXPECT_TRUE(std::filesystem::exists(shared + "/job-000004/.staging-30-r1-7-0"));
    ASSERT_TRUE(store.Recover({{shared, "job-000004"}}, absl::ZeroDuration()).ok());
    EXPECT_FALSE(std::filesystem::exists(shared + "/job-000004/.staging-30-r1-7-0"));
    EXPECT_FALSE(std::filesystem::exists(shared + "/job-000004/.staging-20-r0-1-0"));
    EXPECT_EQ(Steps(store, "job-000004").size(), committed ? 2u : 1u)
        << "recovery keeps committed checkpoints";
  }
}

}  // namespace
}  // namespace chorus
