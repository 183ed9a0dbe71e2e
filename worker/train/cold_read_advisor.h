// ColdReadAdvisor: reads into the page cache, in large forward reads, the
// bytes of the samples a rank's reading threads read next, so that a cold
// disk streams them instead of serving the threads' small reads at random
// offsets one by one (Note [Cold reads] in cold_read_advisor.cc). It runs
// on a thread of its own, started by the pipeline (shard_pipeline.h) with
// each Start(), a window of samples ahead of the first sample no reading
// thread has claimed; a reading thread claims samples only once the
// advisor has read them ahead. The two meet through ReadingProgress.
//
// Its decisions are pure functions: AdviseWindow (how many samples ahead)
// and MergeReadAhead (which bytes are read as one).
//
// Thread-safety: an advisor is immutable; each Run is one thread's, with
// its own file and buffers.
//
// Example:
//   ColdReadAdvisor advisor(index, *format, spec.read_ahead_bytes());
//   std::thread ahead([&] {
//     advisor.Run(samples.count, samples.next, advisor.Window(group_samples), progress);
//   });
#ifndef CHORUS_WORKER_TRAIN_COLD_READ_ADVISOR_H_
#define CHORUS_WORKER_TRAIN_COLD_READ_ADVISOR_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "worker/train/shard_format.h"
#include "worker/train/shard_index.h"

namespace chorus {

// The samples an advisor reads ahead of the reading threads: the next
// `read_ahead_bytes` of samples as they are stored (`sample_bytes` each),
// never less than 64 MiB of them nor more than 65536 samples (the advisor
// holds their places), and at least two groups of `group_samples` (the most
// samples a reading thread claims at once), which the advisor's steps of a
// quarter window always leave room for.
int64_t AdviseWindow(int64_t read_ahead_bytes, int64_t sample_bytes, int64_t group_samples);

// The ranges of `stored` (sorted by shard and offset) that lie at most 1 MiB
// apart in the same shard merged into one, into `out`: the bytes that are
// read ahead with one forward pass.
void MergeReadAhead(const std::vector<ShardRange>& stored, std::vector<ShardRange>& out);

// The reading an advisor runs ahead of: ShardPipeline's reading threads.
class ReadingProgress {
 public:
  virtual ~ReadingProgress() = default;
  // Waits until the window (the `window` samples from the first one no
  // reading thread has claimed, or up to the last sample) ends at or past
  // `at_least`, and returns where it ends; nullopt once reading stops.
  virtual std::optional<int64_t> AwaitWindow(int64_t window, int64_t at_least) = 0;
  // The first `advised` samples were read ahead: reading threads may claim
  // them.
  virtual void Advised(int64_t advised) = 0;
};

class ColdReadAdvisor {
 public:
  // REQUIRES: `index` and `format` outlive the advisor.
  ColdReadAdvisor(const ShardIndex& index, const ShardFormat& format, int64_t read_ahead_bytes);
  ColdReadAdvisor(const ColdReadAdvisor&) = delete;
  ColdReadAdvisor& operator=(const ColdReadAdvisor&) = delete;

  // AdviseWindow for this dataset (its first sample's stored bytes) and
  // reading threads that claim up to `group_samples` at once.
  int64_t Window(int64_t group_samples) const;

  // Reads ahead the `count` samples `next` draws, in the order drawn, in
  // steps of a quarter `window` as `progress` says the reading threads move
  // (Note [Cold reads] in cold_read_advisor.cc). Returns once every sample
  // is read ahead, or reading stops. A file that cannot be read is skipped:
  // the reading threads say why.
  void Run(int64_t count, std::function<int64_t()> next, int64_t window,
           ReadingProgress& progress) const;

 private:
  // The stored bytes of samples `next`, by shard and offset, into
  // `stored`; `positions` and `counts` are scratch.
  void StoredRanges(const std::vector<int64_t>& next, std::vector<int64_t>& positions,
                    std::vector<int64_t>& counts, std::vector<ShardRange>& stored) const;

  const ShardIndex& index_;
  const ShardFormat& format_;
  const int64_t read_ahead_bytes_;
  const int64_t sample_bytes_;  // the first sample's, as stored
};

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_COLD_READ_ADVISOR_H_
