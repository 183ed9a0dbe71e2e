#include "worker/train/shard_reader.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/output_limits.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

// Shard files a reader keeps open at once; more are opened again as needed
// (the streamed order reads one or two shards at a time).
constexpr size_t kMaxOpenFiles = 16;

// Note [Parallel reads]: the threads that read batches.
constexpr int kReadThreads = 2;

// Note [Grouped reads]: the most batches a reading thread claims at once,
// the most samples one preadv reads, and how far apart (a tar header and
// padding) two samples may lie to be read by one.
constexpr int64_t kMaxGroupBatches = 64;
constexpr int64_t kMaxRun = (IOV_MAX - 1) / 2;
constexpr int64_t kRunGap = int64_t{4} << 10;

// Note [Cold reads]: ranges this close are read ahead as one, in pieces of kAdviseChunk.
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
constexpr int64_t kCountingSpan = 4;

// The positions of `indices[0..n)` in ascending order of their values
// (equal values in their order), into `order`; `counts` is scratch.
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

// The byte ranges to read ahead for samples `next`, by shard, in file order
// (Note [Samples in file order]), into `where`: a sample's members as one
// range, or a TENSOR_FILES sample's two rows (far apart) as two.
void RangesInFileOrder(const ShardIndex& index, const std::vector<int64_t>& next,
                       std::vector<int64_t>& positions, std::vector<int64_t>& counts,
                       std::vector<std::pair<int, ByteRange>>& where) {
  const bool rows = index.format() == v1::ShardedData::TENSOR_FILES;
  SortPositionsByIndex(next.data(), static_cast<int64_t>(next.size()), positions, counts);
  where.clear();
  for (const int64_t at : positions) {
    const SampleLocation loc = index.Locate(next[at]);
    if (rows) {
      where.emplace_back(loc.shard, loc.x);
      where.emplace_back(loc.shard, loc.y);
    } else {
      const int64_t b = std::min(loc.x.offset, loc.y.offset);
      where.emplace_back(loc.shard, ByteRange{b, std::max(loc.x.end(), loc.y.end()) - b});
    }
  }
  if (rows) {  // the x rows and the y rows lie in two regions of the file
    std::sort(where.begin(), where.end(), [](const auto& a, const auto& b) {
      return std::pair(a.first, a.second.offset) < std::pair(b.first, b.second.offset);
    });
  }
}

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

// A TAR or TOKENS sample's bytes in its file: its members and what lies
// between them.
ByteRange SpanOf(const SampleLocation& loc) {
  const int64_t begin = std::min(loc.x.offset, loc.y.offset);
  return ByteRange{begin, std::max(loc.x.end(), loc.y.end()) - begin};
}

at::ScalarType OutputType(bool to_float) { return to_float ? at::kFloat : at::kLong; }

std::vector<int64_t> WithBatch(int64_t n, const std::vector<int64_t>& shape) {
  std::vector<int64_t> out = {n};
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

int64_t Count(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// A member suffix's last extension, which says how the member is read:
// "x.npy" and WebDataset's bare "npy" are both .npy members.
absl::string_view MemberExtension(absl::string_view suffix) {
  const size_t dot = suffix.rfind('.');
  return dot == absl::string_view::npos ? suffix : suffix.substr(dot + 1);
}

bool IsPtMember(const std::string& suffix) {
  const absl::string_view ext = MemberExtension(suffix);
  return ext == "pt" || ext == "pth";
}

// Note [Text label members].
bool IsTextMember(const std::string& suffix) {
  const absl::string_view ext = MemberExtension(suffix);
  return ext == "cls" || ext == "txt" || ext == "json";
}

std::optional<ElementType> TorchElementType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ElementType::kFloat32;
    case at::kDouble:
      return ElementType::kFloat64;
    case at::kChar:
      return ElementType::kInt8;
    case at::kByte:
      return ElementType::kUInt8;
    case at::kShort:
      return ElementType::kInt16;
    case at::kInt:
      return ElementType::kInt32;
    case at::kLong:
      return ElementType::kInt64;
    default:
      return std::nullopt;
  }
}

// Note [Batch buffers]: an uninitialized tensor whose memory, from 2 MiB
// on, may be backed by transparent huge pages.
at::Tensor HugePageEmpty(const std::vector<int64_t>& shape, at::ScalarType type) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t bytes = Count(shape) * c10::elementSize(type);
  void* p = nullptr;
  if (bytes < kHugePage || ::posix_memalign(&p, kHugePage, bytes) != 0) {
    return at::empty(shape, type);
  }
  ::madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // a hint: an error changes nothing
  return at::from_blob(
      p, shape, [](void* q) { std::free(q); }, at::TensorOptions().dtype(type));
}

}  // namespace

// Note [.pt members]
// A .pt member is the bytes of torch.save(tensor): a zip archive that
// LibTorch's pickle_load reads whole (its values are copied once more than
// a .npy member's, which is parsed in place). The tensor is made contiguous
// and its values converted into the batch row as a .npy member's are.
absl::StatusOr<PtMember> ParsePtMember(const char* bytes, int64_t size) {
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(std::vector<char>(bytes, bytes + size));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a torch.save file (", e.what_without_backtrace(), ")"));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not a torch.save file (", e.what(), ")"));
  }
  if (!value.isTensor()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "holds a ", value.tagKind(), ", not a tensor: a .pt member must be torch.save(tensor)"));
  }
  PtMember m;
  m.tensor = value.toTensor().contiguous();
  const std::optional<ElementType> type = TorchElementType(m.tensor.scalar_type());
  if (!type || !m.tensor.is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("holds a tensor of ", c10::toString(m.tensor.scalar_type()),
                     ", which is not read (float32, float64, int8, uint8, int16, int32 and int64 "
                     "are)"));
  }
  m.array.type = *type;
  m.array.shape = m.tensor.sizes().vec();
  m.array.data_offset = 0;
  return m;
}

