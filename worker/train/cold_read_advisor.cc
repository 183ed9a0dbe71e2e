#include "worker/train/cold_read_advisor.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <string>
#include <utility>

namespace chorus {
namespace {

// Note [Cold reads]: ranges this close are read ahead as one, in pieces of
// kAdviseChunk; the window's bounds.
constexpr int64_t kAdviseGap = int64_t{1} << 20;
constexpr int64_t kAdviseChunk = int64_t{256} << 10;
constexpr int64_t kMaxAdviseWindow = int64_t{1} << 16;
constexpr int64_t kMinAdviseBytes = int64_t{64} << 20;

// Note [Cold reads]: Linux's cachestat(2) (6.5 on), by number: what
// <linux/mman.h> declares for it, which older headers lack.
constexpr long kCachestatSyscall = 451;
struct CachestatRange {
  uint64_t offset, length;
};
struct Cachestat {
  uint64_t cached, dirty, writeback, evicted, recently_evicted;
};

// Whether every page of [begin, end) of `fd` is in the page cache, by one
// cachestat(2); false where the kernel has no cachestat (the caller probes
// piece by piece).
bool AllCached(int fd, int64_t begin, int64_t end) {
  static std::atomic<bool> unavailable{false};
  if (unavailable.load(std::memory_order_relaxed)) return false;
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t first = begin / page * page;
  CachestatRange range{static_cast<uint64_t>(first), static_cast<uint64_t>(end - first)};
  Cachestat stat{};
  if (::syscall(kCachestatSyscall, fd, &range, &stat, 0) != 0) {
    if (errno == ENOSYS) unavailable.store(true, std::memory_order_relaxed);
    return false;
  }
  return static_cast<int64_t>(stat.cached) >= (end - first + page - 1) / page;
}

// The shard file a Run reads ahead in, one at a time, opened for
// sequential reads.
class AheadFile {
 public:
  AheadFile() : chunk_(kAdviseChunk) {}
  ~AheadFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  AheadFile(const AheadFile&) = delete;
  AheadFile& operator=(const AheadFile&) = delete;

  // Reads bytes [begin, end) of shard `shard` (at `path`) into the page
  // cache, piece by piece, skipping what is cached already.
  void ReadAhead(int shard, const std::string& path, int64_t begin, int64_t end) {
    if (shard != shard_) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ >= 0) ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
      shard_ = shard;
    }
    if (fd_ >= 0 && AllCached(fd_, begin, end)) return;
    for (int64_t at = begin; fd_ >= 0 && at < end; at += kAdviseChunk) {
      const int64_t size = std::min(kAdviseChunk, end - at);
      char last;
      iovec probe = {&last, 1};
      if (::preadv2(fd_, &probe, 1, at + size - 1, RWF_NOWAIT) == 1) continue;  // cached
      if (::pread(fd_, chunk_.data(), size, at) <= 0) break;  // the reader says why
    }
  }

 private:
  int fd_ = -1;     // -1: none, or it could not be opened
  int shard_ = -1;  // the shard fd_ is (or failed to be) open for
  std::vector<char> chunk_;
};

// The bytes of the dataset's first sample as it is stored.
int64_t FirstSampleBytes(const ShardIndex& index, const ShardFormat& format) {
  std::vector<ShardRange> stored;
  format.AppendStoredRanges(index.Locate(0), stored);
  int64_t bytes = 0;
  for (const ShardRange& r : stored) bytes += r.bytes.size;
  return bytes;
}

bool InFileOrder(const ShardRange& a, const ShardRange& b) {
  return std::pair(a.shard, a.bytes.offset) < std::pair(b.shard, b.bytes.offset);
}

}  // namespace

int64_t AdviseWindow(int64_t read_ahead_bytes, int64_t sample_bytes, int64_t group_samples) {
  return std::max(2 * group_samples,
                  std::min(kMaxAdviseWindow, std::max(read_ahead_bytes, kMinAdviseBytes) /
                                                 std::max<int64_t>(1, sample_bytes)));
}

void MergeReadAhead(const std::vector<ShardRange>& stored, std::vector<ShardRange>& out) {
  out.clear();
  for (const ShardRange& r : stored) {
    if (!out.empty() && out.back().shard == r.shard &&
        r.bytes.offset <= out.back().bytes.end() + kAdviseGap) {
      ByteRange& merged = out.back().bytes;
      merged.size = std::max(merged.end(), r.bytes.end()) - merged.offset;
      continue;
    }
    out.push_back(r);
  }
}

