#include "coordinator/checkpoint_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace chorus {
namespace {

namespace fs = std::filesystem;

constexpr char kManifestFile[] = "MANIFEST";
constexpr char kStagingPrefix[] = ".staging-";

absl::Status FsyncPath(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat("fsync ", path, ": ", std::strerror(err)));
  return absl::OkStatus();
}

// Job ids and file names become path components: no separators, no dots
// that could climb out.
bool SafeName(const std::string& name) {
  if (name.empty() || name.size() > 128 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

absl::StatusOr<std::string> HashFile(const std::string& path, int64_t* size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, " is missing"));
  Sha256 h;
  std::string buffer(1 << 20, '\0');
  *size = 0;
  while (in) {
    in.read(buffer.data(), buffer.size());
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    h.Update(absl::string_view(buffer.data(), n));
    *size += n;
  }
  return h.HexDigest();
}

}  // namespace

const char* CheckpointStore::StageName(Stage stage) {
  switch (stage) {
    case Stage::kMidChunk: return "mid_chunk";
    case Stage::kBeforeFsync: return "before_fsync";
    case Stage::kBeforeRename: return "before_rename";
    case Stage::kBeforeManifest: return "before_manifest";
    case Stage::kAfterManifest: return "after_manifest";
  }
  return "unknown";
}

CheckpointStore::CheckpointStore(std::string root, StateStore& state, Failpoint failpoint)
    : root_(std::move(root)), state_(state), failpoint_(std::move(failpoint)) {}

std::string CheckpointStore::StepDir(const std::string& job_id, int64_t step) const {
  return absl::StrFormat("%s/%s/%012d", root_, job_id, step);
}

std::string CheckpointStore::FilePath(const std::string& job_id, int64_t step, const std::string& file) const {
  return StepDir(job_id, step) + "/" + file;
}

absl::Status CheckpointStore::Recover() {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat(root_, ": ", ec.message()));
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointManifest> manifests, state_.LoadManifests(""));
  std::set<std::string> committed;
  for (const v1::CheckpointManifest& m : manifests) committed.insert(StepDir(m.job_id(), m.step()));
  int removed = 0;
  for (const fs::directory_entry& job : fs::directory_iterator(root_, ec)) {
    if (!job.is_directory()) continue;
    for (const fs::directory_entry& entry : fs::directory_iterator(job.path(), ec)) {
      const std::string path = entry.path().string();
      const bool staging = absl::StartsWith(entry.path().filename().string(), kStagingPrefix);
      if (staging || (entry.is_directory() && !committed.count(path))) {
        fs::remove_all(entry.path(), ec);
        ++removed;
      }
    }
  }
  if (removed > 0) LOG(WARNING) << "checkpoints: removed " << removed << " incomplete checkpoint(s) under " << root_;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CheckpointStore::Upload>> CheckpointStore::BeginUpload(const std::string& job_id,
                                                                                      int64_t step) {
  if (!SafeName(job_id)) return absl::InvalidArgumentError(absl::StrCat("checkpoint: bad job id \"", job_id, "\""));
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("checkpoint: step must be >= 0, got ", step));
  std::error_code ec;
  if (fs::exists(StepDir(job_id, step), ec)) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint ", job_id, " step ", step, " is already committed"));
  }
  int64_t n;
  {
    absl::MutexLock lock(&mu_);
    n = next_staging_++;
  }
  const std::string staging = absl::StrCat(root_, "/", job_id, "/", kStagingPrefix, step, "-", getpid(), "-", n);
  fs::create_directories(staging, ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint: cannot create ", staging, ": ", ec.message()));
  return std::unique_ptr<Upload>(new Upload(*this, job_id, step, staging));
}

CheckpointStore::Upload::~Upload() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }
}

