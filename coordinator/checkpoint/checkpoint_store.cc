#include "coordinator/checkpoint/checkpoint_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/paths.h"
#include "common/private_files.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace chorus {
namespace {

namespace fs = std::filesystem;

constexpr char kManifestFile[] = "MANIFEST";
constexpr char kStagingPrefix[] = ".staging-";

// Job ids and file names become path components: no separators, no dots
// that could climb out.
bool SafeName(const std::string& name) {
  if (name.empty() || name.size() > 128 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

// The MANIFEST file beside a checkpoint's files, mode 0600 (Note [Private
// files]). Best effort: the state store's row is the commit (Note [Manifest
// is the commit]); the file is a copy for people reading the directory.
void WriteManifestFile(const std::string& path, const v1::CheckpointManifest& manifest) {
  const int fd = OpenPrivateFile(path, O_WRONLY | O_TRUNC);
  if (fd < 0) {
    LOG(WARNING) << "checkpoint: cannot write " << path << ": " << std::strerror(errno);
    return;
  }
  const std::string bytes = manifest.SerializeAsString();
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      LOG(WARNING) << "checkpoint: cannot write " << path << ": " << std::strerror(errno);
      break;
    }
    done += static_cast<size_t>(w);
  }
  ::close(fd);
}

// Reads `path` whole; its size and CRC-32C, and its SHA-256 when `sha256`.
// With `drop_cache` the file's pages leave the page cache afterwards (see
// DropCachedPages).
struct FileSums {
  int64_t size = 0;
  uint32_t crc32c = 0;
  std::string sha256;
};
absl::StatusOr<FileSums> SumFile(const std::string& path, bool sha256, bool drop_cache) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " is missing"));
    return absl::DataLossError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  FileSums sums;
  std::unique_ptr<Sha256> h = sha256 ? std::make_unique<Sha256>() : nullptr;
  std::string buffer(4 << 20, '\0');
  absl::Status status;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status =
          absl::DataLossError(absl::StrCat("reading ", path, " failed: ", std::strerror(errno)));
      break;
    }
    if (n == 0) break;
    const absl::string_view data(buffer.data(), static_cast<size_t>(n));
    if (h != nullptr) h->Update(data);
    sums.crc32c = Crc32cExtend(sums.crc32c, data);
    sums.size += n;
  }
  if (drop_cache) DropCachedPages(fd);
  ::close(fd);
  if (!status.ok()) return status;
  if (h != nullptr) sums.sha256 = h->HexDigest();
  return sums;
}

// Empty when the stored file matches what the manifest recorded: size, and
// SHA-256 where recorded, else CRC-32C.
std::string CheckStoredFile(const std::string& path, const v1::CheckpointFile& f) {
  const bool by_sha = !f.sha256().empty();
  absl::StatusOr<FileSums> sums = SumFile(path, by_sha, /*drop_cache=*/false);
  if (!sums.ok()) return std::string(sums.status().message());
  if (sums->size != f.size() ||
      (by_sha ? sums->sha256 != f.sha256() : sums->crc32c != f.crc32c())) {
    return absl::StrCat(f.name(), " does not match its recorded size and ",
                        by_sha ? "SHA-256" : "CRC-32C");
  }
  return "";
}

// A step directory's name: 12 digits.
bool StepDirName(const std::string& name) {
  return name.size() == 12 &&
         std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The newest modification time of `dir` and the entries in it.
fs::file_time_type NewestWrite(const fs::path& dir) {
  std::error_code ec;
  fs::file_time_type newest = fs::last_write_time(dir, ec);
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const fs::file_time_type t = fs::last_write_time(e.path(), ec);
    if (!ec && t > newest) newest = t;
  }
  return newest;
}