ColdReadAdvisor::ColdReadAdvisor(const ShardIndex& index, const ShardFormat& format,
                                 int64_t read_ahead_bytes)
    : index_(index),
      format_(format),
      read_ahead_bytes_(read_ahead_bytes),
      sample_bytes_(FirstSampleBytes(index, format)) {}

int64_t ColdReadAdvisor::Window(int64_t group_samples) const {
  return AdviseWindow(read_ahead_bytes_, sample_bytes_, group_samples);
}

void ColdReadAdvisor::StoredRanges(const std::vector<int64_t>& next,
                                   std::vector<int64_t>& positions, std::vector<int64_t>& counts,
                                   std::vector<ShardRange>& stored) const {
  // Note [Samples in file order] in shard_format.cc.
  SortPositionsByIndex(next.data(), static_cast<int64_t>(next.size()), positions, counts);
  stored.clear();
  for (const int64_t at : positions) format_.AppendStoredRanges(index_.Locate(next[at]), stored);
  // A format whose samples' parts lie in regions of their own (TENSOR_FILES:
  // the x rows, then the y rows) has them in file order only once sorted.
  if (!std::is_sorted(stored.begin(), stored.end(), InFileOrder)) {
    std::sort(stored.begin(), stored.end(), InFileOrder);
  }
}

// Note [Cold reads]
// Within a block of the streamed order (Note [Streamed order] in
// sampler.cc) a rank's samples come in shuffled order, so its reads hop
// around the block: the kernel's read-ahead, which follows sequential
// reads, sees 17 KB reads at random offsets, and a cold disk serves them
// one by one. So a second thread, the advisor, reads ahead of the reader
// what it reads next: the byte ranges of its next read_ahead_bytes of
// samples (their size in the file), sorted and merged where at most
// kAdviseGap apart, read forward in kAdviseChunk pieces as `dd` would,
// which the kernel's sequential read-ahead streams from the disk. The bytes
// land in the page cache (not in the process), where the reader finds
// them. A range whose pages are all cached already (one cachestat(2)) is
// skipped whole, and within the others a piece whose last byte is cached
// (preadv2 RWF_NOWAIT); before cachestat, probing every 256 KiB piece of a
// dataset in the page cache was a third of the advisor's time in the
// data-bound bench. Kernels without cachestat (before 6.5) probe pieces.
// The pieces are 256 KiB: in 3-round cold runs of the bench the job read
// 0.77-0.89 of `dd`'s speed with them against 0.75-0.78 with 1 MiB pieces
// (4 MiB: 0.51-0.62); the kernel's read-ahead, not the piece, keeps the
// disk busy, and a smaller piece copies less into `chunk_` at a time.
// The window is the rank's next read_ahead_bytes of samples, and never
// less than kMinAdviseBytes of them (page cache, not the rank's memory):
// with a 16 MiB buffer and shuffle blocks of one batch, a 16 MiB window
// read the bench's shards cold at 1.44-1.64 GB/s (0.71-0.91 of `dd` in
// the same minutes), a 32 or 64 MiB one at 1.82-2.02 GB/s (0.99-1.05):
// the advisor read a quarter window, then waited for the reader, and the
// disk idled.
// Measured on the bench machine (virtio disk, read_ahead_kb 8192):
// posix_fadvise(WILLNEED) over the same ranges made the disk read slower
// than `cat` (0.71-0.74 s against 0.29-0.44 s for 302 MB), and one
// WILLNEED reads no more than read_ahead_kb; reading on the reader's own
// thread stalls its copying out of the cache.
void ColdReadAdvisor::Run(int64_t count, std::function<int64_t()> next, int64_t window,
                          ReadingProgress& progress) const {
  ::pthread_setname_np(::pthread_self(), "chorus-advise");
  // Samples are advised in steps of a quarter window, as the reader moves.
  const int64_t step = std::max<int64_t>(1, window / 4);
  AheadFile file;
  std::vector<int64_t> drawn, positions, counts;
  std::vector<ShardRange> stored, merged;
  for (int64_t advised = 0; advised < count;) {
    const std::optional<int64_t> to = progress.AwaitWindow(window, std::min(advised + step, count));
    if (!to.has_value()) break;
    drawn.clear();
    for (int64_t i = advised; i < *to; ++i) drawn.push_back(next());
    StoredRanges(drawn, positions, counts, stored);
    MergeReadAhead(stored, merged);
    for (const ShardRange& r : merged) {
      file.ReadAhead(r.shard, index_.shards()[r.shard].path, r.bytes.offset, r.bytes.end());
    }
    advised = *to;
    progress.Advised(advised);
  }
}

}  // namespace chorus
