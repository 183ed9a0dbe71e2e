// ShardReader: a rank's stream of batches from a sharded dataset
// (data.shards). The trainer hands it the rank's sample numbers for the rest
// of an epoch (the sampler's share of StreamOrder, sampler.h); a background
// thread reads those samples from the shard files, decodes them into batch
// tensors and keeps them in a queue bounded by data.shards.read_ahead_bytes,
// so that a step finds its batch ready when the disk keeps up. Two threads
// read batches in turn (Note [Parallel reads] in shard_reader.cc); the
// queue holds them in the stream's order.
//
// Only the rank's own samples are read; a second thread reads the bytes of
// the next read_ahead_bytes (at least 64 MiB) of them into the page cache
// in large forward reads, so that a cold disk streams (Note [Cold reads] in
// shard_reader.cc).
// Memory: the queue and the batches being read (at most read_ahead_bytes
// together, or one batch when a batch is larger) and up to three batches
// more (being trained, just released, spare), plus the index
// (ShardIndex), whatever `Samples::next` holds (the trainer's StreamCursor:
// one shuffle block) and the places of the advisor's window of samples.
//
// The position in the stream is not the reader's: it is the trainer's
// (epoch, samples of the epoch trained), which checkpoints and elastic
// re-formation carry as for in-memory data; Start() is called again with
// the re-sharded rest of the epoch (Note [Streamed order] in sampler.cc).
//
// Thread-safety: Start, Next and stats are called from one thread (the
// trainer's); the reader's own threads (reading, and reading ahead into the
// page cache) are joined by Start and the destructor.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> reader, ShardReader::Open(spec.data().shards(),
//   {})); StreamCursor cursor(reader->index().ShardSizes(), block, sampler, epoch);
//   reader->Start({cursor.size(), [cursor]() mutable { return cursor.Next(); }}, 64);
//   ASSIGN_OR_RETURN(ShardBatch batch, reader->Next());  // batch.x, batch.y, batch.indices
#ifndef CHORUS_WORKER_TRAIN_SHARD_READER_H_
#define CHORUS_WORKER_TRAIN_SHARD_READER_H_

#include <ATen/core/Tensor.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/job.pb.h"
#include "worker/train/data.h"
#include "worker/train/shard_index.h"

namespace chorus {

struct ShardBatch {
  at::Tensor indices;  // [B] int64: the sample numbers (for the sample trace)
  at::Tensor x;        // [B, ...] float32 or int64
  at::Tensor y;        // [B] int64 classes, [B, ...] float32 targets, or [B, L] int64 tokens
};

// The tensor of a .pt tar member, the bytes of torch.save(tensor) (Note
// [.pt members] in shard_reader.cc): `array` describes it as a .npy member
// would be, its values (data_offset 0) those of the contiguous `tensor`.
struct PtMember {
  NpyArray array;
  at::Tensor tensor;
};
// INVALID_ARGUMENT saying what is wrong (the caller adds the file and
// offset): not a zip torch.save file, not a tensor, a dtype not read.
absl::StatusOr<PtMember> ParsePtMember(const char* bytes, int64_t size);

// The class label of a .cls, .txt or .json target member of `size` bytes
// (Note [Text label members] in shard_reader.cc): one integer as text,
// whitespace around it allowed. INVALID_ARGUMENT quoting the text otherwise
// (the caller adds the file, offset, sample and member).
absl::StatusOr<int64_t> ParseTextLabel(const char* bytes, int64_t size);

struct ShardReaderOptions {
  // Integer inputs as float32 (the built-in mlp and cnn), else as int64.
  bool float_inputs = true;
  // A transformer_lm's vocabulary: token ids (TOKENS, and the integer
  // inputs and targets of TAR and TENSOR_FILES samples) must be below it;
  // 0: not a language model, any.
  int64_t vocab_size = 0;
  // TAR with integer targets: class ids must be in [0, num_classes) (the
  // model's outputs); 0: any.
  int64_t num_classes = 0;
};

class ShardReader {
 public:
  // Builds the index (ShardIndex::Build) and decodes the first sample, whose
  // types and shapes every other sample must have. Errors name the file.
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(const v1::ShardedData& spec,
                                                           const ShardReaderOptions& options);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const ShardIndex& index() const { return index_; }
  // The first sample as a one-sample Dataset (num_classes from the spec, or
  // the vocabulary for tokens): what Model::Build needs to know of the data.
  const Dataset& probe() const { return probe_; }