// Note [Text label members]
// WebDataset writes a class label as a member KEY.cls (or .txt, or .json)
// holding the integer as text, str(label) or json.dumps(label), perhaps
// with a newline after it. Such a target member is read as a .npy member
// holding one int64 would be: shape (), every sample the same.
absl::StatusOr<int64_t> ParseTextLabel(const char* bytes, int64_t size) {
  const absl::string_view text(bytes, static_cast<size_t>(size));
  const absl::string_view number = absl::StripAsciiWhitespace(text);
  int64_t label = 0;
  if (!number.empty() && (absl::ascii_isdigit(number[0]) || number[0] == '-') &&
      absl::SimpleAtoi(number, &label)) {
    return label;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "holds \"", EscapeErrorText(text, 64),
      "\", not one integer: a .cls, .txt or .json target member must hold an integer class "
      "label as text (as WebDataset writes one)"));
}

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Open(const v1::ShardedData& spec,
                                                               const ShardReaderOptions& options) {
  ASSIGN_OR_RETURN(ShardIndex index, ShardIndex::Build(spec));
  std::unique_ptr<ShardReader> r(new ShardReader(std::move(index), options));
  r->states_.resize(kReadThreads);
  for (ReadState& state : r->states_) state.fds.assign(r->index_.shards().size(), -1);
  r->read_ahead_bytes_ = spec.read_ahead_bytes();
  if (spec.format() == v1::ShardedData::TOKENS) {
    const ElementType t =
        spec.token_type() == v1::ShardedData::UINT32 ? ElementType::kUInt32 : ElementType::kUInt16;
    r->layout_ = Layout{t, t, {spec.sequence_length()}, {spec.sequence_length()}};
  } else if (spec.format() == v1::ShardedData::TENSOR_FILES) {
    // ShardIndex::Build checked that every shard has the first's rows.
    const ShardIndex::Shard& s = r->index_.shards()[0];
    r->layout_ = Layout{s.x_rows.type, s.y_rows.type, s.x_rows.shape, s.y_rows.shape};
  } else {
    // The first sample's members set the layout every sample must have.
    r->x_pt_ = IsPtMember(spec.input_member());
    r->y_pt_ = IsPtMember(spec.target_member());
    r->y_text_ = IsTextMember(spec.target_member());
    const SampleLocation first = r->index_.Locate(0);
    ASSIGN_OR_RETURN(const int fd, r->File(r->states_[0], first.shard));
    const std::string& path = r->index_.shards()[first.shard].path;
    Layout& l = r->layout_;
    ASSIGN_OR_RETURN(const NpyArray x, r->ProbeMember(fd, path, first.x, r->x_pt_, false,
                                                      &l.x_header));
    ASSIGN_OR_RETURN(const NpyArray y, r->ProbeMember(fd, path, first.y, r->y_pt_, r->y_text_,
                                                      &l.y_header));
    l.x_type = x.type;
    l.y_type = y.type;
    l.x_shape = x.shape;
    l.y_shape = y.shape;
  }
  const SampleLocation first_place = r->index_.Locate(0);
  r->sample_span_ = spec.format() == v1::ShardedData::TENSOR_FILES
                        ? first_place.x.size + first_place.y.size
                        : std::max(first_place.x.end(), first_place.y.end()) -
                              std::min(first_place.x.offset, first_place.y.offset);
  ASSIGN_OR_RETURN(ShardBatch first,
                   r->ReadBatch(r->states_[0], std::vector<int64_t>{0}.data(), 1));
  r->probe_.x = first.x;
  r->probe_.y = first.y;
  r->probe_.num_classes = options.vocab_size > 0 ? static_cast<int>(options.vocab_size)
                                                  : spec.num_classes();
  if (options.vocab_size > 0 && spec.format() != v1::ShardedData::TOKENS &&
      (first.x.scalar_type() != at::kLong || first.y.scalar_type() != at::kLong)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.shards: ", r->index_.shards()[0].path,
        ": model.transformer_lm needs integer token ids as input and target; this shard's "
        "first sample holds ",
        c10::toString(first.x.scalar_type()), " -> ", c10::toString(first.y.scalar_type())));
  }
  return r;
}

absl::StatusOr<NpyArray> ShardReader::ProbeMember(int fd, const std::string& path,
                                                  const ByteRange& range, bool pt, bool text,
                                                  std::string* header) const {
  std::vector<char> bytes(range.size);
  if (::pread(fd, bytes.data(), range.size, range.offset) != range.size) {
    return absl::DataLossError(
        absl::StrCat("data.shards: cannot read ", path, " at byte offset ", range.offset));
  }
  absl::StatusOr<NpyArray> a;
  if (text) {  // Note [Text label members]
    absl::StatusOr<int64_t> label = ParseTextLabel(bytes.data(), range.size);
    a = label.ok() ? absl::StatusOr<NpyArray>(NpyArray{ElementType::kInt64, {}, 0})
                   : label.status();
  } else if (pt) {
    absl::StatusOr<PtMember> m = ParsePtMember(bytes.data(), range.size);
    a = m.ok() ? absl::StatusOr<NpyArray>(m->array) : m.status();
  } else {
    a = ParseNpy(bytes.data(), range.size);
  }
  if (!a.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.shards: ", path, " at byte offset ", range.offset,
                     " (sample 0, member \"", TarMemberNameAt(path, range.offset),
                     "\"): ", a.status().message()));
  }
  if (!pt && !text) header->assign(bytes.data(), a->data_offset);
  return a;
}

ShardReader::~ShardReader() {
  Stop();
  for (const ReadState& state : states_) {
    for (int fd : state.fds) {
      if (fd >= 0) ::close(fd);
    }
  }
}

void ShardReader::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : readers_) t.join();
  readers_.clear();
  if (advisor_.joinable()) advisor_.join();
}