// AdoptStaged's arguments, before it looks at the disk.
absl::Status CheckAdoptRequest(const std::string& shared_root, const std::string& job_id,
                               int64_t step, const std::string& staging_dir,
                               const std::vector<v1::CheckpointFile>& files) {
  if (!SafeName(job_id))
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: bad job id \"", job_id, "\""));
  if (step < 0)
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: step must be >= 0, got ", step));
  if (shared_root.empty() || shared_root[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint: shared directory \"", shared_root, "\" is not absolute"));
  }
  // One component: what follows the prefix must be a safe name.
  if (!absl::StartsWith(staging_dir, kStagingPrefix) ||
      !SafeName(staging_dir.substr(std::strlen(kStagingPrefix)))) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint: bad staging directory \"", staging_dir,
                     "\" (one path component starting with .staging-)"));
  }
  if (files.empty()) return absl::InvalidArgumentError("checkpoint: no files were written");
  return absl::OkStatus();
}

// The request lists each file once, under a safe name, and the staging
// directory holds nothing else.
absl::Status CheckStagedNames(const std::string& staging,
                              const std::vector<v1::CheckpointFile>& files) {
  std::set<std::string> names;
  for (const v1::CheckpointFile& f : files) {
    if (!SafeName(f.name()) || f.name() == kManifestFile) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: bad file name \"", f.name(), "\""));
    }
    if (!names.insert(f.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: file ", f.name(), " listed twice"));
    }
  }
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(staging, ec)) {
    if (!names.count(e.path().filename().string())) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: ", e.path().string(),
                       " is in the staging directory but not in the request"));
    }
  }
  return absl::OkStatus();
}

// Reads back every staged file and checks its size and CRC-32C against what
// the rank wrote; the files as the coordinator found them. DATA_LOSS names
// the first file that differs or could not be read. Up to 4 files are read
// at a time (page cache reads plus CRC-32C run at one core's speed each).
absl::StatusOr<std::vector<v1::CheckpointFile>> ChecksumStaged(
    const std::string& staging, const std::vector<v1::CheckpointFile>& files) {
  constexpr size_t kParallel = 4;
  std::vector<std::future<absl::StatusOr<FileSums>>> summing(files.size());
  auto start_summing = [&](size_t i) {
    if (i < files.size()) {
      summing[i] =
          std::async(std::launch::async, SumFile, staging + "/" + files[i].name(), /*sha256=*/false,
                     /*drop_cache=*/true);
    }
  };
  for (size_t i = 0; i < kParallel; ++i) start_summing(i);
  std::vector<v1::CheckpointFile> checked;
  for (size_t i = 0; i < files.size(); ++i) {
    const v1::CheckpointFile& f = files[i];
    absl::StatusOr<FileSums> sums = summing[i].get();
    start_summing(i + kParallel);
    if (!sums.ok())
      return absl::DataLossError(absl::StrCat("checkpoint: ", sums.status().message()));
    if (sums->size != f.size() || sums->crc32c != f.crc32c()) {
      return absl::DataLossError(absl::StrFormat(
          "checkpoint: %s/%s holds %d bytes with CRC-32C %08x; the rank wrote %d bytes with %08x",
          staging, f.name(), sums->size, sums->crc32c, f.size(), f.crc32c()));
    }
    v1::CheckpointFile& c = checked.emplace_back();
    c.set_name(f.name());
    c.set_size(sums->size);
    c.set_crc32c(sums->crc32c);
  }
  return checked;
}

}  // namespace

const char* CheckpointStore::StageName(Stage stage) {
  switch (stage) {
    case Stage::kMidChunk:
      return "mid_chunk";
    case Stage::kBeforeFsync:
      return "before_fsync";
    case Stage::kBeforeRename:
      return "before_rename";
    case Stage::kBeforeManifest:
      return "before_manifest";
    case Stage::kAfterManifest:
      return "after_manifest";
  }
  return "unknown";
}

CheckpointStore::CheckpointStore(std::string root, StateStore& state, Failpoint failpoint)
    : root_(std::move(root)), state_(state), failpoint_(std::move(failpoint)) {}

CheckpointStore::~CheckpointStore() {
  {
    absl::MutexLock lock(&removal_mu_);
    stopping_ = true;
  }
  if (remover_.joinable()) remover_.join();
}