  // The sample numbers a Start() reads, in the order they are trained:
  // `count` of them, drawn one by one by `next`. The reader draws from a
  // copy of `next` to look ahead (Note [Cold reads] in shard_reader.cc): a
  // copy continues from where the original is.
  struct Samples {
    int64_t count = 0;
    std::function<int64_t()> next;
  };
  // Starts reading `samples` in batches of `batch_size`; drops whatever was
  // read ahead. REQUIRES: batch_size >= 1.
  void Start(Samples samples, int64_t batch_size);
  // The same for a list of sample numbers.
  void Start(std::vector<int64_t> indices, int64_t batch_size);
  // The next batch of the last Start(), waiting for it to be read. A read
  // or decode error names the file and byte offset; FAILED_PRECONDITION
  // past the last batch.
  absl::StatusOr<ShardBatch> Next();

  struct Stats {
    double wait_seconds = 0;  // Next() waiting for the reader, in total
    int64_t bytes_read = 0;   // from the shard files, in total
    int64_t reads = 0;        // the read calls that read them (Note [Grouped reads])
    // The most decoded bytes queued ahead or being read at once (the
    // read-ahead buffer's high-water mark).
    int64_t max_ready_bytes = 0;
  };
  Stats stats() const;

 private:
  struct Layout {  // a decoded sample
    ElementType x_type = ElementType::kFloat32, y_type = ElementType::kInt64;
    std::vector<int64_t> x_shape, y_shape;
    // TAR: the first sample's .npy headers, byte for byte (a member whose
    // header equals its member's is not parsed again).
    std::string x_header, y_header;
  };
  // A reading thread's own: its open shard files (-1: closed), the order
  // they were opened in (for closing the oldest past kMaxOpenFiles) and its
  // buffer for headers and converted members.
  // A sample of a group being read (Note [Grouped reads] in
  // shard_reader.cc): its place in the group (batch at / batch size, row at
  // % batch size) and in its file.
  struct Placement {
    int64_t at = 0;
    SampleLocation loc;
  };
  struct ReadState {
    std::vector<int> fds;
    std::deque<int> open_order;
    std::vector<char> scratch;
    std::vector<Placement> order;  // the group being read, in file order
    std::vector<int64_t> positions, counts;  // sorting it (SortPositionsByIndex)
    std::vector<iovec> parts;      // a run's preadv
  };
  ShardReader(ShardIndex index, ShardReaderOptions options)
      : index_(std::move(index)), options_(options) {}

