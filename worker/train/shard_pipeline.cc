#include "worker/train/shard_pipeline.h"

#include <ATen/ATen.h>
#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/time/clock.h"

namespace chorus {
namespace {

// Note [Grouped reads] in shard_reader.cc: the most batches a reading
// thread claims at once.
constexpr int64_t kMaxGroupBatches = 64;

std::vector<int64_t> WithBatch(int64_t n, const std::vector<int64_t>& shape) {
  std::vector<int64_t> out = {n};
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

// Note [Batch buffers]: an uninitialized tensor whose memory, from 2 MiB
// on, may be backed by transparent huge pages.
at::Tensor HugePageEmpty(const std::vector<int64_t>& shape, at::ScalarType type) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t bytes = ElementCount(shape) * c10::elementSize(type);
  void* p = nullptr;
  if (bytes < kHugePage || ::posix_memalign(&p, kHugePage, bytes) != 0) {
    return at::empty(shape, type);
  }
  ::madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // a hint: an error changes nothing
  return at::from_blob(
      p, shape, [](void* q) { std::free(q); }, at::TensorOptions().dtype(type));
}

}  // namespace

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
ShardBatch BatchPool::NewBatch(int64_t n) {
  auto free = [](const at::Tensor& t) {
    return t.use_count() == 1 && t.storage().use_count() == 1;
  };
  // Only the pool hands out a pooled batch, under mu_: one found free here
  // stays this thread's. Of the free ones, the one the trainer was given
  // last, whose memory is the likeliest to be in the CPU's cache.
  absl::MutexLock lock(&mu_);
  const Pooled* newest = nullptr;
  for (const Pooled& p : pool_) {
    const ShardBatch& b = p.batch;
    if (b.x.size(0) == n && free(b.indices) && free(b.x) && free(b.y) &&
        (newest == nullptr || p.handed > newest->handed)) {
      newest = &p;
    }
  }
  if (newest != nullptr) return newest->batch;
  ShardBatch batch;
  batch.indices = at::empty({n}, at::kLong);
  batch.x = HugePageEmpty(WithBatch(n, shape_.x), shape_.x_type);
  batch.y = at::empty(WithBatch(n, shape_.y), shape_.y_type);
  if (static_cast<int64_t>(pool_.size()) < limit_) pool_.push_back(Pooled{batch, 0});
  return batch;
}

void BatchPool::NewBatches(const int64_t* indices, int64_t n, int64_t batch_size,
                           std::vector<ShardBatch>& out) {
  out.clear();
  const int64_t batches = (n + batch_size - 1) / batch_size;
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t size = std::min(batch_size, n - b * batch_size);
    out.push_back(NewBatch(size));
    std::memcpy(out.back().indices.data_ptr<int64_t>(), indices + b * batch_size,
                size * sizeof(int64_t));
  }
}

void BatchPool::Handed(const ShardBatch& batch) {
  absl::MutexLock lock(&mu_);
  ++handed_;
  for (Pooled& p : pool_) {
    if (p.batch.x.is_same(batch.x)) p.handed = handed_;
  }
}

void BatchPool::Restart(int64_t batch_size, int64_t limit) {
  // The pool outlives an epoch; batches of another size are dropped.
  absl::MutexLock lock(&mu_);
  pool_.erase(std::remove_if(pool_.begin(), pool_.end(),
                             [&](const Pooled& p) { return p.batch.x.size(0) != batch_size; }),
              pool_.end());
  limit_ = limit;
}

ShardPipeline::ShardPipeline(int64_t read_ahead_bytes, BatchShape shape,
                             const ColdReadAdvisor& advisor, ReadGroupFn read_group)
    : read_ahead_bytes_(read_ahead_bytes),
      shape_(shape),
      advisor_(advisor),
      read_group_(std::move(read_group)),
      pool_(std::move(shape)) {}

ShardPipeline::~ShardPipeline() { Stop(); }

void ShardPipeline::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : readers_) t.join();
  readers_.clear();
  if (advisor_thread_.joinable()) advisor_thread_.join();
}

void ShardPipeline::Start(SampleStream samples, int64_t batch_size) {
  Stop();
  absl::MutexLock lock(&mu_);
  ready_.clear();
  ready_bytes_ = 0;
  error_ = absl::OkStatus();
  stop_ = false;
  batches_left_ = (samples.count + batch_size - 1) / batch_size;
  // Note [Batch buffers]: what the queue may hold, and three batches more.
  pool_.Restart(batch_size,
                read_ahead_bytes_ / std::max<int64_t>(1, shape_.BatchBytes(batch_size)) + 3);
  batch_size_ = batch_size;
  claimed_ = 0;
  queued_ = 0;
  reading_at_ = 0;
  advised_ = 0;
  // Note [Grouped reads] in shard_reader.cc: half the read-ahead buffer's
  // batches, at least one.
  group_batches_ = std::max<int64_t>(
      1, std::min(kMaxGroupBatches, read_ahead_bytes_ / 2 / shape_.BatchBytes(batch_size)));
  // Note [Cold reads] in cold_read_advisor.cc: a reading thread waits for
  // the advisor to have read ahead its whole group.
  const int64_t window = advisor_.Window(group_batches_ * batch_size);
  advisor_thread_ = std::thread([this, count = samples.count, next = samples.next, window] {
    advisor_.Run(count, next, window, progress_);
  });
  samples_ = std::move(samples);  // the readers draw from their own copy
  for (int thread = 0; thread < kReadThreads; ++thread) {
    readers_.emplace_back(&ShardPipeline::Run, this, thread);
  }
}