void CheckpointStore::RemoveLater(std::string dir) {
  absl::MutexLock lock(&removal_mu_);
  removals_.push_back(std::move(dir));
  if (!remover_.joinable()) remover_ = std::thread([this] { RemoveLoop(); });
}

void CheckpointStore::RemoveLoop() {
  absl::MutexLock lock(&removal_mu_);
  while (true) {
    removal_mu_.Await(absl::Condition(
        +[](CheckpointStore* s)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->stopping_ || !s->removals_.empty(); },
        this));
    if (removals_.empty()) return;  // stopping, and nothing left
    const std::string dir = std::move(removals_.front());
    removals_.pop_front();
    removing_ = true;
    removal_mu_.Unlock();
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (ec) LOG(WARNING) << "checkpoint retention: cannot remove " << dir << ": " << ec.message();
    removal_mu_.Lock();
    removing_ = false;
  }
}

void CheckpointStore::WaitForRemovals() {
  absl::MutexLock lock(&removal_mu_);
  removal_mu_.Await(absl::Condition(
      +[](CheckpointStore* s)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->removals_.empty() && !s->removing_; },
      this));
}

// Note [Manifest is the commit]
// A checkpoint exists once its manifest row is in the state database, not
// when its directory is in place: Commit renames the directory first, and
// the manifest write after it can fail (the database is UNAVAILABLE, which
// ranks retry). The directory such a commit leaves is not a checkpoint —
// List and FindLoadable do not see it, and Recover deletes it at the next
// start — so a retry of that step must not be told ALREADY_EXISTS (a rank
// would count the checkpoint as stored): BeginUpload, AdoptStaged and Commit
// ask the database, and Commit replaces the directory. Only one commit runs
// at a time (mu_), so a directory without a row seen there is such a
// leftover, not a commit in progress.
absl::Status CheckpointStore::CheckNotCommitted(const std::string& job_id, int64_t step) {
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointManifest> committed, state_.LoadManifests(job_id));
  for (const v1::CheckpointManifest& m : committed) {
    if (m.step() == step) {
      return absl::AlreadyExistsError(
          absl::StrCat("checkpoint ", job_id, " step ", step, " is already committed"));
    }
  }
  return absl::OkStatus();
}

std::string CheckpointStore::StepDir(const std::string& job_id, int64_t step) const {
  return absl::StrFormat("%s/%s/%012d", root_, job_id, step);
}

std::string CheckpointStore::DirOf(const v1::CheckpointManifest& manifest) const {
  return manifest.directory().empty() ? StepDir(manifest.job_id(), manifest.step())
                                      : manifest.directory();
}

std::string CheckpointStore::FilePath(const v1::CheckpointManifest& manifest,
                                      const std::string& file) const {
  return DirOf(manifest) + "/" + file;
}

