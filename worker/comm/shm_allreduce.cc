#include "worker/comm/shm_allreduce.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/paths.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "gloo/common/error.h"

namespace chorus {

namespace {

constexpr size_t kPage = 4096;
// The control block: the first page of every arena. Each rank writes only its
// own; peers read it and wait on its futex words.
struct alignas(64) Control {
  std::atomic<uint32_t> ready;   // futex word: segments published
  std::atomic<uint32_t> closed;  // 1 once the owner closed its communicator
  std::atomic<uint64_t> slot;    // the op of the published segment
  std::atomic<uint64_t> offset;  // where the segment lies in the owner's arena
  std::atomic<uint64_t> bytes;
  alignas(64) std::atomic<uint32_t> done;    // futex word: segments reduced
  alignas(64) std::atomic<uint32_t> copied;  // futex word: segments gathered
};
static_assert(sizeof(Control) <= kPage, "control block must fit its page");
static_assert(std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free to work across processes");

// Two staging slots of segment_bytes each, used by segments in turn, so a
// rank can stage its next segment while its peers still read the last one
// (Note [Shared-memory all-reduce]).
constexpr size_t kStagingOffset = kPage;
constexpr size_t kStagingSlots = 2;
// Arenas are sparse: only what is reserved takes memory.
constexpr size_t kMaxArenaBytes = size_t{16} << 30;
// Spins before sleeping on the futex (a few microseconds), and how long one
// sleep lasts before checking peer, abort flag and deadline again.
constexpr int kSpins = 256;
constexpr long kSliceNanos = 5'000'000;

size_t RoundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

size_t HeapStart(size_t segment_bytes) {
  return RoundUp(kStagingOffset + kStagingSlots * segment_bytes, kPage);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

// Maps [p, p + bytes) of a shared mapping whose pages are already reserved,
// so that using them later takes no page faults in this process. Kernels
// before 5.14 lack MADV_POPULATE_WRITE: there the first use faults instead.
void Populate(char* p, size_t bytes) {
  if (bytes > 0) madvise(p, bytes, MADV_POPULATE_WRITE);
}

// The slice [lo, hi) of a segment of `elements` that rank `rank` of `size`
// reduces. Slices are whole cache lines, so no two ranks write the same line.
std::pair<size_t, size_t> SliceOf(int rank, int size, size_t elements, size_t element_size) {
  const size_t per_line = std::max<size_t>(1, 64 / element_size);
  const size_t lines = (elements + per_line - 1) / per_line;
  const size_t lo = std::min(elements, lines * rank / size * per_line);
  const size_t hi = std::min(elements, lines * (rank + 1) / size * per_line);
  return {lo, std::max(lo, hi)};
}

// acc[i] = (acc[i] + other[i]) * scale. The inner loop has a fixed trip
// count so the compiler vectorizes it at -O2.
void AddScaled(float* __restrict acc, const float* __restrict other, float scale, size_t n) {
  constexpr size_t kBlock = 16;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (size_t j = 0; j < kBlock; ++j) acc[i + j] = (acc[i + j] + other[i + j]) * scale;
  }
  for (; i < n; ++i) acc[i] = (acc[i] + other[i]) * scale;
}

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

uint32_t* FutexWord(std::atomic<uint32_t>& a) { return reinterpret_cast<uint32_t*>(&a); }

void FutexWake(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, FutexWord(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void FutexWait(std::atomic<uint32_t>& word, uint32_t seen) {
  timespec slice{0, kSliceNanos};
  // Shared (not FUTEX_PRIVATE): the word lives in memory mapped by other
  // processes. EAGAIN (value changed), EINTR and ETIMEDOUT all just return.
  syscall(SYS_futex, FutexWord(word), FUTEX_WAIT, seen, &slice, nullptr, 0);
}

std::string ReadFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string NamespaceId(const char* path) {
  char buf[128];
  ssize_t n = readlink(path, buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

// True once `pid` has exited (a zombie counts: it will never write again).
bool ProcessExited(pid_t pid, int pidfd) {
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
  }
  // Gone between open and read (the read fails): it has exited.
  const std::optional<std::string> stat = ReadSmallFile(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat.has_value()) return true;
  const std::string& text = *stat;
  size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return true;
  const char state = text[paren + 2];
  return state == 'Z' || state == 'X';
}

int OpenPidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  return -1;
#endif
}

}  // namespace

// ------------------------------------------------------------------ arena

// One rank's shared memory object, mapped whole; the owner also hands out
// page-aligned buffers from the heap after the staging area.
class ShmArena {
 public:
  static absl::StatusOr<std::shared_ptr<ShmArena>> Create(size_t heap_start) {
    struct statvfs fs;
    if (statvfs("/dev/shm", &fs) != 0) {
      return absl::UnavailableError(absl::StrCat("statvfs /dev/shm: ", std::strerror(errno)));
    }
    const size_t capacity = static_cast<size_t>(fs.f_blocks) * fs.f_frsize;
    const size_t bytes = std::min(kMaxArenaBytes, RoundUp(capacity, kPage));
    if (bytes <= heap_start) {
      return absl::UnavailableError(
          absl::StrCat("/dev/shm holds only ", capacity, " bytes, too little for an arena"));
    }
    std::random_device random;
    const std::string name = absl::StrCat("/chorus-", getpid(), "-", random(), random());
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
      return absl::UnavailableError(absl::StrCat("shm_open ", name, ": ", std::strerror(errno)));
    }
    auto arena = std::shared_ptr<ShmArena>(new ShmArena(name, fd, /*owner=*/true));
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      return absl::UnavailableError(absl::StrCat("ftruncate ", name, ": ", std::strerror(errno)));
    }
    RETURN_IF_ERROR(arena->Map(bytes));
    if (!arena->Reserve(0, kPage)) {
      return absl::UnavailableError(absl::StrCat("/dev/shm has no room for ", name));
    }
    arena->free_[heap_start] = bytes - heap_start;
    return arena;
  }

  static absl::StatusOr<std::shared_ptr<ShmArena>> Open(const std::string& name) {
    int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      return absl::UnavailableError(absl::StrCat("shm_open ", name, ": ", std::strerror(errno)));
    }
    auto arena = std::shared_ptr<ShmArena>(new ShmArena(name, fd, /*owner=*/false));
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= static_cast<off_t>(kPage)) {
      return absl::UnavailableError(absl::StrCat("shm ", name, " has no arena"));
    }
    RETURN_IF_ERROR(arena->Map(static_cast<size_t>(st.st_size)));
    return arena;
  }

