// ShardFormat: how the samples of one data.shards.format are read from
// their shard files and decoded into batch rows, with every check a sample
// must pass. One implementation per format, chosen once by
// ShardFormat::Open from the index's format:
// - TAR (tar_format.cc): .npy, .pt and text label members (tar_members.h);
//   an input stored as it is trained is read straight into its batch row,
//   and neighbouring samples with one call (Note [Grouped reads] in
//   shard_reader.cc);
// - TOKENS (token_format.cc): windows of L + 1 tokens, x the first L and y
//   the last L;
// - TENSOR_FILES (tensor_file_format.cc): a row of each of two tensors.
// The reader (shard_reader.h) is written against this interface alone. It
// reads a group of samples in file order (SortPositionsByIndex): each run
// of neighbours that RunEnd finds with ReadRun, the others, or a run whose
// read failed, sample by sample with ReadSample; then CheckBatch on each
// batch. Errors name the file and the byte offset, and the sample (and
// member) where there is one.
//
// Thread-safety: a format is immutable once open, and reading threads call
// it at once, each with its own ShardFiles; ReadCounts are atomic.
//
// Example:
//   ReadCounts counts;
//   ShardFiles files(index, counts);
//   ASSIGN_OR_RETURN(std::unique_ptr<ShardFormat> format, ShardFormat::Open(index, {}, files));
//   ShardBatch batch = ...;  // tensors of format->batch_shape(), one row
//   RETURN_IF_ERROR(format->ReadSample(files, 7, index.Locate(7), /*row=*/0, batch));
#ifndef CHORUS_WORKER_TRAIN_SHARD_FORMAT_H_
#define CHORUS_WORKER_TRAIN_SHARD_FORMAT_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/train/shard_batch.h"
#include "worker/train/shard_index.h"

namespace chorus {

struct ShardReaderOptions {
  // Integer inputs as float32 (the built-in mlp and cnn), else as int64.
  bool float_inputs = true;
  // A transformer_lm's vocabulary: token ids (TOKENS, and the integer
  // inputs and targets of TAR and TENSOR_FILES samples) must be below it;
  // 0: not a language model, any.
  int64_t vocab_size = 0;
  // TAR and TENSOR_FILES with integer targets: class ids must be in
  // [0, num_classes) (the model's outputs); 0: any.
  int64_t num_classes = 0;
};

// The bytes read from shard files by all reading threads (ShardReader::Stats).
struct ReadCounts {
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> reads{0};  // the read calls that read them
};

// One reading thread's shard files, opened as they are needed (at most 16
// at once: the streamed order reads one or two shards at a time), and its
// buffers. Not thread-safe: each reading thread has its own.
class ShardFiles {
 public:
  // REQUIRES: `index` and `counts` outlive this.
  ShardFiles(const ShardIndex& index, ReadCounts& counts);
  ~ShardFiles();  // closes the files
  ShardFiles(const ShardFiles&) = delete;
  ShardFiles& operator=(const ShardFiles&) = delete;

  const std::string& path(int shard) const { return index_.shards()[shard].path; }
  // Shard `shard`'s file, opened if it is not (the one opened first closed
  // when 16 are). NOT_FOUND naming the file.
  absl::StatusOr<int> Open(int shard);
  // Reads `range` of shard `shard` whole into `into` (again after EINTR and
  // short reads) and counts it as one read. DATA_LOSS naming the file and
  // the offset where reading stopped (ReadError).
  absl::Status Read(int shard, const ByteRange& range, char* into);
  // DATA_LOSS for a read of shard `shard` at `offset` that returned `r`
  // (0 or short: the file is shorter than it was; negative: errno says why).
  // Call it right after the read, before errno changes.
  absl::Status ReadError(int shard, int64_t offset, ssize_t r) const;
  // Counts one read call of `bytes` bytes.
  void Count(int64_t bytes);

  std::vector<char>& scratch() { return scratch_; }  // headers, targets, converted values
  std::vector<iovec>& parts() { return parts_; }     // one preadv's parts

 private:
  const ShardIndex& index_;
  ReadCounts& counts_;
  std::vector<int> fds_;        // by shard; -1: closed
  std::deque<int> open_order_;  // the open shards, the one opened first in front
  std::vector<char> scratch_;
  std::vector<iovec> parts_;
};

// The positions of `indices[0..n)` in ascending order of their values
// (equal values in their order), into `order`: the file order of those
// samples (Note [Samples in file order] in shard_format.cc). `counts` is
// scratch.
void SortPositionsByIndex(const int64_t* indices, int64_t n, std::vector<int64_t>& order,
                          std::vector<int64_t>& counts);

// Bytes of one shard file.
struct ShardRange {
  int shard = 0;
  ByteRange bytes;
};

// A sample of a group being read (Note [Grouped reads] in shard_reader.cc):
// its place in the group (batch at / batch size, row at % batch size) and
// in its file.
struct Placement {
  int64_t at = 0;
  SampleLocation loc;
};

class ShardFormat {
 public:
  // Called with a sample's place in its group (Placement::at) and its error.
  using Failure = std::function<void(int64_t, absl::Status)>;