absl::Status CheckpointStore::Recover(const std::vector<SharedJob>& shared,
                                      absl::Duration stale_after) {
  std::error_code ec;
  // Note [Private files] in common/private_files.h: every job's model and
  // optimizer state; a tree an older version left with the umask's modes
  // is tightened here.
  RETURN_IF_ERROR(MakePrivateDirectory(root_, "checkpoint directory"));
  TightenPrivateTree(root_, "checkpoint directory");
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointManifest> manifests, state_.LoadManifests(""));
  // Both sides in one form (Note [Paths in one form] in
  // common/job_spec_validation.cc): manifests written before paths were
  // normalized hold "dir//job/step" for a shared_dir given as "dir/".
  std::set<std::string> committed;
  for (const v1::CheckpointManifest& m : manifests) committed.insert(NormalPath(DirOf(m)));
  auto is_committed = [&committed](const fs::path& path) {
    return committed.count(NormalPath(path.string())) > 0;
  };
  int removed = 0;
  for (const fs::directory_entry& job : fs::directory_iterator(root_, ec)) {
    if (!job.is_directory()) continue;
    for (const fs::directory_entry& entry : fs::directory_iterator(job.path(), ec)) {
      const bool staging = absl::StartsWith(entry.path().filename().string(), kStagingPrefix);
      if (staging || (entry.is_directory() && !is_committed(entry.path()))) {
        fs::remove_all(entry.path(), ec);
        ++removed;
      }
    }
  }
  if (removed > 0)
    LOG(WARNING) << "checkpoints: removed " << removed << " incomplete checkpoint(s) under "
                 << root_;
  // Shared directories hold other things too: only step directories and
  // staging directories of the named jobs are touched. A staging directory
  // may still be being written by a rank that outlived this coordinator, so
  // only one left alone for `stale_after` goes.
  const fs::file_time_type stale_before =
      fs::file_time_type::clock::now() -
      std::chrono::microseconds(absl::ToInt64Microseconds(stale_after));
  for (const SharedJob& job : shared) {
    if (!SafeName(job.job_id) || job.root.empty() || job.root[0] != '/') continue;
    const fs::path dir = fs::path(NormalPath(job.root)) / job.job_id;
    int cleaned = 0;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      const bool stale_staging =
          absl::StartsWith(name, kStagingPrefix) && NewestWrite(entry.path()) < stale_before;
      const bool orphan_step = StepDirName(name) && !is_committed(entry.path());
      if (entry.is_directory() && (stale_staging || orphan_step)) {
        fs::remove_all(entry.path(), ec);
        ++cleaned;
      }
    }
    if (cleaned > 0)
      LOG(WARNING) << "checkpoints: removed " << cleaned << " incomplete checkpoint(s) under "
                   << dir.string();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CheckpointStore::Upload>> CheckpointStore::BeginUpload(
    const std::string& job_id, int64_t step) {
  if (!SafeName(job_id))
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: bad job id \"", job_id, "\""));
  if (step < 0)
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: step must be >= 0, got ", step));
  RETURN_IF_ERROR(CheckNotCommitted(job_id, step));
  int64_t n;
  {
    absl::MutexLock lock(&mu_);
    n = next_staging_++;
  }
  const std::string job_dir = absl::StrCat(root_, "/", job_id);
  const std::string staging =
      absl::StrCat(job_dir, "/", kStagingPrefix, step, "-", getpid(), "-", n);
  // Note [Private files]: 0700 directories, 0600 files, whatever the umask.
  absl::Status made = MakePrivateDirectory(job_dir, "checkpoint directory");
  if (!made.ok()) return absl::InternalError(absl::StrCat("checkpoint: ", made.message()));
  if (::mkdir(staging.c_str(), S_IRWXU) != 0)
    return absl::InternalError(
        absl::StrCat("checkpoint: cannot create ", staging, ": ", std::strerror(errno)));
  return std::unique_ptr<Upload>(new Upload(*this, root_, /*shared=*/false, job_id, step, staging));
}

absl::StatusOr<std::unique_ptr<CheckpointStore::Upload>> CheckpointStore::AdoptStaged(
    const std::string& shared_root, const std::string& job_id, int64_t step,
    const std::string& staging_dir, const std::vector<v1::CheckpointFile>& files) {
  RETURN_IF_ERROR(CheckAdoptRequest(shared_root, job_id, step, staging_dir, files));
  const std::string root = NormalPath(shared_root);  // Note [Paths in one form]
  const std::string job_dir = absl::StrCat(root, "/", job_id);
  const std::string staging = absl::StrCat(job_dir, "/", staging_dir);
  std::error_code ec;
  if (!fs::is_directory(staging, ec) && ec == std::errc::permission_denied) {
    // Note [A shared checkpoint directory] in checkpoint/shared_dir_storage.cc.
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint: the coordinator (uid ", ::geteuid(), ") may not read ", staging,
        ", which the job's ranks keep private to their user; run the coordinator as root or as "
        "the user the ranks run as, so that it can check and serve SHARED_DIR checkpoints"));
  }
  if (!fs::is_directory(staging, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint: the coordinator cannot see ", staging,
                     " (checkpoint.shared_dir must be a directory every node, the coordinator's "
                     "included, mounts at the same path)"));
  }
  RETURN_IF_ERROR(CheckNotCommitted(job_id, step));
  RETURN_IF_ERROR(CheckStagedNames(staging, files));
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointFile> checked, ChecksumStaged(staging, files));
  auto upload =
      std::unique_ptr<Upload>(new Upload(*this, root, /*shared=*/true, job_id, step, staging));
  upload->files_ = std::move(checked);
  upload->checking_ = absl::Now() - start;
  return upload;
}

