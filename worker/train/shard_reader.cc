#include "worker/train/shard_reader.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace chorus {

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Open(const v1::ShardedData& spec,
                                                               const ShardReaderOptions& options) {
  ASSIGN_OR_RETURN(ShardIndex index, ShardIndex::Build(spec));
  std::unique_ptr<ShardReader> r(new ShardReader(std::move(index)));
  for (int t = 0; t < ShardPipeline::kReadThreads; ++t) {
    r->threads_.push_back(std::make_unique<ReadingThread>(r->index_, r->counts_));
  }
  ASSIGN_OR_RETURN(r->format_, ShardFormat::Open(r->index_, options, r->threads_[0]->files));
  r->advisor_ = std::make_unique<ColdReadAdvisor>(r->index_, *r->format_, spec.read_ahead_bytes());
  ShardReader* reader = r.get();
  r->pipeline_ = std::make_unique<ShardPipeline>(
      spec.read_ahead_bytes(), r->format_->batch_shape(), *r->advisor_,
      [reader](int thread, const int64_t* indices, int64_t n, int64_t batch_size,
               std::vector<ShardBatch>& batches) {
        return reader->ReadGroup(thread, indices, n, batch_size, batches);
      });
  const int64_t zero = 0;
  std::vector<ShardBatch> first;
  r->pipeline_->pool().NewBatches(&zero, 1, 1, first);
  RETURN_IF_ERROR(r->ReadGroup(0, &zero, 1, 1, first));
  r->probe_.x = first[0].x;
  r->probe_.y = first[0].y;
  r->probe_.num_classes = options.vocab_size > 0 ? static_cast<int>(options.vocab_size)
                                                  : spec.num_classes();
  // A language model's inputs and targets are integer token ids (a TOKENS
  // batch's always are).
  if (options.vocab_size > 0 &&
      (first[0].x.scalar_type() != at::kLong || first[0].y.scalar_type() != at::kLong)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.shards: ", r->index_.shards()[0].path,
        ": model.transformer_lm needs integer token ids as input and target; this shard's "
        "first sample holds ",
        c10::toString(first[0].x.scalar_type()), " -> ", c10::toString(first[0].y.scalar_type())));
  }
  return r;
}

ShardReader::~ShardReader() = default;

void ShardReader::Start(std::vector<int64_t> indices, int64_t batch_size) {
  const int64_t count = static_cast<int64_t>(indices.size());
  auto list = std::make_shared<const std::vector<int64_t>>(std::move(indices));
  Start(Samples{count, [list, at = size_t{0}]() mutable { return (*list)[at++]; }}, batch_size);
}

void ShardReader::Start(Samples samples, int64_t batch_size) {
  pipeline_->Start(std::move(samples), batch_size);
}

absl::StatusOr<ShardBatch> ShardReader::Next() { return pipeline_->Next(); }

ShardReader::Stats ShardReader::stats() const {
  return Stats{pipeline_->wait_seconds(), counts_.bytes.load(), counts_.reads.load(),
               pipeline_->max_ready_bytes()};
}

// Note [Grouped reads]
// From the page cache a read of one sample (preadv of its 17 KB: header
// and target into the scratch buffer, values into the batch row) costs a
// system call and a page-cache lookup besides the copy: on the bench
// machine such reads moved 12-13 GB/s, while one preadv over 300
// neighbouring samples (the same three parts each) moved 21 GB/s, `cat`'s
// speed. A reading thread therefore claims a group of batches, half the
// read-ahead buffer (so that one group is trained while the next is read;
// ShardPipeline), and reads its samples in file order, each run of
// neighbours (less than kRunGap apart: a tar header and padding) with one
// preadv of up to kMaxRun samples (ShardFormat::RunEnd and ReadRun, which
// only TAR has, in tar_format.cc). How many samples are neighbours depends
// on how much of a shuffle block the group holds: a rank alone reads every
// sample of the block, and a group of at least shuffle_buffer samples
// starting at a block's start reads it in runs (the epoch's blocks start at
// position 0); a rank of N reads one sample in N, mostly alone, as before.
// A run's samples are checked as a lone sample's are; a run that fails to
// read is read again sample by sample, so that the error names the sample.
// After a Start() the groups grow (a batch, a batch, two, four, ...: never
// more than was claimed before), so that the first step waits for one
// batch, not for half the buffer: with whole groups from the start the
// compute-bound bench's 80-step shard jobs took 1.009-1.040 of the
// in-memory job's time (the first step waited for 64 batches), with
// growing groups 1.005-1.007.
absl::Status ShardReader::ReadGroup(int thread, const int64_t* indices, int64_t n,
                                    int64_t batch_size, std::vector<ShardBatch>& batches) {
  ReadingThread& state = *threads_[thread];
  const int64_t count = static_cast<int64_t>(batches.size());
  // In file order, so that a rank's reads of a block move forward through
  // the shard; each sample lands in its own batch and row.
  // Note [Samples in file order] in shard_format.cc.
  SortPositionsByIndex(indices, n, state.positions, state.counts);
  std::vector<Placement>& order = state.order;
  order.resize(n);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t at = state.positions[k];
    order[k] = Placement{at, index_.Locate(indices[at])};
  }
  // The first batch with an error, and its error: the batches before it
  // are still read and returned.
  int64_t failed = count;
  absl::Status error;
  auto fail = [&](int64_t at, absl::Status status) {
    if (at / batch_size < failed) {
      failed = at / batch_size;
      error = std::move(status);
    }
  };
  const ShardFormat& format = *format_;
  for (size_t i = 0; i < order.size();) {
    const size_t end = format.RunEnd(order, i);
    if (end - i > 1 &&
        format.ReadRun(state.files, indices, &order[i], end - i, batch_size, batches, fail)) {
      i = end;
      continue;
    }
    for (; i < end; ++i) {
      const Placement& p = order[i];
      if (p.at / batch_size >= failed) continue;
      absl::Status s = format.ReadSample(state.files, indices[p.at], p.loc, p.at % batch_size,
                                         batches[p.at / batch_size]);
      if (!s.ok()) fail(p.at, std::move(s));
    }
  }
  for (int64_t b = 0; b < failed; ++b) {
    absl::Status s = format.CheckBatch(batches[b]);
    if (!s.ok()) fail(b * batch_size, std::move(s));
  }
  batches.resize(failed);
  return error;
}

}  // namespace chorus
