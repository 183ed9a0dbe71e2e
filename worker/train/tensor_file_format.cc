// The TENSOR_FILES format (ShardFormat, shard_format.h): files written by
// torch.save({'x': inputs, 'y': targets}), sample i row i of x and of y.
// Note [Tensor file shards] in shard_index.cc: a sample's two rows lie far
// apart in the file, so each is read on its own, straight into its batch
// row when it is stored as it is trained.
#include <memory>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/train/shard_format.h"

namespace chorus {
namespace {

// Values of `type` decoded into `out` (at::kFloat or at::kLong) are copied
// as they are, unconverted.
bool StoredAsDecoded(ElementType type, at::ScalarType out) {
  return (type == ElementType::kFloat32 && out == at::kFloat) ||
         (type == ElementType::kInt64 && out == at::kLong);
}

class TensorFileFormat final : public ShardFormat {
 public:
  // `x` and `y`: the rows every shard has (ShardIndex::Build checks it).
  TensorFileFormat(const ShardIndex& index, const ShardReaderOptions& options, const TensorRows& x,
                   const TensorRows& y)
      : ShardFormat(index, options,
                    BatchShape{x.shape, y.shape,
                               IsFloating(x.type) || options.float_inputs ? at::kFloat : at::kLong,
                               IsFloating(y.type) ? at::kFloat : at::kLong}),
        x_type_(x.type),
        y_type_(y.type) {}

  // The two rows, each on its own: the bytes between them are other
  // samples'.
  void AppendStoredRanges(const SampleLocation& loc, std::vector<ShardRange>& out) const override {
    out.push_back(ShardRange{loc.shard, loc.x});
    out.push_back(ShardRange{loc.shard, loc.y});
  }

  absl::Status ReadSample(ShardFiles& files, int64_t index, const SampleLocation& loc, int64_t row,
                          ShardBatch& batch) const override {
    const BatchShape& shape = batch_shape();
    for (const auto& [range, type, count, out] :
         {std::tuple{loc.x, x_type_, ElementCount(shape.x), &batch.x},
          std::tuple{loc.y, y_type_, ElementCount(shape.y), &batch.y}}) {
      const bool to_float = out->scalar_type() == at::kFloat;
      char* dst = RowData(*out, row);
      if (StoredAsDecoded(type, out->scalar_type())) {
        RETURN_IF_ERROR(files.Read(loc.shard, range, dst));
        continue;
      }
      std::vector<char>& scratch = files.scratch();
      scratch.resize(range.size);
      RETURN_IF_ERROR(files.Read(loc.shard, range, scratch.data()));
      ConvertElements(scratch.data(), type, count, to_float, dst);
    }
    if (batch.y.scalar_type() == at::kFloat) return absl::OkStatus();
    return CheckClasses(index, files.path(loc.shard), loc.y.offset,
                        reinterpret_cast<const int64_t*>(RowData(batch.y, row)));
  }

  absl::Status CheckBatch(const ShardBatch& batch) const override {
    if (options().vocab_size <= 0) return absl::OkStatus();
    return CheckTokenIds(batch, [this](int64_t sample, const SampleLocation& loc, bool input,
                                       int64_t k, int64_t count) {
      // A row holds the values alone.
      const ByteRange& member = input ? loc.x : loc.y;
      const int bytes = ElementBytes(input ? x_type_ : y_type_);
      return absl::StrCat("data.shards: ", PathOf(loc.shard), " at byte offset ",
                          member.offset + k * bytes, " (sample ", sample, ", element ", k,
                          " of its ", input ? "x" : "y", " row)");
    });
  }

 private:
  const ElementType x_type_, y_type_;  // as stored
};

}  // namespace

std::unique_ptr<ShardFormat> OpenTensorFileFormat(const ShardIndex& index,
                                                  const ShardReaderOptions& options) {
  const ShardIndex::Shard& first = index.shards()[0];
  return std::make_unique<TensorFileFormat>(index, options, first.x_rows, first.y_rows);
}

}  // namespace chorus