absl::Status CheckpointStore::Upload::AddChunk(const v1::CheckpointChunk& chunk) {
  if (committed_) return absl::FailedPreconditionError("checkpoint: upload already committed");
  if (file_ == nullptr) {
    if (!SafeName(chunk.file_name()) || chunk.file_name() == kManifestFile) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: bad file name \"", chunk.file_name(), "\""));
    }
    for (const v1::CheckpointFile& f : files_) {
      if (f.name() == chunk.file_name()) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint: file ", f.name(), " sent twice"));
      }
    }
    file_name_ = chunk.file_name();
    file_ = std::fopen((staging_ + "/" + file_name_).c_str(), "wb");
    if (file_ == nullptr) {
      return absl::InternalError(absl::StrCat("checkpoint: cannot create ", file_name_, ": ", std::strerror(errno)));
    }
    written_ = 0;
    crc_ = 0;
    hash_ = std::make_unique<Sha256>();
  } else if (!chunk.file_name().empty() && chunk.file_name() != file_name_) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: chunk of ", chunk.file_name(), " while ",
                                                   file_name_, " is not finished"));
  }
  if (chunk.offset() != written_) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", file_name_, ": chunk at offset ",
                                                   chunk.offset(), ", expected ", written_));
  }
  if (Crc32c(chunk.data()) != chunk.chunk_crc32c()) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", file_name_, ": the chunk at offset ", chunk.offset(),
                                            " does not match its CRC-32C (corrupted in transit)"));
  }
  if (!chunk.data().empty()) {
    const size_t half = chunk.data().size() / 2;
    if (std::fwrite(chunk.data().data(), 1, half, file_) != half) {
      return absl::InternalError(absl::StrCat("checkpoint: writing ", file_name_, ": ", std::strerror(errno)));
    }
    std::fflush(file_);
    store_.Hit(Stage::kMidChunk);
    const size_t rest = chunk.data().size() - half;
    if (std::fwrite(chunk.data().data() + half, 1, rest, file_) != rest) {
      return absl::InternalError(absl::StrCat("checkpoint: writing ", file_name_, ": ", std::strerror(errno)));
    }
    // Start writing this chunk to disk now (without waiting), so the fsync
    // at the end of the file has little left to do.
    std::fflush(file_);
    (void)::sync_file_range(fileno(file_), chunk.offset(), static_cast<off_t>(chunk.data().size()),
                            SYNC_FILE_RANGE_WRITE);
  }
  hash_->Update(chunk.data());
  crc_ = Crc32cExtend(crc_, chunk.data());
  written_ += static_cast<int64_t>(chunk.data().size());
  if (chunk.last()) return FinishFile(chunk);
  return absl::OkStatus();
}

absl::Status CheckpointStore::Upload::FinishFile(const v1::CheckpointChunk& last) {
  if (last.file_size() != written_ || last.file_crc32c() != crc_) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint: %s arrived with %d bytes and CRC-32C %08x, the sender says %d bytes and %08x", file_name_,
        written_, crc_, last.file_size(), last.file_crc32c()));
  }
  const std::string digest = hash_->HexDigest();
  store_.Hit(Stage::kBeforeFsync);
  if (std::fflush(file_) != 0 || ::fsync(fileno(file_)) != 0) {
    return absl::InternalError(absl::StrCat("checkpoint: fsync ", file_name_, ": ", std::strerror(errno)));
  }
  std::fclose(file_);
  file_ = nullptr;
  v1::CheckpointFile& f = files_.emplace_back();
  f.set_name(file_name_);
  f.set_size(written_);
  f.set_sha256(digest);
  return absl::OkStatus();
}

absl::Status CheckpointStore::Upload::Absorb(Upload& other) {
  if (other.job_id_ != job_id_ || other.step_ != step_) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: cannot join a part of ", other.job_id_, " step ",
                                                   other.step_, " to ", job_id_, " step ", step_));
  }
  if (file_ != nullptr || other.file_ != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", file_ != nullptr ? file_name_ : other.file_name_,
                                                   " was not finished"));
  }
  for (const v1::CheckpointFile& f : other.files_) {
    for (const v1::CheckpointFile& mine : files_) {
      if (mine.name() == f.name()) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint: file ", f.name(), " sent twice"));
      }
    }
  }
  for (const v1::CheckpointFile& f : other.files_) {
    // Same directory tree, so a rename; the staging directory is fsynced
    // at the commit.
    if (std::rename((other.staging_ + "/" + f.name()).c_str(), (staging_ + "/" + f.name()).c_str()) != 0) {
      return absl::InternalError(absl::StrCat("checkpoint: moving ", f.name(), ": ", std::strerror(errno)));
    }
    files_.push_back(f);
  }
  other.files_.clear();
  return absl::OkStatus();
}

