#include "checkpoint/shared_dir_storage.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <future>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/paths.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"

namespace chorus {
namespace {

namespace fs = std::filesystem;

// Bytes are copied into a buffer of this size and written from there, one
// write() per buffer. The size matters on the development VM (Linux 6.18,
// ext4), presumably because a write() of 1 MB or more is given large
// page-cache folios, which were 5-7x slower to fill than small ones. A C loop writing
// 201 MB into a new file took 0.027-0.042 s in writes of 64-512 KB and
// 0.18-0.26 s in writes of 1-2 MB (0.27-0.45 s at 4 MB), the fsync after
// it 0.12-0.15 s either way; the checkpoint bench's SHARED_DIR write()
// went from 0.15-0.19 s with 1 MB to 0.028-0.035 s with 256 KB. Writing
// straight from the tensors in 256 KB slices instead of copying them here
// first was no faster (2 runs each). No sync_file_range to start writeback
// early: every 8 MB it made write() 0.01-0.02 s slower and the fsync wait
// as much shorter.
constexpr size_t kBounceBytes = 256 << 10;

constexpr char kWritableHint[] =
    "; the directory must be writable by the user the ranks run as (by ranks of several users: "
    "chmod 1777, as /tmp)";

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat("checkpoint: ", what, " ", path, ": ", std::strerror(errno)));
}

// Open files of one checkpoint and their fsyncs. A file's fsync runs on a
// thread while the next file is written (the checkpoint bench's final
// checkpoint: 0.05-0.08 s left to wait for instead of 0.10-0.15 s of
// fsyncs one after the other). At destruction the fsyncs are waited for,
// the files' pages leave the page cache (after the commit: the coordinator
// reads them back to check them) and they are closed.
class WrittenFiles {
 public:
  WrittenFiles() = default;
  WrittenFiles(const WrittenFiles&) = delete;
  WrittenFiles& operator=(const WrittenFiles&) = delete;
  ~WrittenFiles() {
    (void)WaitForFsyncs();
    for (int fd : fds_) {
      DropCachedPages(fd);
      ::close(fd);
    }
  }
  void Add(int fd) { fds_.push_back(fd); }
  // Starts fsync of `fd` (`path` for the error) in the background, or runs
  // it here if no thread can be started.
  void StartFsync(int fd, const std::string& path) {
    auto sync = [fd, path]() -> absl::Status {
      return ::fsync(fd) == 0 ? absl::OkStatus() : Errno("fsync", path);
    };
    try {
      fsyncs_.push_back(std::async(std::launch::async, sync));
    } catch (const std::system_error&) {
      std::promise<absl::Status> done;
      done.set_value(sync());
      fsyncs_.push_back(done.get_future());
    }
  }
  // Waits for every fsync started so far; the first error.
  absl::Status WaitForFsyncs() {
    absl::Status first;
    for (std::future<absl::Status>& f : fsyncs_) {
      absl::Status s = f.get();
      if (first.ok()) first = s;
    }
    fsyncs_.clear();
    return first;
  }

 private:
  std::vector<int> fds_;
  std::vector<std::future<absl::Status>> fsyncs_;
};

// Writes `source` to a new file `path` and starts its fsync (in
// `written`, which keeps the file open); its size and CRC-32C in `size` and
// `crc`. `bounce` is
// scratch space of kBounceBytes.
absl::Status WriteFile(const std::string& path, const CheckpointFileSource& source, char* bounce,
                       int64_t* size, uint32_t* crc, absl::Duration* in_write,
                       WrittenFiles& written) {
  // Note [A shared checkpoint directory]: 0600, the umask can only take
  // bits away.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Errno("cannot create", path);
  written.Add(fd);
  *crc = 0;
  *size = 0;
  size_t filled = 0;
  auto flush = [&]() -> absl::Status {
    *crc = Crc32cExtend(*crc, absl::string_view(bounce, filled));
    const absl::Time start = absl::Now();
    size_t done = 0;
    while (done < filled) {
      const ssize_t w = ::write(fd, bounce + done, filled - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Errno("writing", path);
      done += static_cast<size_t>(w);
    }
    *size += static_cast<int64_t>(filled);
    filled = 0;
    *in_write += absl::Now() - start;
    return absl::OkStatus();
  };
  absl::Status status = source.write([&](absl::string_view piece) -> absl::Status {
    while (!piece.empty()) {
      const size_t n = std::min(piece.size(), kBounceBytes - filled);
      std::memcpy(bounce + filled, piece.data(), n);
      filled += n;
      piece.remove_prefix(n);
      if (filled == kBounceBytes) RETURN_IF_ERROR(flush());
    }
    return absl::OkStatus();
  });
  if (status.ok()) status = flush();
  if (status.ok()) written.StartFsync(fd, path);
  return status;
}

}  // namespace

