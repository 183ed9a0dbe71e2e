// The TOKENS format (ShardFormat, shard_format.h): flat token files, sample
// i of a file the L + 1 tokens from token i * L on (ShardIndex::Locate), x
// its first L tokens and y its last L, both int64.
#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/train/shard_format.h"

namespace chorus {
namespace {

class TokenFormat final : public ShardFormat {
 public:
  TokenFormat(const ShardIndex& index, const ShardReaderOptions& options, ElementType type,
              int64_t length)
      : ShardFormat(index, options, BatchShape{{length}, {length}, at::kLong, at::kLong}),
        type_(type),
        length_(length) {}

  absl::Status ReadSample(ShardFiles& files, int64_t index, const SampleLocation& loc, int64_t row,
                          ShardBatch& batch) const override {
    const ByteRange range = SpanOf(loc);
    std::vector<char>& scratch = files.scratch();
    scratch.resize(range.size);
    RETURN_IF_ERROR(files.Read(loc.shard, range, scratch.data()));
    return Decode(index, files.path(loc.shard), scratch.data(), range, row, batch);
  }

 private:
  // Decodes the tokens `span` of sample `index`, read from `range` of
  // `path`, into row `row` of `batch`; every one must be below the
  // vocabulary, if there is one.
  absl::Status Decode(int64_t index, const std::string& path, const char* span,
                      const ByteRange& range, int64_t row, ShardBatch& batch) const {
    char* x_row = RowData(batch.x, row);
    char* y_row = RowData(batch.y, row);
    const int w = ElementBytes(type_);
    ConvertElements(span, type_, length_, false, x_row);
    ConvertElements(span + w, type_, length_, false, y_row);
    const int64_t vocab_size = options().vocab_size;
    if (vocab_size <= 0) return absl::OkStatus();
    // The sample's L + 1 tokens: x, then y's last. The error names the
    // first one past the vocabulary at its own offset.
    const auto* xs = reinterpret_cast<const int64_t*>(x_row);
    const int64_t last = reinterpret_cast<const int64_t*>(y_row)[length_ - 1];
    const int64_t bad =
        std::find_if(xs, xs + length_, [&](int64_t t) { return t >= vocab_size; }) - xs;
    if (bad == length_ && last < vocab_size) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("data.shards: ", path, " at byte offset ", range.offset + bad * w, " (sample ",
                     index, "): token id ", bad < length_ ? xs[bad] : last,
                     " is not in [0, model.transformer_lm.vocab_size ", vocab_size, ")"));
  }

  const ElementType type_;  // as stored: uint16 or uint32
  const int64_t length_;    // L, data.shards.sequence_length
};

}  // namespace

std::unique_ptr<ShardFormat> OpenTokenFormat(const ShardIndex& index,
                                             const ShardReaderOptions& options) {
  const v1::ShardedData& spec = index.spec();
  const ElementType type =
      spec.token_type() == v1::ShardedData::UINT32 ? ElementType::kUInt32 : ElementType::kUInt16;
  return std::make_unique<TokenFormat>(index, options, type, spec.sequence_length());
}

}  // namespace chorus
