// ShardIndex: where every sample of a sharded dataset (data.shards) lies,
// built from the files' headers alone, so that a sample can be read by its
// number without reading anything before it. Samples are numbered shard
// after shard, in the order of data.shards.paths (globs expanded, sorted);
// every rank builds the same index from the same files.
//
// The formats (job.proto, ShardedData):
// - TAR: ustar archives (also GNU long names and pax `path` records) whose
//   members KEY.SUFFIX group into samples by KEY; the members named by
//   input_member and target_member are NumPy .npy files or torch.save
//   tensors (.pt, .pth). Only the tar headers are read here, or nothing at
//   all when the shard has an index file SHARD.idx beside it
//   (WriteIndexFile, Note [Index files] in shard_index.cc); a member is
//   parsed with its sample, by the reader (ParseNpy here, LibTorch for .pt).
// - TOKENS: flat little-endian uint16/uint32 token files; sample i of a file
//   is tokens [i*L, i*L + L + 1), L = sequence_length.
// - TENSOR_FILES: torch.save({'x': inputs, 'y': targets}) files; sample i
//   is row i of x and y, a fixed byte range of each tensor's storage in the
//   file, found from the file's zip directory and data.pkl alone (Note
//   [Tensor file shards] in shard_index.cc, torch_save_file.h).
// A damaged file is INVALID_ARGUMENT naming the file and the byte offset.
//
// This file needs no LibTorch: the reader (shard_reader.h) turns bytes into
// tensors.
//
// Thread-safety: an index is immutable once built; ParseNpy and
// ConvertElements are pure functions.
//
// Example:
//   ASSIGN_OR_RETURN(ShardIndex index, ShardIndex::Build(spec.data().shards()));
//   SampleLocation where = index.Locate(12345);  // shard, x and y byte ranges
#ifndef CHORUS_WORKER_TRAIN_SHARD_INDEX_H_
#define CHORUS_WORKER_TRAIN_SHARD_INDEX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "chorus/v1/job.pb.h"

namespace chorus {

// The element types that are read (little-endian): NumPy .npy types, and
// the torch dtypes among them (no uint16/uint32).
enum class ElementType {
  kFloat32,
  kFloat64,
  kInt8,
  kUInt8,
  kInt16,
  kUInt16,
  kInt32,
  kUInt32,
  kInt64
};

// Reads exactly `size` bytes of `fd` at `offset` into `out` (pread, again
// after EINTR and short reads); false on an error or the file's end.
bool ReadAt(int fd, char* out, int64_t size, int64_t offset);

// A byte range of a shard file.
struct ByteRange {
  int64_t offset = 0;
  int64_t size = 0;
  int64_t end() const { return offset + size; }
};

// Where one sample lies: its shard, and the byte ranges of its input and
// target (TAR: the whole members; TOKENS: the same L + 1 tokens;
// TENSOR_FILES: the sample's row of x and of y, apart from each other).
struct SampleLocation {
  int shard = 0;
  ByteRange x;
  ByteRange y;
};

// A TAR sample's members as the index keeps them: 24 bytes a sample (its
// shard is implied by where it is kept).
struct TarSample {
  int64_t x_offset = 0;
  int64_t y_offset = 0;
  int32_t x_size = 0;
  int32_t y_size = 0;
};

// Where the rows of one tensor of a TENSOR_FILES shard lie: row i is the
// `row_bytes` at offset + i * row_bytes, values of `type` and `shape`.
struct TensorRows {
  int64_t offset = 0;
  int64_t row_bytes = 0;
  ElementType type = ElementType::kFloat32;
  std::vector<int64_t> shape;  // of one row (the tensor's sizes after the first)
};

class ShardIndex {
 public:
  struct Shard {
    std::string path;
    int64_t first = 0;  // the number of its first sample
    int64_t count = 0;
    std::vector<TarSample> samples;  // TAR only (other formats' samples are computed)
    TensorRows x_rows, y_rows;       // TENSOR_FILES only
  };