  ~ShmArena() {
    if (base_ != nullptr) munmap(base_, size_);
    close(fd_);
    Unlink();
  }

  // Removes the name; mappings stay valid.
  void Unlink() {
    if (owner_ && linked_) shm_unlink(name_.c_str());
    linked_ = false;
  }

  const std::string& name() const { return name_; }
  char* base() const { return base_; }
  size_t size() const { return size_; }
  Control* control() const { return reinterpret_cast<Control*>(base_); }

  // Backs [offset, offset + bytes) with memory; false when /dev/shm is full.
  bool Reserve(size_t offset, size_t bytes) {
    return posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes)) == 0;
  }

  // A reserved, zeroed, page-aligned block of at least `bytes`, or nullptr.
  char* Allocate(size_t bytes) {
    const size_t want = RoundUp(std::max<size_t>(bytes, 1), kPage);
    absl::MutexLock lock(&mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < want) continue;
      const size_t offset = it->first;
      if (!Reserve(offset, want)) return nullptr;
      const size_t rest = it->second - want;
      free_.erase(it);
      if (rest > 0) free_[offset + want] = rest;
      used_[offset] = want;
      Populate(base_ + offset, want);
      return base_ + offset;
    }
    return nullptr;
  }

  // Returns a block from Allocate for reuse. Its pages stay reserved and
  // mapped (in this process and in every peer that touched them) until the
  // arena is gone: giving them back and taking them again would fault every
  // page in every mapping, and on a VM that reports free pages to its host a
  // fault on memory taken anew costs microseconds per page.
  void Free(char* p) {
    absl::MutexLock lock(&mu_);
    auto it = used_.find(static_cast<size_t>(p - base_));
    if (it == used_.end()) return;
    size_t offset = it->first;
    size_t bytes = it->second;
    used_.erase(it);
    auto next = free_.find(offset + bytes);
    if (next != free_.end()) {
      bytes += next->second;
      free_.erase(next);
    }
    auto prev = free_.lower_bound(offset);
    if (prev != free_.begin()) {
      --prev;
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        bytes += prev->second;
        free_.erase(prev);
      }
    }
    free_[offset] = bytes;
  }

 private:
  ShmArena(std::string name, int fd, bool owner)
      : name_(std::move(name)), fd_(fd), owner_(owner), linked_(owner) {}

  absl::Status Map(size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) {
      return absl::UnavailableError(absl::StrCat("mmap ", name_, ": ", std::strerror(errno)));
    }
    base_ = static_cast<char*>(p);
    size_ = bytes;
    return absl::OkStatus();
  }

  const std::string name_;
  const int fd_;
  const bool owner_;
  bool linked_;
  char* base_ = nullptr;
  size_t size_ = 0;

  absl::Mutex mu_;
  std::map<size_t, size_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> bytes
  std::map<size_t, size_t> used_ ABSL_GUARDED_BY(mu_);
};