void ShardReader::Start(std::vector<int64_t> indices, int64_t batch_size) {
  const int64_t count = static_cast<int64_t>(indices.size());
  auto list = std::make_shared<const std::vector<int64_t>>(std::move(indices));
  Start(Samples{count, [list, at = size_t{0}]() mutable { return (*list)[at++]; }}, batch_size);
}

void ShardReader::Start(Samples samples, int64_t batch_size) {
  Stop();
  absl::MutexLock lock(&mu_);
  ready_.clear();
  ready_bytes_ = 0;
  error_ = absl::OkStatus();
  stop_ = false;
  batches_left_ = (samples.count + batch_size - 1) / batch_size;
  {
    // Note [Batch buffers]: the pool outlives an epoch; batches of another
    // size (an epoch's last, shorter batch) are dropped.
    absl::MutexLock pool_lock(&pool_mu_);
    pool_.erase(std::remove_if(pool_.begin(), pool_.end(),
                               [&](const Pooled& p) { return p.batch.x.size(0) != batch_size; }),
                pool_.end());
  }
  pool_limit_ = read_ahead_bytes_ / std::max<int64_t>(1, BatchBytes(batch_size)) + 3;
  batch_size_ = batch_size;
  claimed_ = 0;
  queued_ = 0;
  reading_at_ = 0;
  advised_ = 0;
  // Note [Grouped reads]: half the read-ahead buffer's batches, at least one.
  group_batches_ = std::max<int64_t>(
      1, std::min(kMaxGroupBatches, read_ahead_bytes_ / 2 / BatchBytes(batch_size)));
  // Note [Cold reads]: read_ahead_bytes of samples as stored, at least
  // kMinAdviseBytes and at most kMaxAdviseWindow samples (the advisor holds
  // their places), and at least two groups: a reading thread waits for the
  // advisor to have read ahead its whole group, and the advisor moves on
  // by a quarter window, which a window of two groups always leaves room
  // for.
  const int64_t window =
      std::max(2 * group_batches_ * batch_size,
               std::min(kMaxAdviseWindow, std::max(read_ahead_bytes_, kMinAdviseBytes) /
                                              std::max<int64_t>(1, sample_span_)));
  advisor_ = std::thread(&ShardReader::Advise, this, samples, window);
  samples_ = std::move(samples);  // the readers draw from their own copy
  for (ReadState& state : states_) readers_.emplace_back(&ShardReader::Run, this, std::ref(state));
}

int64_t ShardReader::BatchBytes(int64_t n) const {
  const bool tokens = index_.format() == v1::ShardedData::TOKENS;
  const int64_t x = Count(layout_.x_shape) *
                    (tokens || !(IsFloating(layout_.x_type) || options_.float_inputs) ? 8 : 4);
  const int64_t y = Count(layout_.y_shape) * (tokens || !IsFloating(layout_.y_type) ? 8 : 4);
  return n * (x + y + 8);
}

// Note [Cold reads]
// Within a block of the streamed order (Note [Streamed order] in
// sampler.cc) a rank's samples come in shuffled order, so its reads hop
// around the block: the kernel's read-ahead, which follows sequential
// reads, sees 17 KB reads at random offsets, and a cold disk serves them
// one by one. So a second thread, the advisor, reads ahead of the reader
// what it reads next: the byte ranges of its next read_ahead_bytes of
// samples (their size in the file), sorted and merged where less than
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
// disk busy, and a smaller piece copies less into `chunk` at a time.
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
void ShardReader::Advise(Samples samples, int64_t window) {
  ::pthread_setname_np(::pthread_self(), "chorus-advise");
  const int64_t n = samples.count;
  // Samples are advised in steps of a quarter window, as the reader moves.
  const int64_t step = std::max<int64_t>(1, window / 4);
  int fd = -1, fd_shard = -1;
  std::vector<std::pair<int, ByteRange>> where;
  std::vector<int64_t> next, positions, counts;
  std::vector<char> chunk(kAdviseChunk);
  for (int64_t advised = 0; advised < n;) {
    int64_t to = 0;
    {
      absl::MutexLock lock(&mu_);
      struct Ahead {
        ShardReader* reader;
        int64_t advised, window, step, n;
      } ahead{this, advised, window, step, n};
      mu_.Await(absl::Condition(
          +[](Ahead* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            const int64_t room = std::min(a->n, a->reader->reading_at_ + a->window) - a->advised;
            return a->reader->stop_ || room >= std::min(a->step, a->n - a->advised);
          },
          &ahead));
      if (stop_) break;
      to = std::min(n, reading_at_ + window);
    }
    next.clear();
    for (int64_t i = advised; i < to; ++i) next.push_back(samples.next());
    RangesInFileOrder(index_, next, positions, counts, where);
    advised = to;
    auto advise = [&](int shard, int64_t begin, int64_t end) {
      if (shard != fd_shard) {
        if (fd >= 0) ::close(fd);
        fd = ::open(index_.shards()[shard].path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd >= 0) ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        fd_shard = shard;
      }
      if (fd >= 0 && AllCached(fd, begin, end)) return;
      for (int64_t at = begin; fd >= 0 && at < end; at += kAdviseChunk) {
        const int64_t size = std::min(kAdviseChunk, end - at);
        char last;
        iovec probe = {&last, 1};
        if (::preadv2(fd, &probe, 1, at + size - 1, RWF_NOWAIT) == 1) continue;  // cached
        if (::pread(fd, chunk.data(), size, at) <= 0) break;  // the reader says why
      }
    };
    int shard = -1;
    int64_t begin = 0, end = 0;
    for (const auto& [in, range] : where) {
      if (in == shard && range.offset <= end + kAdviseGap) {
        end = std::max(end, range.end());
        continue;
      }
      if (shard >= 0) advise(shard, begin, end);
      shard = in;
      begin = range.offset;
      end = range.end();
    }
    if (shard >= 0) advise(shard, begin, end);
    absl::MutexLock lock(&mu_);
    advised_ = advised;
  }
  if (fd >= 0) ::close(fd);
}