  // The implementation of index.format(), which learns the types and shapes
  // every sample must have: TAR's from the first sample's members (read
  // with `files`), the others' from the spec or the index. Errors name the
  // file. REQUIRES: `index` outlives the format.
  static absl::StatusOr<std::unique_ptr<ShardFormat>> Open(const ShardIndex& index,
                                                           const ShardReaderOptions& options,
                                                           ShardFiles& files);
  virtual ~ShardFormat() = default;
  ShardFormat(const ShardFormat&) = delete;
  ShardFormat& operator=(const ShardFormat&) = delete;

  // The tensors a batch is decoded into.
  const BatchShape& batch_shape() const { return batch_shape_; }

  // Appends the bytes of the sample at `loc` as it is stored (what the
  // cold-read advisor reads ahead), in file order: by default its members
  // and what lies between them, as one range.
  virtual void AppendStoredRanges(const SampleLocation& loc, std::vector<ShardRange>& out) const;

  // The end of the run of neighbouring samples starting at order[begin]
  // (`order`: a group in file order) that ReadRun reads with one call;
  // begin + 1, by default, where samples are read one by one.
  virtual size_t RunEnd(const std::vector<Placement>& order, size_t begin) const;
  // Reads the `count` samples of `run` (a run RunEnd found; sample p's
  // number is indices[p.at]) with one call into their rows of `out`
  // (batch p.at / batch_size) and checks each, handing its errors to
  // `fail`. False, having checked none, when the read itself fails: the
  // caller reads them one by one, which says why. By default false.
  virtual bool ReadRun(ShardFiles& files, const int64_t* indices, const Placement* run,
                       int64_t count, int64_t batch_size, std::vector<ShardBatch>& out,
                       const Failure& fail) const;
  // Reads sample `index` (at `loc`) into row `row` of `batch` and checks it.
  virtual absl::Status ReadSample(ShardFiles& files, int64_t index, const SampleLocation& loc,
                                  int64_t row, ShardBatch& batch) const = 0;
  // Checks what is checked of a whole batch once its rows are read: by
  // default nothing.
  virtual absl::Status CheckBatch(const ShardBatch& batch) const;

 protected:
  // REQUIRES: `index` outlives the format.
  ShardFormat(const ShardIndex& index, const ShardReaderOptions& options, BatchShape batch_shape);

  // Where token `k` of the `count` of sample `index`'s input (`input`) or
  // target lies: "data.shards: FILE at byte offset O (sample S, element k
  // of ...)".
  using TokenPlace = std::function<std::string(int64_t index, const SampleLocation& loc, bool input,
                                               int64_t k, int64_t count)>;
  // INVALID_ARGUMENT at `place` of the first bad token unless every int64
  // value of `batch` (x and y) is in [0, options().vocab_size) (Note [Token
  // samples] in shard_format.cc).
  absl::Status CheckTokenIds(const ShardBatch& batch, const TokenPlace& place) const;
  // INVALID_ARGUMENT naming the file and offset unless every class id of a
  // sample's target (`classes`, one target's values) is below
  // options().num_classes (0: any).
  absl::Status CheckClasses(int64_t index, const std::string& path, int64_t offset,
                            const int64_t* classes) const;

  const std::string& PathOf(int shard) const { return index_.shards()[shard].path; }
  const ShardReaderOptions& options() const { return options_; }

 private:
  const ShardIndex& index_;
  const ShardReaderOptions options_;
  const BatchShape batch_shape_;
};

// The implementations, which ShardFormat::Open chooses from.
absl::StatusOr<std::unique_ptr<ShardFormat>> OpenTarFormat(const ShardIndex& index,
                                                           const ShardReaderOptions& options,
                                                           ShardFiles& files);
std::unique_ptr<ShardFormat> OpenTokenFormat(const ShardIndex& index,
                                             const ShardReaderOptions& options);
std::unique_ptr<ShardFormat> OpenTensorFileFormat(const ShardIndex& index,
                                                  const ShardReaderOptions& options);

// A sample's bytes in its file from the start of its first member to the end
// of its last (TAR, TOKENS: its members and what lies between them).
ByteRange SpanOf(const SampleLocation& loc);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_SHARD_FORMAT_H_