// ------------------------------------------------------------------ setup

std::string SharedMemoryHostKey() {
  const std::string boot = ReadFirstLine("/proc/sys/kernel/random/boot_id");
  const std::string net = NamespaceId("/proc/self/ns/net");
  const std::string mnt = NamespaceId("/proc/self/ns/mnt");
  const std::string pid = NamespaceId("/proc/self/ns/pid");
  if (boot.empty() || net.empty() || mnt.empty() || pid.empty()) return "";
  return absl::StrCat(boot, "/", net, "/", mnt, "/", pid);
}

struct ShmAllreduce::Peer {
  std::shared_ptr<ShmArena> arena;
  pid_t pid = 0;
  int pidfd = -1;  // -1: same process, or pidfd_open unavailable (then /proc)
  ~Peer() {
    if (pidfd >= 0) close(pidfd);
  }
};

absl::StatusOr<std::unique_ptr<ShmAllreduce>> ShmAllreduce::Connect(const Options& options,
                                                                    Store& store,
                                                                    absl::Time deadline) {
  if (options.size < 2) return nullptr;
  if (options.segment_bytes < kPage) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: segment_bytes must be at least ", kPage));
  }
  // Round 1: who is where. "-" means this rank cannot take part.
  std::shared_ptr<ShmArena> self;
  std::string mine = "-";
  const std::string host = SharedMemoryHostKey();
  if (!host.empty()) {
    auto arena = ShmArena::Create(HeapStart(options.segment_bytes));
    if (arena.ok()) {
      self = *std::move(arena);
      mine = absl::StrCat(host, " ", self->name(), " ", getpid());
    } else {
      LOG(WARNING) << "rank " << options.rank
                   << ": no shared memory, all-reduce uses TCP: " << arena.status();
    }
  }
  RETURN_IF_ERROR(store.Set(absl::StrCat("shm/", options.rank), mine));
  std::vector<std::string> keys;
  for (int r = 0; r < options.size; ++r) keys.push_back(absl::StrCat("shm/", r));
  RETURN_IF_ERROR(store.Wait(keys, deadline));

  // Round 2: map every peer's arena; all must succeed for any to use them.
  bool usable = self != nullptr;
  std::vector<std::unique_ptr<Peer>> peers(options.size);
  for (int r = 0; r < options.size; ++r) {
    ASSIGN_OR_RETURN(std::string value, store.Get(keys[r], deadline));
    if (!usable) continue;
    std::vector<std::string> parts = absl::StrSplit(value, ' ');
    int pid = 0;
    if (parts.size() != 3 || parts[0] != host || !absl::SimpleAtoi(parts[2], &pid)) {
      usable = false;  // another host, or that rank has no shared memory
      continue;
    }
    auto peer = std::make_unique<Peer>();
    peer->pid = pid;
    if (r == options.rank) {
      peer->arena = self;
    } else {
      auto arena = ShmArena::Open(parts[1]);
      if (!arena.ok()) {
        LOG(WARNING) << "rank " << options.rank << ": cannot map rank " << r
                     << "'s shared memory, all-reduce uses TCP: " << arena.status();
        usable = false;
        continue;
      }
      peer->arena = *std::move(arena);
      if (pid != getpid()) peer->pidfd = OpenPidfd(pid);
    }
    peers[r] = std::move(peer);
  }
  RETURN_IF_ERROR(store.Set(absl::StrCat("shm_ok/", options.rank), usable ? "1" : "0"));
  std::vector<std::string> ok_keys;
  for (int r = 0; r < options.size; ++r) ok_keys.push_back(absl::StrCat("shm_ok/", r));
  RETURN_IF_ERROR(store.Wait(ok_keys, deadline));
  bool all = true;
  for (const std::string& key : ok_keys) {
    ASSIGN_OR_RETURN(std::string value, store.Get(key, deadline));
    all = all && value == "1";
  }
  if (!all) return nullptr;
  // Every peer has mapped this arena (it said so above): the name can go.
  self->Unlink();
  return std::unique_ptr<ShmAllreduce>(new ShmAllreduce(options, self, std::move(peers)));
}