// Note [Parallel reads]
// Reading a batch from the page cache is the kernel's copy of its bytes
// (preadv, straight into the batch's rows) and the headers' checks; on the
// bench machine one thread read 4.2 MB batches at about half the speed of
// `cat` (whose 128 KiB buffer stays in the CPU's cache, where a batch
// cannot), so a data-bound step waited for every batch. So kReadThreads
// threads read, each a group of batches at a time (Note [Grouped reads]):
// under mu_ a thread claims the next batches of the stream and draws their
// sample numbers (so batches are drawn in the stream's order), reads them
// without the lock, and puts them in the queue when the batches before
// them are there (queued_), so Next() returns them in order. A batch's
// bytes count against read_ahead_bytes from its claim on, so the memory
// bound holds with batches in flight. A read error is queued in its
// batch's place: Next() returns the batches before it, then the error.
void ShardReader::Run(ReadState& state) {
  ::pthread_setname_np(::pthread_self(), "chorus-read");  // as top and perf show it
  std::vector<int64_t> indices;
  std::vector<ShardBatch> read;
  for (;;) {
    int64_t first = 0, count = 0, batch_size = 0;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ShardReader* r) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            if (r->stop_ || !r->error_.ok() || r->reading_at_ >= r->samples_.count) return true;
            const int64_t end = r->GroupEnd();
            // Note [Cold reads]: the advisor stays a window ahead. Room for
            // this group: with nothing queued or in flight there always is
            // (a batch larger than the buffer is still read, one at a time).
            return r->advised_ >= end &&
                   (r->ready_bytes_ == 0 ||
                    r->ready_bytes_ + r->BatchBytes(end - r->reading_at_) <= r->read_ahead_bytes_);
          },
          this));
      if (stop_ || !error_.ok() || reading_at_ >= samples_.count) return;
      const int64_t end = GroupEnd();
      first = claimed_;
      count = end - reading_at_;
      claimed_ += (count + batch_size_ - 1) / batch_size_;
      reading_at_ = end;
      ready_bytes_ += BatchBytes(count);
      max_ready_bytes_ = std::max(max_ready_bytes_, ready_bytes_);
      batch_size = batch_size_;
      indices.resize(count);
      for (int64_t& i : indices) i = samples_.next();
    }
    const absl::Status status = ReadGroup(state, indices.data(), count, batch_size, read);
    absl::MutexLock lock(&mu_);
    struct Turn {
      ShardReader* reader;
      int64_t batch;
    } turn{this, first};
    mu_.Await(absl::Condition(
        +[](Turn* t) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return t->reader->stop_ || !t->reader->error_.ok() || t->reader->queued_ == t->batch;
        },
        &turn));
    if (stop_ || !error_.ok()) return;
    for (ShardBatch& batch : read) ready_.push_back(std::move(batch));
    queued_ += static_cast<int64_t>(read.size());
    if (!status.ok()) {
      error_ = status;
      return;
    }
  }
}

int64_t ShardReader::GroupEnd() const {
  // Note [Grouped reads]: no larger than what was claimed before it, so
  // that the first batches after a Start() come one at a time.
  const int64_t batches = std::min(group_batches_, std::max<int64_t>(1, claimed_));
  return std::min(samples_.count, reading_at_ + batches * batch_size_);
}

absl::StatusOr<ShardBatch> ShardReader::Next() {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  if (batches_left_ == 0) {
    return absl::FailedPreconditionError("the shard reader has no batch left in this epoch");
  }
  mu_.Await(absl::Condition(
      +[](ShardReader* r)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return !r->ready_.empty() || !r->error_.ok(); },
      this));
  wait_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
  if (ready_.empty()) return error_;
  ShardBatch batch = std::move(ready_.front());
  ready_.pop_front();
  {
    absl::MutexLock pool_lock(&pool_mu_);
    ++handed_;
    for (Pooled& p : pool_) {
      if (p.batch.x.is_same(batch.x)) p.handed = handed_;
    }
  }
  ready_bytes_ -= BatchBytes(batch.x.size(0));
  --batches_left_;
  return batch;
}

ShardReader::Stats ShardReader::stats() const {
  absl::MutexLock lock(&mu_);
  return Stats{wait_seconds_, bytes_read_.load(), reads_.load(), max_ready_bytes_};
}

absl::StatusOr<int> ShardReader::File(ReadState& state, int shard) {
  if (state.fds[shard] >= 0) return state.fds[shard];
  const std::string& path = index_.shards()[shard].path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("data.shards: cannot open ", path, ": ", std::strerror(errno)));
  }
  // Note [Cold reads]: the advisor has the kernel read ahead; the reader's
  // own reads hop around a block and would only start read-ahead of bytes
  // it does not read next.
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  if (state.open_order.size() >= kMaxOpenFiles) {
    ::close(state.fds[state.open_order.front()]);
    state.fds[state.open_order.front()] = -1;
    state.open_order.pop_front();
  }
  state.fds[shard] = fd;
  state.open_order.push_back(shard);
  return fd;
}