// Note [A shared checkpoint directory]
// checkpoint.shared_dir is written by the ranks themselves, and the ranks of
// different users may run as different Unix users (docs/operating.md). So
// every job's directory, <shared_dir>[/<space>]/<job>, is made 0700 by the
// ranks' user (mkdir(2) with that mode, whatever the umask), its staging and
// step directories 0700 and its files 0600: no other local user reads a
// model or writes into the directory. For ranks of several users to make
// their job directories side by side, the root (and so the cluster's
// namespace directory, which takes the root's mode when a rank makes it)
// must be writable by all of them; world-writable is fine only with the
// sticky bit, as /tmp (chmod 1777), or any user could rename or remove
// another's job directory: such a root is refused. A job directory that is
// there already must belong to the ranks' user (in a shared root another
// user could have made it first, or put a link there); one of an older
// version with a wider mode is made 0700 with a warning. The coordinator
// checks and renames the staged files (checkpoint_store.h), so it runs as
// root or as the ranks' user; `chorus export` and a resume's download go
// through it, and a rank that cannot read a committed directory (another
// job's, resumed from) downloads it too.

namespace {

constexpr mode_t kOthersBits = S_IRWXG | S_IRWXO;

// FAILED_PRECONDITION if `dir` (with `st`) is writable by every user without
// the sticky bit (Note [A shared checkpoint directory]).
absl::Status CheckSharedParent(const std::string& dir, const struct stat& st) {
  if ((st.st_mode & S_IWOTH) == 0 || (st.st_mode & S_ISVTX) != 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "checkpoint.shared_dir: %s is writable by every user (mode %04o) but lacks the sticky "
      "bit, so any user could rename or remove other jobs' checkpoint directories; make it "
      "like /tmp: chmod 1777 %s",
      dir, st.st_mode & 07777, dir));
}

// lstat of `dir`, which must be a directory itself, not a link to one.
absl::StatusOr<struct stat> DirectoryItself(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.shared_dir: cannot create or write ", dir,
                     ": something other than a directory is in the way"));
  }
  return st;
}

// Makes the cluster's namespace directory `dir` under `root` (with
// `root_st`) if missing, with the root's mode; checks it as the root.
absl::Status MakeSpaceDirectory(const std::string& dir, const struct stat& root_st) {
  const mode_t mode = root_st.st_mode & 07777;
  if (::mkdir(dir.c_str(), mode) == 0) {
    ::chmod(dir.c_str(), mode);  // the umask took bits away
  } else if (errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.shared_dir: cannot create or write ", dir, ": ",
                     std::strerror(errno), kWritableHint));
  }
  // lstat: in a root all may write to, a link there could be another
  // user's, leading every job's directory into a directory that user owns.
  ASSIGN_OR_RETURN(const struct stat st, DirectoryItself(dir));
  return CheckSharedParent(dir, st);
}

// Makes the job's directory `dir` 0700, or checks the one there.
absl::Status MakeJobDirectory(const std::string& dir) {
  if (::mkdir(dir.c_str(), S_IRWXU) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.shared_dir: cannot create or write ", dir, ": ",
                     std::strerror(errno), kWritableHint));
  }
  ASSIGN_OR_RETURN(const struct stat st, DirectoryItself(dir));
  if (st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.shared_dir: ", dir, " belongs to uid ", st.st_uid, ", not to uid ", ::geteuid(),
        " the job's ranks run as; another user made it, so it cannot hold this "
        "job's checkpoints privately: remove it (root) and start the job again"));
  }
  if ((st.st_mode & kOthersBits) != 0) {
    if (::chmod(dir.c_str(), S_IRWXU) != 0) return Errno("cannot make private", dir);
    LOG(WARNING) << "checkpoint.shared_dir: " << dir << " was accessible by others (mode "
                 << absl::StrFormat("%04o", st.st_mode & 07777) << "); made it 0700";
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.shared_dir: cannot create or write ", dir, ": ",
                     std::strerror(errno), kWritableHint));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedDirCheckpointStorage>> SharedDirCheckpointStorage::Create(
    std::shared_ptr<grpc::Channel> channel, const std::string& shared_dir, const std::string& space,
    std::string job_id, int64_t generation, int rank, absl::Duration timeout) {
  struct stat root {};
  const int stat_errno = ::stat(shared_dir.c_str(), &root) != 0 ? errno : 0;
  if (stat_errno != 0 || !S_ISDIR(root.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.shared_dir ", shared_dir, " is not a directory on this host (",
        stat_errno != 0 ? std::strerror(stat_errno) : "not a directory",
        "); it must be mounted at the same path on every node and on the coordinator's host"));
  }
  RETURN_IF_ERROR(CheckSharedParent(shared_dir, root));
  std::string parent = shared_dir;
  if (!space.empty()) {
    parent = absl::StrCat(shared_dir, "/", space);
    RETURN_IF_ERROR(MakeSpaceDirectory(parent, root));
  }
  const std::string job_dir = absl::StrCat(parent, "/", job_id);
  RETURN_IF_ERROR(MakeJobDirectory(job_dir));
  return std::unique_ptr<SharedDirCheckpointStorage>(new SharedDirCheckpointStorage(
      std::move(channel), job_dir, std::move(job_id), generation, rank, timeout));
}