  void Stop();
  // A reading thread (Note [Parallel reads] in shard_reader.cc).
  void Run(ReadState& state);
  // The advisor's thread: reads the bytes the reader reads next into the
  // page cache, up to `window` samples ahead of it (Note [Cold reads] in
  // shard_reader.cc).
  void Advise(Samples samples, int64_t window);
  ShardBatch NewBatch(int64_t n);
  // Where the next group a reading thread claims ends (a position of the
  // stream; Note [Grouped reads] in shard_reader.cc).
  int64_t GroupEnd() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One batch of samples `indices` (Open()'s probe).
  absl::StatusOr<ShardBatch> ReadBatch(ReadState& state, const int64_t* indices, int64_t n);
  // Reads samples `indices` (n) into batches of `batch_size` (the last one
  // shorter), in file order; `out` gets the batches, or on an error only
  // those before the first batch with one, and the error is returned.
  absl::Status ReadGroup(ReadState& state, const int64_t* indices, int64_t n, int64_t batch_size,
                         std::vector<ShardBatch>& out);
  // Whether TAR inputs are read straight into `batch`'s rows (stored as
  // they are trained).
  bool DirectTar(const ShardBatch& batch) const;
  // The end of the run of neighbouring samples that starts at
  // order[begin]: begin + 1 when they are not read as one (always, unless
  // `direct`: DirectTar of the group's batches).
  size_t RunEnd(const std::vector<Placement>& order, size_t begin, bool direct) const;
  // Reads `count` neighbouring samples with one preadv and checks each
  // (errors go to `fail`, with the sample's place); false, having checked
  // none, when the read itself fails.
  bool ReadRun(ReadState& state, const int64_t* indices, const Placement* run, int64_t count,
               int64_t batch_size, std::vector<ShardBatch>& out,
               const std::function<void(int64_t, absl::Status)>& fail);
  absl::Status ReadSample(ReadState& state, int64_t index, const SampleLocation& loc, int64_t row,
                          ShardBatch& batch);
  // A TAR sample read straight into row `row` of `batch`: checks its
  // input's .npy header (at `x_header`) and decodes its target (at
  // `y_bytes`) into the row.
  absl::Status CheckDirect(int64_t index, const std::string& path, const SampleLocation& loc,
                           const char* x_header, const char* y_bytes, int64_t row,
                           ShardBatch& batch) const;
  // INVALID_ARGUMENT naming the file, offset and sample unless `a` parsed
  // and has the first sample's `type` and `shape`.
  absl::Status CheckMember(int64_t index, const std::string& path, const ByteRange& member,
                           const absl::StatusOr<NpyArray>& a, ElementType type,
                           const std::vector<int64_t>& shape) const;
  // The first sample's member `range` of `path` (open as `fd`), a .npy
  // member or (`pt`) a .pt one or (`text`) a text label: its type and
  // shape; a .npy member's header goes to `*header` (Layout).
  absl::StatusOr<NpyArray> ProbeMember(int fd, const std::string& path, const ByteRange& range,
                                       bool pt, bool text, std::string* header) const;
  // INVALID_ARGUMENT naming the file, sample and the first bad token's own
  // offset unless every token id of `batch` (its samples at `where`, row by
  // row) is in [0, options_.vocab_size) (Note [Token samples] in
  // shard_reader.cc).
  absl::Status CheckTokens(const ShardBatch& batch, const SampleLocation* where) const;
  // "data.shards: FILE at byte offset O (sample S, element k of ...)": where
  // token `k` of the `count` of sample `index`'s input (or target) lies.
  std::string TokenPlace(int64_t index, const SampleLocation& loc, bool input, int64_t k,
                         int64_t count) const;
  // INVALID_ARGUMENT naming the file and offset unless every class id of a
  // sample's target is below options_.num_classes (0: any).
  absl::Status CheckClasses(int64_t index, const std::string& path, int64_t offset,
                            const int64_t* classes) const;
  // TENSOR_FILES: reads sample `index`'s rows of x and y into row `row`.
  absl::Status ReadRows(ReadState& state, int64_t index, const SampleLocation& loc, int fd,
                        int64_t row, ShardBatch& batch);
  // DecodeMember for the target (or ParseTextLabel, y_text_), whose class
  // ids (integer targets) must be below options_.num_classes.
  absl::Status DecodeTarget(int64_t index, const std::string& path, const ByteRange& member,
                            const char* bytes, bool to_float, char* out) const;
  // Parses and checks the .npy (or, `pt`, .pt) `member` at `bytes`,
  // converting its values to `out`; a .npy member that starts with `known`
  // (the first sample's header for it) and has its size is not parsed again.
  absl::Status DecodeMember(int64_t index, const std::string& path, const ByteRange& member,
                            const char* bytes, bool pt, ElementType type,
                            const std::vector<int64_t>& shape, const std::string& known,
                            bool to_float, char* out) const;
  // Decodes sample `index` (its bytes `span` read from `range` of its
  // shard) into row `row` of `x` and `y`.
  absl::Status Decode(int64_t index, const char* span, const ByteRange& range, int64_t row,
                      at::Tensor& x, at::Tensor& y) const;
  absl::StatusOr<int> File(ReadState& state, int shard);
  int64_t BatchBytes(int64_t n) const;

  const ShardIndex index_;
  const ShardReaderOptions options_;
  Layout layout_;
  Dataset probe_;
  int64_t read_ahead_bytes_ = 0;
  int64_t sample_span_ = 0;  // the bytes of the first sample's members in its file
  // TAR: whether input_member / target_member are .pt members.
  bool x_pt_ = false, y_pt_ = false;
  // TAR: whether target_member is a text label (Note [Text label members]).
  bool y_text_ = false;
  // One per reading thread; the first also reads Open()'s probe.
  std::vector<ReadState> states_;
  // Batches to reuse (Note [Batch buffers] in shard_reader.cc).
  // `handed`: when Next() last returned it (a count of Next() calls).
  struct Pooled {
    ShardBatch batch;
    int64_t handed = 0;
  };
  absl::Mutex pool_mu_;
  std::vector<Pooled> pool_ ABSL_GUARDED_BY(pool_mu_);
  int64_t handed_ ABSL_GUARDED_BY(pool_mu_) = 0;
  int64_t pool_limit_ = 0;
  std::atomic<int64_t> bytes_read_{0}, reads_{0};
  double wait_seconds_ = 0;  // the trainer's thread only

  mutable absl::Mutex mu_;
  std::deque<ShardBatch> ready_ ABSL_GUARDED_BY(mu_);
  int64_t ready_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // queued and being read
  int64_t max_ready_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t batches_left_ ABSL_GUARDED_BY(mu_) = 0;  // not yet taken by Next()
  // Note [Parallel reads]: the samples of the last Start(), drawn by the
  // reading threads a batch at a time, the batch size, and the batches of
  // the Start() claimed by a reading thread and put in the queue so far.
  Samples samples_ ABSL_GUARDED_BY(mu_);
  int64_t batch_size_ ABSL_GUARDED_BY(mu_) = 1;
  // Note [Grouped reads]: the batches a reading thread claims at once.
  int64_t group_batches_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t claimed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t reading_at_ ABSL_GUARDED_BY(mu_) = 0;  // the first sample not yet claimed
  int64_t advised_ ABSL_GUARDED_BY(mu_) = 0;     // positions the advisor has advised
  std::vector<std::thread> readers_;
  std::thread advisor_;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_SHARD_READER_H_