// Note [Batch buffers]
// A batch's tensors come from a pool the reading threads share: a pooled
// batch is free again once neither the queue nor the trainer holds any view
// of its tensors (every reference to a TensorImpl or its storage is
// counted). Fresh 4 MB buffers for every batch cost a page fault per 4 KiB
// (a third of the reader's time in the data-bound bench); reused ones are
// already mapped. The pool holds at most what the queue may hold plus
// three batches, so the memory bound of shard_reader.h stands, and it is
// kept from one Start() (epoch) to the next. The pool still fills once per
// reader, as deep as the queue gets (14 batches of the bench's 64 with 64
// MiB of read-ahead); an input buffer of 2 MiB or more is therefore
// 2 MiB-aligned and advised MADV_HUGEPAGE, so that where transparent huge
// pages are enabled ("madvise" or "always") its first touch faults once per
// 2 MiB instead of 512 times.
ShardBatch ShardReader::NewBatch(int64_t n) {
  auto free = [](const at::Tensor& t) {
    return t.use_count() == 1 && t.storage().use_count() == 1;
  };
  // Only the pool hands out a pooled batch, under pool_mu_: one found free
  // here stays this thread's. Of the free ones, the one the trainer was
  // given last, whose memory is the likeliest to be in the CPU's cache.
  absl::MutexLock lock(&pool_mu_);
  const Pooled* newest = nullptr;
  for (const Pooled& p : pool_) {
    const ShardBatch& b = p.batch;
    if (b.x.size(0) == n && free(b.indices) && free(b.x) && free(b.y) &&
        (newest == nullptr || p.handed > newest->handed)) {
      newest = &p;
    }
  }
  if (newest != nullptr) return newest->batch;
  const bool tokens = index_.format() == v1::ShardedData::TOKENS;
  const bool float_x = !tokens && (IsFloating(layout_.x_type) || options_.float_inputs);
  const bool float_y = !tokens && IsFloating(layout_.y_type);
  ShardBatch batch;
  batch.indices = at::empty({n}, at::kLong);
  batch.x = HugePageEmpty(WithBatch(n, layout_.x_shape), OutputType(float_x));
  batch.y = at::empty(WithBatch(n, layout_.y_shape), OutputType(float_y));
  if (static_cast<int64_t>(pool_.size()) < pool_limit_) pool_.push_back(Pooled{batch, 0});
  return batch;
}

absl::StatusOr<ShardBatch> ShardReader::ReadBatch(ReadState& state, const int64_t* indices,
                                                  int64_t n) {
  std::vector<ShardBatch> read;
  RETURN_IF_ERROR(ReadGroup(state, indices, n, n, read));
  return std::move(read[0]);
}

// Note [Grouped reads]
// From the page cache a read of one sample (preadv of its 17 KB: header
// and target into the scratch buffer, values into the batch row) costs a
// system call and a page-cache lookup besides the copy: on the bench
// machine such reads moved 12-13 GB/s, while one preadv over 300
// neighbouring samples (the same three parts each) moved 21 GB/s, `cat`'s
// speed. A reading thread therefore claims a group of batches, half the
// read-ahead buffer (so that one group is trained while the next is read),
// and reads its samples in file order, each run of neighbours (less than
// kRunGap apart: a tar header and padding) with one preadv of up to
// kMaxRun samples. How many samples are neighbours depends on how much of
// a shuffle block the group holds: a rank alone reads every sample of the
// block, and a group of at least shuffle_buffer samples starting at a
// block's start reads it in runs (the epoch's blocks start at position 0);
// a rank of N reads one sample in N, mostly alone, as before. A run's
// samples are checked as a lone sample's are; a run that fails to read is
// read again sample by sample, so that the error names the sample.
// After a Start() the groups grow (a batch, a batch, two, four, ...: never
// more than was claimed before), so that the first step waits for one
// batch, not for half the buffer: with whole groups from the start the
// compute-bound bench's 80-step shard jobs took 1.009-1.040 of the
// in-memory job's time (the first step waited for 64 batches), with
// growing groups 1.005-1.007.
absl::Status ShardReader::ReadGroup(ReadState& state, const int64_t* indices, int64_t n,
                                    int64_t batch_size, std::vector<ShardBatch>& out) {
  out.clear();
  const int64_t batches = (n + batch_size - 1) / batch_size;
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t size = std::min(batch_size, n - b * batch_size);
    out.push_back(NewBatch(size));
    std::memcpy(out.back().indices.data_ptr<int64_t>(), indices + b * batch_size,
                size * sizeof(int64_t));
  }
  // In file order, so that a rank's reads of a block move forward through
  // the shard; each sample lands in its own batch and row.
  // Note [Samples in file order].
  SortPositionsByIndex(indices, n, state.positions, state.counts);
  std::vector<Placement>& order = state.order;
  order.resize(n);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t at = state.positions[k];
    order[k] = Placement{at, index_.Locate(indices[at])};
  }
  // The first batch with an error, and its error: the batches before it
  // are still read and returned.
  int64_t failed = batches;
  absl::Status error;
  auto fail = [&](int64_t at, absl::Status status) {
    if (at / batch_size < failed) {
      failed = at / batch_size;
      error = std::move(status);
    }
  };
  const bool direct = DirectTar(out[0]);
  for (size_t i = 0; i < order.size();) {
    const size_t end = RunEnd(order, i, direct);
    if (end - i > 1 && ReadRun(state, indices, &order[i], end - i, batch_size, out, fail)) {
      i = end;
      continue;
    }
    for (; i < end; ++i) {
      const Placement& p = order[i];
      if (p.at / batch_size >= failed) continue;
      absl::Status s =
          ReadSample(state, indices[p.at], p.loc, p.at % batch_size, out[p.at / batch_size]);
      if (!s.ok()) fail(p.at, std::move(s));
    }
  }
  if (options_.vocab_size > 0 && index_.format() != v1::ShardedData::TOKENS) {
    std::vector<SampleLocation> where(n);  // by place in the group
    for (const Placement& p : order) where[p.at] = p.loc;
    for (int64_t b = 0; b < failed; ++b) {
      absl::Status s = CheckTokens(out[b], &where[b * batch_size]);
      if (!s.ok()) fail(b * batch_size, std::move(s));
    }
  }
  out.resize(failed);
  return error;
}

bool ShardReader::DirectTar(const ShardBatch& batch) const {
  const bool same_type =
      (layout_.x_type == ElementType::kFloat32 && batch.x.scalar_type() == at::kFloat) ||
      (layout_.x_type == ElementType::kInt64 && batch.x.scalar_type() == at::kLong);
  return index_.format() == v1::ShardedData::TAR && !x_pt_ && same_type;
}

