#include "worker/train/shard_format.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

// Shard files a reading thread keeps open at once; more are opened again as
// needed (the streamed order reads one or two shards at a time).
constexpr size_t kMaxOpenFiles = 16;

}  // namespace

ShardFiles::ShardFiles(const ShardIndex& index, ReadCounts& counts)
    : index_(index), counts_(counts), fds_(index.shards().size(), -1) {}

ShardFiles::~ShardFiles() {
  for (const int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

absl::StatusOr<int> ShardFiles::Open(int shard) {
  if (fds_[shard] >= 0) return fds_[shard];
  const int fd = ::open(path(shard).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("data.shards: cannot open ", path(shard), ": ", std::strerror(errno)));
  }
  // Note [Cold reads] in cold_read_advisor.cc: the advisor has the kernel
  // read ahead; a reading thread's own reads hop around a block and would
  // only start read-ahead of bytes it does not read next.
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  if (open_order_.size() >= kMaxOpenFiles) {
    ::close(fds_[open_order_.front()]);
    fds_[open_order_.front()] = -1;
    open_order_.pop_front();
  }
  fds_[shard] = fd;
  open_order_.push_back(shard);
  return fd;
}

absl::Status ShardFiles::Read(int shard, const ByteRange& range, char* into) {
  ASSIGN_OR_RETURN(const int fd, Open(shard));
  for (int64_t got = 0; got < range.size;) {
    const ssize_t r = ::pread(fd, into + got, range.size - got, range.offset + got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return ReadError(shard, range.offset + got, r);
    got += r;
  }
  Count(range.size);
  return absl::OkStatus();
}

absl::Status ShardFiles::ReadError(int shard, int64_t offset, ssize_t r) const {
  return absl::DataLossError(absl::StrCat("data.shards: cannot read ", path(shard),
                                          " at byte offset ", offset,
                                          r >= 0 ? ": the file is shorter than when it was indexed"
                                                 : absl::StrCat(": ", std::strerror(errno))));
}

void ShardFiles::Count(int64_t bytes) {
  counts_.bytes.fetch_add(bytes);
  counts_.reads.fetch_add(1);
}

// Note [Samples in file order]
// The reader and the advisor visit a group of samples in file order. A
// shard's samples lie in the file in the order of their numbers (the index
// lists them as the scan meets them; a token file's windows and a tensor
// file's rows are at their number's multiple), and shard k's numbers come
// before shard k + 1's, so the order of the numbers is the file order. A
// shuffle block's samples are a permutation of neighbouring numbers, so
// they are sorted by counting when they lie within kCountingSpan times as
// many numbers as there are samples: with 2 KiB samples the comparison
// sorts by (shard, offset) and the Locate calls they needed were a tenth
// of the data-bound bench's CPU time (docs/benchmarks.md).
namespace {
constexpr int64_t kCountingSpan = 4;
}  // namespace

void SortPositionsByIndex(const int64_t* indices, int64_t n, std::vector<int64_t>& order,
                          std::vector<int64_t>& counts) {
  order.resize(n);
  if (n == 0) return;
  const auto [lo, hi] = std::minmax_element(indices, indices + n);
  const int64_t low = *lo, span = *hi - *lo + 1;
  if (span > kCountingSpan * n) {
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [indices](int64_t a, int64_t b) { return indices[a] < indices[b]; });
    return;
  }
  counts.assign(span + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++counts[indices[i] - low + 1];
  for (int64_t v = 1; v <= span; ++v) counts[v] += counts[v - 1];
  for (int64_t i = 0; i < n; ++i) order[counts[indices[i] - low]++] = i;
}

ByteRange SpanOf(const SampleLocation& loc) {
  const int64_t begin = std::min(loc.x.offset, loc.y.offset);
  return ByteRange{begin, std::max(loc.x.end(), loc.y.end()) - begin};
}

absl::StatusOr<std::unique_ptr<ShardFormat>> ShardFormat::Open(const ShardIndex& index,
                                                               const ShardReaderOptions& options,
                                                               ShardFiles& files) {
  switch (index.format()) {
    case v1::ShardedData::TAR:
      return OpenTarFormat(index, options, files);
    case v1::ShardedData::TOKENS:
      return OpenTokenFormat(index, options);
    case v1::ShardedData::TENSOR_FILES:
      return OpenTensorFileFormat(index, options);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "data.shards.format: must be TAR, TOKENS or TENSOR_FILES, got ", index.format()));
  }
}

ShardFormat::ShardFormat(const ShardIndex& index, const ShardReaderOptions& options,
                         BatchShape batch_shape)
    : index_(index), options_(options), batch_shape_(std::move(batch_shape)) {}

void ShardFormat::AppendStoredRanges(const SampleLocation& loc,
                                     std::vector<ShardRange>& out) const {
  out.push_back(ShardRange{loc.shard, SpanOf(loc)});
}

size_t ShardFormat::RunEnd(const std::vector<Placement>& order, size_t begin) const {
  return begin + 1;
}

bool ShardFormat::ReadRun(ShardFiles& files, const int64_t* indices, const Placement* run,
                          int64_t count, int64_t batch_size, std::vector<ShardBatch>& out,
                          const Failure& fail) const {
  return false;
}

absl::Status ShardFormat::CheckBatch(const ShardBatch& batch) const { return absl::OkStatus(); }

// Note [Token samples]
// TAR and TENSOR_FILES samples of token ids (a transformer_lm's) are read as
// any other; their ids must lie in [0, vocab_size), or the embedding would fail
// far from the file.
absl::Status ShardFormat::CheckTokenIds(const ShardBatch& batch, const TokenPlace& place) const {
  const int64_t vocab_size = options_.vocab_size;
  for (const bool input : {true, false}) {
    const at::Tensor& t = input ? batch.x : batch.y;
    if (t.scalar_type() != at::kLong || t.numel() == 0) continue;
    const int64_t per_row = t.numel() / t.size(0);
    const int64_t* v = t.data_ptr<int64_t>();
    for (int64_t row = 0; row < t.size(0); ++row) {
      const int64_t* ids = v + row * per_row;
      const int64_t k =
          std::find_if(ids, ids + per_row, [&](int64_t id) { return id < 0 || id >= vocab_size; }) -
          ids;
      if (k == per_row) continue;
      const int64_t index = batch.indices[row].item<int64_t>();
      return absl::InvalidArgumentError(
          absl::StrCat(place(index, index_.Locate(index), input, k, per_row), ": ",
                       input ? "input" : "target", " token id ", ids[k],
                       " is not in [0, model.transformer_lm.vocab_size ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardFormat::CheckClasses(int64_t index, const std::string& path, int64_t offset,
                                       const int64_t* classes) const {
  if (options_.num_classes <= 0) return absl::OkStatus();
  for (int64_t i = 0; i < ElementCount(batch_shape_.y); ++i) {
    if (classes[i] < 0 || classes[i] >= options_.num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.shards: ", path, " at byte offset ", offset, " (sample ", index, "): class ",
          classes[i], " is outside [0, data.shards.num_classes ", options_.num_classes, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace chorus