absl::StatusOr<v1::CheckpointManifest> CheckpointStore::Upload::Commit(v1::CheckpointManifest manifest,
                                                                       int keep_last) {
  if (file_ != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", file_name_, " was not finished"));
  }
  if (files_.empty()) return absl::InvalidArgumentError("checkpoint: no files were uploaded");
  manifest.set_job_id(job_id_);
  manifest.set_step(step_);
  manifest.clear_files();
  for (const v1::CheckpointFile& f : files_) *manifest.add_files() = f;
  manifest.set_commit_time_us(absl::ToUnixMicros(absl::Now()));

  absl::MutexLock lock(&store_.mu_);
  RETURN_IF_ERROR(FsyncPath(staging_, /*directory=*/true));
  store_.Hit(Stage::kBeforeRename);
  const std::string final_dir = store_.StepDir(job_id_, step_);
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint ", job_id_, " step ", step_, " is already committed"));
  }
  fs::rename(staging_, final_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint: rename to ", final_dir, ": ", ec.message()));
  committed_ = true;  // the staging directory is gone either way
  RETURN_IF_ERROR(FsyncPath(store_.root_ + "/" + job_id_, /*directory=*/true));
  store_.Hit(Stage::kBeforeManifest);
  // The manifest row is the commit point: before it, Recover() deletes the
  // directory; after it, the checkpoint exists.
  RETURN_IF_ERROR(store_.state_.SaveManifest(manifest));
  store_.Hit(Stage::kAfterManifest);
  {
    std::ofstream out(final_dir + "/" + kManifestFile, std::ios::binary | std::ios::trunc);
    out << manifest.SerializeAsString();
  }

  if (keep_last > 0) {
    ASSIGN_OR_RETURN(std::vector<v1::CheckpointManifest> all, store_.state_.LoadManifests(job_id_));
    for (size_t i = 0; i + keep_last < all.size(); ++i) {
      RETURN_IF_ERROR(store_.state_.DeleteManifest(job_id_, all[i].step()));
      fs::remove_all(store_.StepDir(job_id_, all[i].step()), ec);
    }
  }
  return manifest;
}

absl::StatusOr<std::vector<v1::CheckpointManifest>> CheckpointStore::List(const std::string& job_id) {
  return state_.LoadManifests(job_id);
}

absl::StatusOr<v1::CheckpointManifest> CheckpointStore::FindLoadable(const std::string& job_id, int64_t step,
                                                                     std::vector<std::string>* skipped) {
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointManifest> all, state_.LoadManifests(job_id));
  bool tried = false;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (step > 0 && it->step() > step) continue;
    if (step > 0 && it->step() < step && !tried) break;  // the asked-for step does not exist
    tried = true;
    std::string problem;
    for (const v1::CheckpointFile& f : it->files()) {
      int64_t size = 0;
      absl::StatusOr<std::string> digest = HashFile(FilePath(job_id, it->step(), f.name()), &size);
      if (!digest.ok()) {
        problem = std::string(digest.status().message());
      } else if (size != f.size() || *digest != f.sha256()) {
        problem = absl::StrCat(f.name(), " does not match its recorded size and SHA-256");
      }
      if (!problem.empty()) break;
    }
    if (problem.empty()) return *it;
    skipped->push_back(absl::StrCat("checkpoint ", job_id, " step ", it->step(), " is unusable: ", problem));
  }
  return absl::NotFoundError(step > 0 ? absl::StrCat("job ", job_id, " has no usable checkpoint at step ", step)
                                      : absl::StrCat("job ", job_id, " has no usable checkpoint"));
}

}  // namespace chorus