size_t ShardReader::RunEnd(const std::vector<Placement>& order, size_t begin,
                           bool direct) const {
  const int64_t values = Count(layout_.x_shape) * ElementBytes(layout_.x_type);
  if (!direct || order[begin].loc.x.size <= values) return begin + 1;
  size_t end = begin + 1;
  while (end < order.size() && static_cast<int64_t>(end - begin) < kMaxRun) {
    const SampleLocation& last = order[end - 1].loc;
    const SampleLocation& next = order[end].loc;
    const int64_t gap = SpanOf(next).offset - SpanOf(last).end();
    if (next.shard != last.shard || gap < 0 || gap > kRunGap || next.x.size <= values) break;
    ++end;
  }
  return end;
}

bool ShardReader::ReadRun(ReadState& state, const int64_t* indices, const Placement* run,
                          int64_t count, int64_t batch_size, std::vector<ShardBatch>& out,
                          const std::function<void(int64_t, absl::Status)>& fail) {
  const int64_t values = Count(layout_.x_shape) * ElementBytes(layout_.x_type);
  const int64_t begin = SpanOf(run[0].loc).offset;
  const int64_t total = SpanOf(run[count - 1].loc).end() - begin;
  // The scratch buffer takes every byte of the run but the values, in file
  // order: the k-th sample's bytes before its values lie k values earlier
  // in it than in the file, those after them k + 1 values earlier.
  std::vector<char>& scratch = state.scratch;
  scratch.resize(total - count * values);
  std::vector<iovec>& parts = state.parts;
  parts.clear();
  char* into = scratch.data();
  int64_t at = begin;
  for (int64_t k = 0; k < count; ++k) {
    const Placement& p = run[k];
    const int64_t values_at = p.loc.x.end() - values;
    parts.push_back({into, static_cast<size_t>(values_at - at)});
    into += values_at - at;
    ShardBatch& batch = out[p.at / batch_size];
    parts.push_back({static_cast<char*>(batch.x.data_ptr()) + (p.at % batch_size) * values,
                     static_cast<size_t>(values)});
    at = p.loc.x.end();
  }
  parts.push_back({into, static_cast<size_t>(begin + total - at)});
  const absl::StatusOr<int> fd = File(state, run[0].loc.shard);
  if (!fd.ok()) return false;
  ssize_t r;
  do {
    r = ::preadv(*fd, parts.data(), static_cast<int>(parts.size()), begin);
  } while (r < 0 && errno == EINTR);
  if (r != total) return false;  // read again sample by sample, which says why
  bytes_read_.fetch_add(total);
  reads_.fetch_add(1);
  const std::string& path = index_.shards()[run[0].loc.shard].path;
  for (int64_t k = 0; k < count; ++k) {
    const Placement& p = run[k];
    const char* x_header = scratch.data() + (p.loc.x.offset - begin) - k * values;
    const char* y_bytes = scratch.data() + (p.loc.y.offset - begin) -
                          (p.loc.y.offset < p.loc.x.offset ? k : k + 1) * values;
    absl::Status s = CheckDirect(indices[p.at], path, p.loc, x_header, y_bytes,
                                 p.at % batch_size, out[p.at / batch_size]);
    if (!s.ok()) fail(p.at, std::move(s));
  }
  return true;
}