  // Expands data.shards.paths and reads every TAR file's index file, or its
  // headers where it has none or a stale one, and every TENSOR_FILES file's
  // zip directory and data.pkl. NOT_FOUND for a missing file
  // or a glob that matches none, INVALID_ARGUMENT for a damaged one (shard
  // or index file), each naming the file (and offset) and the spec field.
  static absl::StatusOr<ShardIndex> Build(const v1::ShardedData& spec);

  int64_t size() const { return size_; }
  const std::vector<Shard>& shards() const { return shards_; }
  std::vector<int64_t> ShardSizes() const;
  v1::ShardedData::Format format() const { return spec_.format(); }
  const v1::ShardedData& spec() const { return spec_; }
  // Bytes per token of a TOKENS index.
  int token_bytes() const { return spec_.token_type() == v1::ShardedData::UINT32 ? 4 : 2; }

  // Sample `index`'s place. REQUIRES: 0 <= index < size().
  SampleLocation Locate(int64_t index) const;

  // One fingerprint per shard, of what numbers its samples: the file's name
  // (without its directory), its sample count and, for TAR, where each
  // sample's members lie. Checkpoints carry them (Note [Shard fingerprints]
  // in shard_index.cc); the same on every machine and in every process.
  std::vector<int64_t> Fingerprints() const;

 private:
  v1::ShardedData spec_;
  std::vector<Shard> shards_;
  int64_t size_ = 0;
};

// OK if `saved` (the Fingerprints() a checkpoint carries; empty: none) are
// `index`'s; else FAILED_PRECONDITION naming the first shard that differs.
absl::Status CheckFingerprints(const ShardIndex& index, const std::vector<int64_t>& saved);

// data.shards.paths with every glob replaced by its matches, sorted by
// name. NOT_FOUND naming the entry for a glob that matches nothing.
absl::StatusOr<std::vector<std::string>> ExpandShardPaths(const v1::ShardedData& spec);

// Scans the tar file `path` (`size` bytes, open as `fd`) and appends its
// samples to `out`. Members of 2 GiB or more are refused.
absl::Status ScanTar(int fd, const std::string& path, int64_t size, const std::string& input_member,
                     const std::string& target_member, std::vector<TarSample>& out);

// The name in the tar header of the member of `path` whose data start at
// `data_offset` (for error messages: the header's own name, up to 255
// bytes with its ustar prefix), or "?" if it cannot be read.
std::string TarMemberNameAt(const std::string& path, int64_t data_offset);

// The index file of the TAR shard `shard_path`: SHARD.idx beside it.
std::string IndexFilePath(const std::string& shard_path);

// Scans the TAR shard `shard_path` for samples of `input_member` and
// `target_member` and writes its index file (to a temporary name renamed
// into place). The shard's errors as ScanTar's; DATA_LOSS naming the index
// file if it cannot be written.
absl::Status WriteIndexFile(const std::string& shard_path, const std::string& input_member,
                            const std::string& target_member);

bool IsFloating(ElementType t);
int ElementBytes(ElementType t);
// NumPy's name of `t`: "float32", "uint16", "int64", ...
const char* ElementTypeName(ElementType t);

// A parsed .npy file: its element type, shape and where the values start.
struct NpyArray {
  ElementType type = ElementType::kFloat32;
  std::vector<int64_t> shape;
  int64_t data_offset = 0;  // from the start of the file
  int64_t count() const;
};

// Parses the .npy bytes `data[0, size)`: version 1, 2 or 3 headers, C order,
// little-endian types above. INVALID_ARGUMENT saying what is wrong (the
// caller adds the file and offset); the values must fill the rest exactly.
absl::StatusOr<NpyArray> ParseNpy(const char* data, int64_t size);
// The same for a member of `size` bytes of which only the first `available`
// (its header, at least) are at `data`: nothing past them is read, and the
// values are not looked at.
absl::StatusOr<NpyArray> ParseNpyHeader(const char* data, int64_t available, int64_t size);

// Converts `count` values of type `from` at `src` to float32 (`to_float`)
// or int64 at `dst`.
void ConvertElements(const char* src, ElementType from, int64_t count, bool to_float, void* dst);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_SHARD_INDEX_H_