CheckpointStore::Upload::~Upload() {
  if (file_ != nullptr) std::fclose(file_);
  for (std::future<absl::Status>& f : fsyncs_) f.wait();
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }
}

absl::Status CheckpointStore::Upload::AddChunk(const v1::CheckpointChunk& chunk) {
  if (committed_) return absl::FailedPreconditionError("checkpoint: upload already committed");
  if (file_ == nullptr) {
    if (!SafeName(chunk.file_name()) || chunk.file_name() == kManifestFile) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: bad file name \"", chunk.file_name(), "\""));
    }
    for (const v1::CheckpointFile& f : files_) {
      if (f.name() == chunk.file_name()) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint: file ", f.name(), " sent twice"));
      }
    }
    file_name_ = chunk.file_name();
    const int fd = OpenPrivateFile(staging_ + "/" + file_name_, O_WRONLY | O_TRUNC);
    file_ = fd < 0 ? nullptr : ::fdopen(fd, "wb");
    if (file_ == nullptr) {
      if (fd >= 0) ::close(fd);
      return absl::InternalError(
          absl::StrCat("checkpoint: cannot create ", file_name_, ": ", std::strerror(errno)));
    }
    written_ = 0;
    crc_ = 0;
  } else if (!chunk.file_name().empty() && chunk.file_name() != file_name_) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: chunk of ", chunk.file_name(),
                                                   " while ", file_name_, " is not finished"));
  }
  if (chunk.offset() != written_) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", file_name_, ": chunk at offset ",
                                                   chunk.offset(), ", expected ", written_));
  }
  absl::Time t = absl::Now();
  const uint32_t chunk_crc = Crc32c(chunk.data());
  if (chunk_crc != chunk.chunk_crc32c()) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", file_name_, ": the chunk at offset ",
                                            chunk.offset(),
                                            " does not match its CRC-32C (corrupted in transit)"));
  }
  checking_ += absl::Now() - t;
  t = absl::Now();
  if (!chunk.data().empty()) {
    const size_t half = chunk.data().size() / 2;
    if (std::fwrite(chunk.data().data(), 1, half, file_) != half) {
      return absl::InternalError(
          absl::StrCat("checkpoint: writing ", file_name_, ": ", std::strerror(errno)));
    }
    std::fflush(file_);
    store_.Hit(Stage::kMidChunk);
    const size_t rest = chunk.data().size() - half;
    if (std::fwrite(chunk.data().data() + half, 1, rest, file_) != rest) {
      return absl::InternalError(
          absl::StrCat("checkpoint: writing ", file_name_, ": ", std::strerror(errno)));
    }
    // Start writing this chunk to disk now (without waiting), so the fsync
    // at the end of the file has little left to do.
    std::fflush(file_);
    (void)::sync_file_range(fileno(file_), chunk.offset(), static_cast<off_t>(chunk.data().size()),
                            SYNC_FILE_RANGE_WRITE);
  }
  writing_ += absl::Now() - t;
  crc_ = Crc32cCombine(crc_, chunk_crc, chunk.data().size());
  written_ += static_cast<int64_t>(chunk.data().size());
  if (chunk.last()) return FinishFile(chunk);
  return absl::OkStatus();
}