ShmAllreduce::ShmAllreduce(const Options& options, std::shared_ptr<ShmArena> self,
                           std::vector<std::unique_ptr<Peer>> peers)
    : options_(options), self_(std::move(self)), peers_(std::move(peers)) {}

ShmAllreduce::~ShmAllreduce() { Close(); }

void ShmAllreduce::Close() {
  Control* c = self_->control();
  c->closed.store(1, std::memory_order_release);
  FutexWake(c->ready);
  FutexWake(c->done);
  FutexWake(c->copied);
}

at::Tensor ShmAllreduce::NewBuffer(int64_t numel, const at::TensorOptions& options) {
  const size_t bytes = static_cast<size_t>(numel) * options.dtype().itemsize();
  char* p = self_->Allocate(bytes);
  if (p == nullptr) return at::Tensor();
  std::shared_ptr<ShmArena> arena = self_;
  return at::from_blob(
      p, {numel}, [arena](void* q) { arena->Free(static_cast<char*>(q)); },
      options.device(at::kCPU));
}

// ------------------------------------------------------------------ all-reduce

void ShmAllreduce::Publish(uint64_t slot, size_t offset, size_t bytes) {
  Control* c = self_->control();
  c->slot.store(slot, std::memory_order_relaxed);
  c->offset.store(offset, std::memory_order_relaxed);
  c->bytes.store(bytes, std::memory_order_relaxed);
  c->ready.store(seq_, std::memory_order_release);
  FutexWake(c->ready);
}