SharedDirCheckpointStorage::SharedDirCheckpointStorage(std::shared_ptr<grpc::Channel> channel,
                                                       std::string job_dir, std::string job_id,
                                                       int64_t generation, int rank,
                                                       absl::Duration timeout)
    : stub_(v1::CheckpointService::NewStub(channel)),
      download_(channel, job_id, generation, rank, /*coordinator_host=*/"", timeout),
      job_dir_(std::move(job_dir)),
      job_id_(std::move(job_id)),
      generation_(generation),
      rank_(rank),
      timeout_(timeout) {}

absl::Status SharedDirCheckpointStorage::Store(int64_t step,
                                               const std::vector<CheckpointFileSource>& files) {
  const std::string staging_name = absl::StrCat(".staging-", step, "-r", rank_, "-", ::getpid(),
                                                "-", next_staging_.fetch_add(1));
  const std::string staging = absl::StrCat(job_dir_, "/", staging_name);
  std::error_code ec;
  if (::mkdir(staging.c_str(), S_IRWXU) != 0) {
    return absl::InternalError(
        absl::StrCat("checkpoint: cannot create ", staging, ": ", std::strerror(errno)));
  }
  v1::CommitCheckpointRequest request;
  request.set_job_id(job_id_);
  request.set_step(step);
  request.set_generation(generation_);
  request.set_rank(rank_);
  request.set_staging_dir(staging_name);
  absl::Status status;
  const absl::Time start = absl::Now();
  int64_t bytes = 0;
  absl::Duration in_write, in_fsync;
  if (bounce_ == nullptr) bounce_ = std::make_unique<char[]>(kBounceBytes);
  WrittenFiles open_files;
  for (const CheckpointFileSource& file : files) {
    int64_t size = 0;
    uint32_t crc = 0;
    status = WriteFile(absl::StrCat(staging, "/", file.name), file, bounce_.get(), &size, &crc,
                       &in_write, open_files);
    if (!status.ok()) break;
    bytes += size;
    v1::CheckpointFile* f = request.add_files();
    f->set_name(file.name);
    f->set_size(size);
    f->set_crc32c(crc);
  }
  {
    const absl::Time t = absl::Now();
    absl::Status synced = open_files.WaitForFsyncs();
    in_fsync = absl::Now() - t;
    if (status.ok()) status = synced;
  }
  if (status.ok()) status = FsyncDirectory(staging);
  const absl::Time written = absl::Now();
  if (status.ok()) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    v1::UploadCheckpointResponse response;
    status = FromGrpcStatus(stub_->Commit(&context, request, &response));
  }
  LOG(INFO) << "checkpoint step " << step << ": wrote " << bytes << " bytes into " << staging_name
            << " in " << absl::ToDoubleSeconds(written - start) << " s (write() "
            << absl::ToDoubleSeconds(in_write) << " s, waiting for fsync "
            << absl::ToDoubleSeconds(in_fsync) << " s), commit took "
            << absl::ToDoubleSeconds(absl::Now() - written) << " s";
  if (!status.ok()) {
    // Committed or not, the staging name is gone or garbage now.
    fs::remove_all(staging, ec);
    return absl::Status(status.code(), absl::StrCat("storing checkpoint step ", step, " in ",
                                                    job_dir_, ": ", status.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CheckpointFileData>> SharedDirCheckpointStorage::Load(
    const v1::CheckpointManifest& manifest) {
  std::error_code ec;
  // Another job's directory (a resume) may be private to another user: the
  // coordinator serves it (Note [A shared checkpoint directory]).
  if (manifest.directory().empty() || !fs::is_directory(manifest.directory(), ec) ||
      ::access(manifest.directory().c_str(), R_OK | X_OK) != 0)
    return download_.Load(manifest);
  std::vector<CheckpointFileData> files;
  for (const v1::CheckpointFile& f : manifest.files()) {
    const std::string path = absl::StrCat(manifest.directory(), "/", f.name());
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::DataLossError(absl::StrCat("checkpoint ", manifest.job_id(), " step ",
                                              manifest.step(), ": ", path, ": ",
                                              std::strerror(errno)));
    }
    CheckpointFileData& data = files.emplace_back();
    data.name = f.name();
    data.bytes.resize(static_cast<size_t>(std::max<int64_t>(f.size(), 0)));
    size_t done = 0;
    while (done < data.bytes.size()) {
      const ssize_t r = ::read(fd, data.bytes.data() + done, data.bytes.size() - done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      done += static_cast<size_t>(r);
    }
    char extra;
    const bool longer = ::read(fd, &extra, 1) > 0;
    ::close(fd);
    bool intact = done == data.bytes.size() && !longer;
    if (intact) {
      intact = f.sha256().empty() ? Crc32c(data.bytes) == f.crc32c()
                                  : Sha256Hex(data.bytes) == f.sha256();
    }
    if (!intact) {
      return absl::DataLossError(absl::StrCat("checkpoint ", manifest.job_id(), " step ",
                                              manifest.step(), ": ", path,
                                              " does not match its recorded size and checksum"));
    }
  }
  return files;
}

}  // namespace chorus