absl::Status CheckpointStore::Upload::FinishFile(const v1::CheckpointChunk& last) {
  if (last.file_size() != written_ || last.file_crc32c() != crc_) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint: %s arrived with %d bytes and CRC-32C %08x, the sender says %d bytes and %08x",
        file_name_, written_, crc_, last.file_size(), last.file_crc32c()));
  }
  store_.Hit(Stage::kBeforeFsync);
  if (std::fflush(file_) != 0) {
    return absl::InternalError(
        absl::StrCat("checkpoint: writing ", file_name_, ": ", std::strerror(errno)));
  }
  // The fsync runs while the next file arrives (most of the data is on its
  // way to the disk already: each chunk started its writeback).
  auto sync = [file = file_, name = file_name_]() -> absl::Status {
    const bool synced = ::fsync(fileno(file)) == 0;
    const int err = errno;
    // Written once, read again only on resume or export.
    if (synced) DropCachedPages(fileno(file));
    std::fclose(file);
    if (!synced)
      return absl::InternalError(
          absl::StrCat("checkpoint: fsync ", name, ": ", std::strerror(err)));
    return absl::OkStatus();
  };
  file_ = nullptr;
  try {
    fsyncs_.push_back(std::async(std::launch::async, sync));
  } catch (const std::system_error&) {  // no thread to be had: fsync here
    std::promise<absl::Status> done;
    done.set_value(sync());
    fsyncs_.push_back(done.get_future());
  }
  v1::CheckpointFile& f = files_.emplace_back();
  f.set_name(file_name_);
  f.set_size(written_);
  f.set_crc32c(crc_);
  return absl::OkStatus();
}

absl::Status CheckpointStore::Upload::WaitForFsyncs() {
  const absl::Time start = absl::Now();
  absl::Status status;
  for (std::future<absl::Status>& f : fsyncs_) {
    absl::Status s = f.get();
    if (status.ok()) status = s;
  }
  fsyncs_.clear();
  syncing_ += absl::Now() - start;
  return status;
}

absl::Status CheckpointStore::Upload::Absorb(Upload& other) {
  RETURN_IF_ERROR(other.WaitForFsyncs());
  if (other.job_id_ != job_id_ || other.step_ != step_ || other.root_ != root_) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: cannot join a part of ",
                                                   other.job_id_, " step ", other.step_, " to ",
                                                   job_id_, " step ", step_));
  }
  if (file_ != nullptr || other.file_ != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint: ", file_ != nullptr ? file_name_ : other.file_name_, " was not finished"));
  }
  for (const v1::CheckpointFile& f : other.files_) {
    for (const v1::CheckpointFile& mine : files_) {
      if (mine.name() == f.name()) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint: file ", f.name(), " sent twice"));
      }
    }
  }
  for (const v1::CheckpointFile& f : other.files_) {
    // Same directory tree, so a rename; the staging directory is fsynced
    // at the commit.
    if (std::rename((other.staging_ + "/" + f.name()).c_str(),
                    (staging_ + "/" + f.name()).c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("checkpoint: moving ", f.name(), ": ", std::strerror(errno)));
    }
    files_.push_back(f);
  }
  other.files_.clear();
  checking_ += other.checking_;
  writing_ += other.writing_;
  syncing_ += other.syncing_;
  return absl::OkStatus();
}