// Note [Token samples]
// TAR and TENSOR_FILES samples of token ids (a transformer_lm's) are read as
// any other; their ids must lie in [0, vocab_size), or the embedding would fail
// far from the file.
absl::Status ShardReader::CheckTokens(const ShardBatch& batch,
                                      const SampleLocation* where) const {
  for (const bool input : {true, false}) {
    const at::Tensor& t = input ? batch.x : batch.y;
    if (t.scalar_type() != at::kLong || t.numel() == 0) continue;
    const int64_t per_row = t.numel() / t.size(0);
    const int64_t* v = t.data_ptr<int64_t>();
    for (int64_t row = 0; row < t.size(0); ++row) {
      const int64_t* ids = v + row * per_row;
      const int64_t k = std::find_if(ids, ids + per_row,
                                     [&](int64_t t) { return t < 0 || t >= options_.vocab_size; }) -
                        ids;
      if (k == per_row) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          TokenPlace(batch.indices[row].item<int64_t>(), where[row], input, k, per_row), ": ",
          input ? "input" : "target", " token id ", ids[k],
          " is not in [0, model.transformer_lm.vocab_size ", options_.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

std::string ShardReader::TokenPlace(int64_t index, const SampleLocation& loc, bool input,
                                    int64_t k, int64_t count) const {
  const ByteRange& member = input ? loc.x : loc.y;
  const std::string& path = index_.shards()[loc.shard].path;
  const int bytes = ElementBytes(input ? layout_.x_type : layout_.y_type);
  if (index_.format() == v1::ShardedData::TENSOR_FILES) {  // the row's values alone
    return absl::StrCat("data.shards: ", path, " at byte offset ", member.offset + k * bytes,
                        " (sample ", index, ", element ", k, " of its ", input ? "x" : "y",
                        " row)");
  }
  const std::string name = TarMemberNameAt(path, member.offset);
  if (input ? x_pt_ : y_pt_) {  // Note [.pt members]: where its values lie is torch.save's
    return absl::StrCat("data.shards: ", path, " at byte offset ", member.offset, " (sample ",
                        index, ", element ", k, " of member \"", name, "\")");
  }
  // A .npy member's values end it.
  return absl::StrCat("data.shards: ", path, " at byte offset ",
                      member.end() - (count - k) * bytes, " (sample ", index, ", element ", k,
                      " of member \"", name, "\")");
}

absl::Status ShardReader::ReadSample(ReadState& state, int64_t index, const SampleLocation& loc,
                                     int64_t row, ShardBatch& batch) {
  const ByteRange range = SpanOf(loc);
  ASSIGN_OR_RETURN(const int fd, File(state, loc.shard));
  if (index_.format() == v1::ShardedData::TENSOR_FILES) {
    return ReadRows(state, index, loc, fd, row, batch);
  }
  std::vector<char>& scratch = state.scratch;
  const std::string& path = index_.shards()[loc.shard].path;
  auto read_error = [&](int64_t at, ssize_t r) {
    return absl::DataLossError(
        absl::StrCat("data.shards: cannot read ", path, " at byte offset ", at,
                     r >= 0 ? ": the file is shorter than when it was indexed"
                            : absl::StrCat(": ", std::strerror(errno))));
  };
  // Note [Batch buffers]: an input stored as it is trained (float32, or
  // int64 tokens ids) is read straight into its row, around it the headers
  // and the target into the scratch buffer.
  const int64_t values = Count(layout_.x_shape) * ElementBytes(layout_.x_type);
  if (DirectTar(batch) && loc.x.size > values) {
    const int64_t head = loc.x.end() - values - range.offset;
    const int64_t tail = range.end() - loc.x.end();
    scratch.resize(head + tail);
    char* x_row = static_cast<char*>(batch.x.data_ptr()) + row * values;
    iovec parts[3] = {{scratch.data(), static_cast<size_t>(head)},
                      {x_row, static_cast<size_t>(values)},
                      {scratch.data() + head, static_cast<size_t>(tail)}};
    const ssize_t r = ::preadv(fd, parts, 3, range.offset);
    if (r != range.size) return read_error(range.offset, r);
    bytes_read_.fetch_add(range.size);
    reads_.fetch_add(1);
    const char* y_bytes = loc.y.offset < loc.x.offset
                              ? scratch.data() + (loc.y.offset - range.offset)
                              : scratch.data() + head + (loc.y.offset - loc.x.end());
    return CheckDirect(index, path, loc, scratch.data() + (loc.x.offset - range.offset), y_bytes,
                       row, batch);
  }
  scratch.resize(range.size);
  int64_t got = 0;
  while (got < range.size) {
    const ssize_t r = ::pread(fd, scratch.data() + got, range.size - got, range.offset + got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return read_error(range.offset + got, r);
    got += r;
  }
  bytes_read_.fetch_add(range.size);
  reads_.fetch_add(1);
  return Decode(index, scratch.data(), range, row, batch.x, batch.y);
}

absl::Status ShardReader::CheckDirect(int64_t index, const std::string& path,
                                      const SampleLocation& loc, const char* x_header,
                                      const char* y_bytes, int64_t row, ShardBatch& batch) const {
  const int64_t header = loc.x.size - Count(layout_.x_shape) * ElementBytes(layout_.x_type);
  const std::string& known = layout_.x_header;
  if (header != static_cast<int64_t>(known.size()) ||
      std::memcmp(x_header, known.data(), known.size()) != 0) {
    absl::StatusOr<NpyArray> a = ParseNpyHeader(x_header, header, loc.x.size);
    RETURN_IF_ERROR(CheckMember(index, path, loc.x, a, layout_.x_type, layout_.x_shape));
    if (a->data_offset != header) {  // a longer header than the values leave room for
      return CheckMember(index, path, loc.x,
                         absl::InvalidArgumentError("its .npy header is not where its size says"),
                         layout_.x_type, layout_.x_shape);
    }
  }
  return DecodeTarget(
      index, path, loc.y, y_bytes, batch.y.scalar_type() == at::kFloat,
      static_cast<char*>(batch.y.data_ptr()) + row * batch.y.stride(0) * batch.y.element_size());
}

absl::Status ShardReader::CheckMember(int64_t index, const std::string& path,
                                      const ByteRange& member, const absl::StatusOr<NpyArray>& a,
                                      ElementType type, const std::vector<int64_t>& shape) const {
  if (a.ok() && a->type == type && a->shape == shape) return absl::OkStatus();
  // An error only: the member's name is read from its tar header.
  const std::string where =
      absl::StrCat("data.shards: ", path, " at byte offset ", member.offset, " (sample ", index,
                   ", member \"", TarMemberNameAt(path, member.offset), "\"): ");
  if (!a.ok()) return absl::InvalidArgumentError(absl::StrCat(where, a.status().message()));
  const bool type_differs = a->type != type;
  const bool shape_differs = a->shape != shape;
  return absl::InvalidArgumentError(absl::StrCat(
      where, "this member holds ", ElementTypeName(a->type), " of shape ", ShapeString(a->shape),
      ", the first sample's ", ElementTypeName(type), " of shape ", ShapeString(shape), ": its ",
      type_differs && shape_differs ? "type and shape differ"
      : type_differs                ? "type differs"
                                    : "shape differs",
      "; every sample's member must have the same"));
}

absl::Status ShardReader::CheckClasses(int64_t index, const std::string& path, int64_t offset,
                                       const int64_t* classes) const {
  if (options_.num_classes <= 0) return absl::OkStatus();
  for (int64_t i = 0; i < Count(layout_.y_shape); ++i) {
    if (classes[i] < 0 || classes[i] >= options_.num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.shards: ", path, " at byte offset ", offset, " (sample ", index, "): class ",
          classes[i], " is outside [0, data.shards.num_classes ", options_.num_classes, ")"));
    }
  }
  return absl::OkStatus();
}

// Note [Tensor file shards] in shard_index.cc: a sample's x and y are rows
// of two tensors, far apart in the file; each is read on its own, x straight
// into its batch row when it is stored as it is trained.
absl::Status ShardReader::ReadRows(ReadState& state, int64_t index, const SampleLocation& loc,
                                   int fd, int64_t row, ShardBatch& batch) {
  const std::string& path = index_.shards()[loc.shard].path;
  for (const auto& [range, type, shape, out] :
       {std::tuple{loc.x, layout_.x_type, &layout_.x_shape, &batch.x},
        std::tuple{loc.y, layout_.y_type, &layout_.y_shape, &batch.y}}) {
    const bool to_float = out->scalar_type() == at::kFloat;
    char* dst = static_cast<char*>(out->data_ptr()) + row * out->stride(0) * out->element_size();
    const bool direct =
        (type == ElementType::kFloat32 && to_float) || (type == ElementType::kInt64 && !to_float);
    state.scratch.resize(range.size);
    char* into = direct ? dst : state.scratch.data();
    for (int64_t got = 0; got < range.size;) {
      const ssize_t r = ::pread(fd, into + got, range.size - got, range.offset + got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        return absl::DataLossError(
            absl::StrCat("data.shards: cannot read ", path, " at byte offset ", range.offset + got,
                         r == 0 ? ": the file is shorter than when it was indexed"
                                : absl::StrCat(": ", std::strerror(errno))));
      }
      got += r;
    }
    bytes_read_.fetch_add(range.size);
    reads_.fetch_add(1);
    if (!direct) ConvertElements(state.scratch.data(), type, Count(*shape), to_float, dst);
  }
  if (batch.y.scalar_type() == at::kFloat) return absl::OkStatus();
  return CheckClasses(index, path, loc.y.offset,
                      batch.y.data_ptr<int64_t>() + row * batch.y.stride(0));
}

absl::Status ShardReader::DecodeTarget(int64_t index, const std::string& path,
                                       const ByteRange& member, const char* bytes, bool to_float,
                                       char* out) const {
  if (y_text_) {  // Note [Text label members]: int64, shape (), as the first sample's
    const absl::StatusOr<int64_t> label = ParseTextLabel(bytes, member.size);
    RETURN_IF_ERROR(CheckMember(index, path, member,
                                label.ok() ? absl::StatusOr<NpyArray>(NpyArray{ElementType::kInt64})
                                           : label.status(),
                                layout_.y_type, layout_.y_shape));
    ConvertElements(reinterpret_cast<const char*>(&*label), ElementType::kInt64, 1, to_float, out);
  } else {
    RETURN_IF_ERROR(DecodeMember(index, path, member, bytes, y_pt_, layout_.y_type,
                                 layout_.y_shape, layout_.y_header, to_float, out));
  }
  if (to_float) return absl::OkStatus();
  return CheckClasses(index, path, member.offset, reinterpret_cast<const int64_t*>(out));
}

absl::Status ShardReader::DecodeMember(int64_t index, const std::string& path,
                                       const ByteRange& member, const char* bytes, bool pt,
                                       ElementType type, const std::vector<int64_t>& shape,
                                       const std::string& known, bool to_float, char* out) const {
  if (pt) {  // Note [.pt members]
    absl::StatusOr<PtMember> m = ParsePtMember(bytes, member.size);
    RETURN_IF_ERROR(CheckMember(index, path, member,
                                m.ok() ? absl::StatusOr<NpyArray>(m->array) : m.status(), type,
                                shape));
    ConvertElements(static_cast<const char*>(m->tensor.data_ptr()), type, m->array.count(),
                    to_float, out);
    return absl::OkStatus();
  }
  const int64_t count = Count(shape);
  if (!known.empty() &&
      member.size == static_cast<int64_t>(known.size()) + count * ElementBytes(type) &&
      std::memcmp(bytes, known.data(), known.size()) == 0) {
    ConvertElements(bytes + known.size(), type, count, to_float, out);
    return absl::OkStatus();
  }
  const absl::StatusOr<NpyArray> a = ParseNpy(bytes, member.size);
  RETURN_IF_ERROR(CheckMember(index, path, member, a, type, shape));
  ConvertElements(bytes + a->data_offset, type, a->count(), to_float, out);
  return absl::OkStatus();
}

absl::Status ShardReader::Decode(int64_t index, const char* span, const ByteRange& range,
                                 int64_t row, at::Tensor& x, at::Tensor& y) const {
  const SampleLocation loc = index_.Locate(index);
  const std::string& path = index_.shards()[loc.shard].path;
  char* x_row = static_cast<char*>(x.data_ptr()) + row * x.stride(0) * x.element_size();
  char* y_row = static_cast<char*>(y.data_ptr()) + row * y.stride(0) * y.element_size();
  if (index_.format() == v1::ShardedData::TOKENS) {
    const int64_t length = layout_.x_shape[0];
    const int w = ElementBytes(layout_.x_type);
    ConvertElements(span, layout_.x_type, length, false, x_row);
    ConvertElements(span + w, layout_.y_type, length, false, y_row);
    if (options_.vocab_size <= 0) return absl::OkStatus();
    // The sample's L + 1 tokens: x, then y's last. The error names the
    // first one past the vocabulary at its own offset.
    const auto* xs = reinterpret_cast<const int64_t*>(x_row);
    const int64_t last = reinterpret_cast<const int64_t*>(y_row)[length - 1];
    const int64_t bad = std::find_if(xs, xs + length,
                                     [&](int64_t t) { return t >= options_.vocab_size; }) -
                        xs;
    if (bad == length && last < options_.vocab_size) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "data.shards: ", path, " at byte offset ", range.offset + bad * w, " (sample ", index,
        "): token id ", bad < length ? xs[bad] : last,
        " is not in [0, model.transformer_lm.vocab_size ", options_.vocab_size, ")"));
  }
  RETURN_IF_ERROR(DecodeMember(index, path, loc.x, span + (loc.x.offset - range.offset), x_pt_,
                               layout_.x_type, layout_.x_shape, layout_.x_header,
                               x.scalar_type() == at::kFloat, x_row));
  return DecodeTarget(index, path, loc.y, span + (loc.y.offset - range.offset),
                      y.scalar_type() == at::kFloat, y_row);
}

}  // namespace chorus