// Note [A peer that finished and left]
// A peer stores its counters before it closes its communicator or exits, and
// its last op may be done with everything this rank awaits from it. The counter
// this rank last read may be older than that (it was read before the peer's
// last stores, and the peer finished and left in between), so on finding a peer
// gone, the counter is read again, after the sign that it left: then it shows
// everything the peer did, and a peer that owes this segment nothing is not a
// failure. (Seen under tsan on 2 cores: rank 1 finished the op and exited
// between rank 0's read of its `done` and of its `closed`.)
void ShmAllreduce::CheckPeers(int awaited, uint32_t seq, absl::Time deadline,
                              const AbortHandle& abort,
                              const std::function<bool()>& arrived) const {
  if (abort.aborted()) throw gloo::IoException("shared-memory all-reduce: communicator aborted");
  // Every peer, not only the awaited one (which may itself be stuck on a dead
  // rank) — but a peer that has finished this segment and then left (its
  // last op done, process exiting) owes nothing more to it.
  for (int r = 0; r < options_.size; ++r) {
    if (r == options_.rank) continue;
    const Peer& p = *peers_[r];
    const Control* c = p.arena->control();
    // Note [A peer that finished and left]
    const auto owes_nothing = [&] {
      return r == awaited ? arrived() : c->done.load(std::memory_order_acquire) == seq;
    };
    if (r != awaited && owes_nothing()) continue;
    if (c->closed.load(std::memory_order_acquire) != 0) {
      if (owes_nothing()) continue;
      throw gloo::IoException(absl::StrCat("rank ", r, " is gone: it closed its communicator"));
    }
    if (p.pid != getpid() && ProcessExited(p.pid, p.pidfd)) {
      if (owes_nothing()) continue;
      throw gloo::IoException(
          absl::StrCat("rank ", r, " is gone: its process (pid ", p.pid, ") exited"));
    }
  }
  const int peer = awaited;
  if (absl::Now() > deadline) {
    throw gloo::IoException(
        absl::StrCat("Timed out waiting for rank ", peer, " in a shared-memory all-reduce"));
  }
}

void ShmAllreduce::WaitReady(int peer, uint32_t seq, uint64_t slot, absl::Time deadline,
                             const AbortHandle& abort) {
  Control* c = peers_[peer]->arena->control();
  // The peer's control block is published with release order: once `ready`
  // reads seq, its slot, offset and bytes are those of this segment. A peer on
  // another collective (different slot) is waited for, never mixed in.
  auto reached = [&] {
    return c->ready.load(std::memory_order_acquire) == seq &&
           c->slot.load(std::memory_order_relaxed) == slot;
  };
  for (int i = 0; i < kSpins; ++i) {
    if (reached()) return;
    CpuRelax();
  }
  while (true) {
    const uint32_t seen = c->ready.load(std::memory_order_acquire);
    if (reached()) return;
    CheckPeers(peer, seq, deadline, abort, reached);
    FutexWait(c->ready, seen);
  }
}

void ShmAllreduce::WaitCounter(int peer, Counter counter, uint32_t seq, absl::Time deadline,
                               const AbortHandle& abort) {
  Control* c = peers_[peer]->arena->control();
  std::atomic<uint32_t>& word = counter == Counter::kDone ? c->done : c->copied;
  for (int i = 0; i < kSpins; ++i) {
    if (word.load(std::memory_order_acquire) == seq) return;
    CpuRelax();
  }
  while (true) {
    const uint32_t seen = word.load(std::memory_order_acquire);
    if (seen == seq) return;
    CheckPeers(peer, seq, deadline, abort,
               [&] { return word.load(std::memory_order_acquire) == seq; });
    FutexWait(word, seen);
  }
}

void ShmAllreduce::ReduceSlice(const Op& op, const std::vector<char*>& sources, size_t elements) {
  const int size = options_.size;
  const int rank = options_.rank;
  const size_t esize = op.element_size;
  const auto [lo, hi] = SliceOf(rank, size, elements, esize);
  if (hi <= lo) return;
  const size_t len = hi - lo;
  char* mine = sources[rank] + lo * esize;
  if (op.float_sum) {
    float* acc = reinterpret_cast<float*>(mine);
    int last = size - 1;
    if (last == rank) --last;
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      AddScaled(acc, reinterpret_cast<const float*>(sources[p] + lo * esize),
                p == last ? op.scale : 1.0f, len);
    }
    return;
  }
  for (int p = 0; p < size; ++p) {
    if (p != rank) op.reduce(mine, mine, sources[p] + lo * esize, len);
  }
  if (op.finalize) op.finalize(mine, len);
}