absl::StatusOr<v1::CheckpointManifest> CheckpointStore::Upload::Commit(
    v1::CheckpointManifest manifest, int keep_last) {
  if (file_ != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint: ", file_name_, " was not finished"));
  }
  if (files_.empty()) return absl::InvalidArgumentError("checkpoint: no files were uploaded");
  RETURN_IF_ERROR(WaitForFsyncs());
  manifest.set_job_id(job_id_);
  manifest.set_step(step_);
  manifest.clear_files();
  for (const v1::CheckpointFile& f : files_) *manifest.add_files() = f;
  const absl::Time commit_start = absl::Now();
  manifest.set_commit_time_us(absl::ToUnixMicros(commit_start));
  const std::string job_dir = root_ + "/" + job_id_;
  const std::string final_dir = absl::StrFormat("%s/%012d", job_dir, step_);
  manifest.clear_directory();
  if (shared_) manifest.set_directory(final_dir);

  absl::MutexLock lock(&store_.mu_);
  RETURN_IF_ERROR(FsyncDirectory(staging_));
  store_.Hit(Stage::kBeforeRename);
  RETURN_IF_ERROR(store_.CheckNotCommitted(job_id_, step_));
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    // Note [Manifest is the commit]: a commit of this step whose manifest
    // write failed left it (commits hold mu_ from rename to manifest).
    LOG(WARNING) << "checkpoint " << job_id_ << " step " << step_ << ": replacing " << final_dir
                 << ", which an earlier commit left without a manifest";
    fs::remove_all(final_dir, ec);
    if (ec)
      return absl::InternalError(absl::StrCat("checkpoint: cannot remove ", final_dir,
                                              ", which an earlier commit left "
                                              "without a manifest: ",
                                              ec.message()));
  }
  fs::rename(staging_, final_dir, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("checkpoint: rename to ", final_dir, ": ", ec.message()));
  committed_ = true;  // the staging directory is gone either way
  RETURN_IF_ERROR(FsyncDirectory(job_dir));
  store_.Hit(Stage::kBeforeManifest);
  // Note [Manifest is the commit]: before the row, Recover() deletes the
  // directory; after it, the checkpoint exists.
  RETURN_IF_ERROR(store_.state_.SaveManifest(manifest));
  store_.Hit(Stage::kAfterManifest);
  WriteManifestFile(final_dir + "/" + kManifestFile, manifest);

  const absl::Time committed = absl::Now();
  if (keep_last > 0) {
    ASSIGN_OR_RETURN(std::vector<v1::CheckpointManifest> all, store_.state_.LoadManifests(job_id_));
    for (size_t i = 0; i + keep_last < all.size(); ++i) {
      RETURN_IF_ERROR(store_.state_.DeleteManifest(job_id_, all[i].step()));
      store_.RemoveLater(store_.DirOf(all[i]));
    }
  }
  int64_t bytes = 0;
  for (const v1::CheckpointFile& f : files_) bytes += f.size();
  LOG(INFO) << "checkpoint " << job_id_ << " step " << step_ << ": " << bytes
            << " bytes; checksums " << absl::ToDoubleSeconds(checking_) << " s, writing "
            << absl::ToDoubleSeconds(writing_) << " s, waiting for fsync "
            << absl::ToDoubleSeconds(syncing_) << " s, commit "
            << absl::ToDoubleSeconds(committed - commit_start) << " s, retention "
            << absl::ToDoubleSeconds(absl::Now() - committed) << " s (files removed later)";
  return manifest;
}

absl::StatusOr<std::vector<v1::CheckpointManifest>> CheckpointStore::List(
    const std::string& job_id) {
  return state_.LoadManifests(job_id);
}

absl::StatusOr<v1::CheckpointManifest> CheckpointStore::FindLoadable(
    const std::string& job_id, int64_t step, std::vector<std::string>* skipped) {
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointManifest> all, state_.LoadManifests(job_id));
  bool tried = false;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (step > 0 && it->step() > step) continue;
    if (step > 0 && it->step() < step && !tried) break;  // the asked-for step does not exist
    tried = true;
    std::string problem;
    for (const v1::CheckpointFile& f : it->files()) {
      problem = CheckStoredFile(FilePath(*it, f.name()), f);
      if (!problem.empty()) break;
    }
    if (problem.empty()) return *it;
    skipped->push_back(
        absl::StrCat("checkpoint ", job_id, " step ", it->step(), " is unusable: ", problem));
  }
  return absl::NotFoundError(
      step > 0 ? absl::StrCat("job ", job_id, " has no usable checkpoint at step ", step)
               : absl::StrCat("job ", job_id, " has no usable checkpoint"));
}

}  // namespace chorus