std::optional<int64_t> ShardPipeline::Progress::AwaitWindow(int64_t window, int64_t at_least) {
  ShardPipeline& p = pipeline_;
  absl::MutexLock lock(&p.mu_);
  struct Ahead {
    ShardPipeline* pipeline;
    int64_t window, at_least;
  } ahead{&p, window, at_least};
  p.mu_.Await(absl::Condition(
      +[](Ahead* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return a->pipeline->stop_ || a->pipeline->WindowEnd(a->window) >= a->at_least;
      },
      &ahead));
  if (p.stop_) return std::nullopt;
  return p.WindowEnd(window);
}

void ShardPipeline::Progress::Advised(int64_t advised) {
  absl::MutexLock lock(&pipeline_.mu_);
  pipeline_.advised_ = advised;
}

int64_t ShardPipeline::WindowEnd(int64_t window) const {
  return std::min(samples_.count, reading_at_ + window);
}

// Note [Parallel reads]
// Reading a batch from the page cache is the kernel's copy of its bytes
// (preadv, straight into the batch's rows) and the headers' checks; on the
// bench machine one thread read 4.2 MB batches at about half the speed of
// `cat` (whose 128 KiB buffer stays in the CPU's cache, where a batch
// cannot), so a data-bound step waited for every batch. So kReadThreads
// threads read, each a group of batches at a time (Note [Grouped reads] in
// shard_reader.cc): under mu_ a thread claims the next batches of the
// stream and draws their sample numbers (so batches are drawn in the
// stream's order), reads them without the lock, and puts them in the queue
// when the batches before them are there (queued_), so Next() returns them
// in order. A batch's bytes count against read_ahead_bytes from its claim
// on, so the memory bound holds with batches in flight. A read error is
// queued in its batch's place: Next() returns the batches before it, then
// the error.
void ShardPipeline::Run(int thread) {
  ::pthread_setname_np(::pthread_self(), "chorus-read");  // as top and perf show it
  std::vector<int64_t> indices;
  std::vector<ShardBatch> read;
  for (;;) {
    int64_t first = 0, count = 0, batch_size = 0;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ShardPipeline* p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            if (p->stop_ || !p->error_.ok() || p->reading_at_ >= p->samples_.count) return true;
            const int64_t end = p->GroupEnd();
            // Note [Cold reads] in cold_read_advisor.cc: the advisor stays a
            // window ahead. Room for this group: with nothing queued or in
            // flight there always is (a batch larger than the buffer is
            // still read, one at a time).
            return p->advised_ >= end &&
                   (p->ready_bytes_ == 0 ||
                    p->ready_bytes_ + p->shape_.BatchBytes(end - p->reading_at_) <=
                        p->read_ahead_bytes_);
          },
          this));
      if (stop_ || !error_.ok() || reading_at_ >= samples_.count) return;
      const int64_t end = GroupEnd();
      first = claimed_;
      count = end - reading_at_;
      claimed_ += (count + batch_size_ - 1) / batch_size_;
      reading_at_ = end;
      ready_bytes_ += shape_.BatchBytes(count);
      max_ready_bytes_ = std::max(max_ready_bytes_, ready_bytes_);
      batch_size = batch_size_;
      indices.resize(count);
      for (int64_t& i : indices) i = samples_.next();
    }
    pool_.NewBatches(indices.data(), count, batch_size, read);
    const absl::Status status = read_group_(thread, indices.data(), count, batch_size, read);
    absl::MutexLock lock(&mu_);
    struct Turn {
      ShardPipeline* pipeline;
      int64_t batch;
    } turn{this, first};
    mu_.Await(absl::Condition(
        +[](Turn* t) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          const ShardPipeline* p = t->pipeline;
          return p->stop_ || !p->error_.ok() || p->queued_ == t->batch;
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

int64_t ShardPipeline::GroupEnd() const {
  // Note [Grouped reads] in shard_reader.cc: no larger than what was
  // claimed before it, so that the first batches after a Start() come one
  // at a time.
  const int64_t batches = std::min(group_batches_, std::max<int64_t>(1, claimed_));
  return std::min(samples_.count, reading_at_ + batches * batch_size_);
}

absl::StatusOr<ShardBatch> ShardPipeline::Next() {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  if (batches_left_ == 0) {
    return absl::FailedPreconditionError("the shard reader has no batch left in this epoch");
  }
  mu_.Await(absl::Condition(
      +[](ShardPipeline* p)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return !p->ready_.empty() || !p->error_.ok(); },
      this));
  wait_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
  if (ready_.empty()) return error_;
  ShardBatch batch = std::move(ready_.front());
  ready_.pop_front();
  pool_.Handed(batch);
  ready_bytes_ -= shape_.BatchBytes(batch.x.size(0));
  --batches_left_;
  return batch;
}

double ShardPipeline::wait_seconds() const {
  absl::MutexLock lock(&mu_);
  return wait_seconds_;
}

int64_t ShardPipeline::max_ready_bytes() const {
  absl::MutexLock lock(&mu_);
  return max_ready_bytes_;
}

}  // namespace chorus