void ShmAllreduce::Run(const Op& op, const AbortHandle& abort) {
  if (op.count == 0) return;
  try {
    RunSegments(op, abort);
  } catch (...) {
    // This communicator is broken now (Note [Communicator failures]); peers
    // waiting for this rank learn it at once instead of at their deadline.
    Close();
    throw;
  }
}

void ShmAllreduce::RunSegments(const Op& op, const AbortHandle& abort) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(op.timeout);
  const size_t esize = op.element_size;
  const int size = options_.size;
  const int rank = options_.rank;
  char* data = static_cast<char*>(op.data);
  char* base = self_->base();
  const size_t heap = HeapStart(options_.segment_bytes);
  const bool in_arena = data >= base + heap && data + op.count * esize <= base + self_->size();
  if (!in_arena && !staging_reserved_) {
    const size_t staging = kStagingSlots * options_.segment_bytes;
    if (!self_->Reserve(kStagingOffset, staging)) {
      throw gloo::IoException(
          absl::StrCat("shared-memory all-reduce: /dev/shm has no room for a ", staging,
                       "-byte staging area; free space there or set CHORUS_GLOO_SHM=0 to use TCP"));
    }
    Populate(base + kStagingOffset, staging);
    staging_reserved_ = true;
  }
  Control* control = self_->control();
  const size_t segment = std::max<size_t>(1, options_.segment_bytes / esize);
  std::vector<char*> sources(size);
  for (size_t first = 0; first < op.count; first += segment) {
    const size_t n = std::min(segment, op.count - first);
    const size_t bytes = n * esize;
    char* out = data + first * esize;
    ++seq_;
    char* mine = out;
    if (!in_arena) {
      mine = base + kStagingOffset + (seq_ % kStagingSlots) * options_.segment_bytes;
      std::memcpy(mine, out, bytes);
    }
    Publish(op.slot, static_cast<size_t>(mine - base), bytes);
    for (int p = 0; p < size; ++p) {
      if (p == rank) {
        sources[p] = mine;
        continue;
      }
      WaitReady(p, seq_, op.slot, deadline, abort);
      const Control* c = peers_[p]->arena->control();
      const size_t offset = c->offset.load(std::memory_order_relaxed);
      const size_t peer_bytes = c->bytes.load(std::memory_order_relaxed);
      if (peer_bytes != bytes || offset < kStagingOffset ||
          offset + bytes > peers_[p]->arena->size()) {
        throw gloo::Exception(absl::StrCat("shared-memory all-reduce: rank ", p, " published ",
                                           peer_bytes, " bytes at offset ", offset,
                                           " for a segment of ", bytes, " bytes"));
      }
      sources[p] = peers_[p]->arena->base() + offset;
    }
    ReduceSlice(op, sources, n);
    control->done.store(seq_, std::memory_order_release);
    FutexWake(control->done);
    // Gather: each rank's reduced slice lies in its own segment.
    for (int p = 0; p < size; ++p) {
      const auto [lo, hi] = SliceOf(p, size, n, esize);
      if (p != rank) WaitCounter(p, Counter::kDone, seq_, deadline, abort);
      if (hi > lo && sources[p] != out) {
        std::memcpy(out + lo * esize, sources[p] + lo * esize, (hi - lo) * esize);
      }
    }
    control->copied.store(seq_, std::memory_order_release);
    FutexWake(control->copied);
  }
  // Peers gathered from the caller's own memory: it is the caller's again
  // only once they have all finished reading it.
  if (in_arena) {
    for (int p = 0; p < size; ++p) {
      if (p != rank) WaitCounter(p, Counter::kCopied, seq_, deadline, abort);
    }
  }
}

}  // namespace chorus
