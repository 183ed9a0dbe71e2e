// The TAR format (ShardFormat, shard_format.h): ustar archives whose
// members KEY.SUFFIX group into samples (ShardIndex); a sample's input and
// target members are .npy, .pt or text label members (tar_members.h), each
// of the type and shape the first sample's has. An input stored as it is
// trained (float32, or int64 token ids, in a .npy member) is read straight
// into its batch row (Note [Batch buffers] in shard_pipeline.cc), and
// neighbouring such samples with one preadv (Note [Grouped reads] in
// shard_reader.cc).
#include <limits.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/train/shard_format.h"
#include "worker/train/tar_members.h"

namespace chorus {
namespace {

// Note [Grouped reads] in shard_reader.cc: the most samples one preadv
// reads, and how far apart (a tar header and padding) two samples may lie
// to be read by one.
constexpr int64_t kMaxRun = (IOV_MAX - 1) / 2;
constexpr int64_t kRunGap = int64_t{4} << 10;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// What every sample's input (or target) member holds: what the first
// sample's does.
struct MemberLayout {
  MemberKind kind = MemberKind::kNpy;
  ElementType type = ElementType::kFloat32;
  std::vector<int64_t> shape;
  // A .npy member's header, byte for byte: a member that starts with it
  // (and has its size) is not parsed again.
  std::string header;
};

// The layout of the first sample's member `range` of `path` (open as `fd`),
// a member of `kind`. Errors name the file, offset and member.
absl::StatusOr<MemberLayout> ProbeMember(const std::string& path, int fd, const ByteRange& range,
                                         MemberKind kind) {
  std::vector<char> bytes(range.size);
  if (::pread(fd, bytes.data(), range.size, range.offset) != range.size) {
    return absl::DataLossError(
        absl::StrCat("data.shards: cannot read ", path, " at byte offset ", range.offset));
  }
  absl::StatusOr<NpyArray> a;
  switch (kind) {
    case MemberKind::kTextLabel: {  // Note [Text label members] in tar_members.cc
      absl::StatusOr<int64_t> label = ParseTextLabel(bytes.data(), range.size);
      a = label.ok() ? absl::StatusOr<NpyArray>(NpyArray{ElementType::kInt64, {}, 0})
                     : label.status();
      break;
    }
    case MemberKind::kPt: {
      absl::StatusOr<PtMember> m = ParsePtMember(bytes.data(), range.size);
      a = m.ok() ? absl::StatusOr<NpyArray>(m->array) : m.status();
      break;
    }
    case MemberKind::kNpy:
      a = ParseNpy(bytes.data(), range.size);
      break;
  }
  if (!a.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.shards: ", path, " at byte offset ", range.offset, " (sample 0, member \"",
        TarMemberNameAt(path, range.offset), "\"): ", a.status().message()));
  }
  MemberLayout layout{kind, a->type, a->shape, ""};
  if (kind == MemberKind::kNpy) layout.header.assign(bytes.data(), a->data_offset);
  return layout;
}

class TarFormat final : public ShardFormat {
 public:
  TarFormat(const ShardIndex& index, const ShardReaderOptions& options, MemberLayout x,
            MemberLayout y);

  size_t RunEnd(const std::vector<Placement>& order, size_t begin) const override;
  bool ReadRun(ShardFiles& files, const int64_t* indices, const Placement* run, int64_t count,
               int64_t batch_size, std::vector<ShardBatch>& out,
               const Failure& fail) const override;
  absl::Status ReadSample(ShardFiles& files, int64_t index, const SampleLocation& loc, int64_t row,
                          ShardBatch& batch) const override;
  absl::Status CheckBatch(const ShardBatch& batch) const override;

 private:
  // ReadSample for an input read straight into its row (direct_).
  absl::Status ReadDirect(ShardFiles& files, int fd, int64_t index, const SampleLocation& loc,
                          int64_t row, ShardBatch& batch) const;
  // A sample read straight into row `row` of `batch`: checks its input's
  // .npy header (at `x_header`) and decodes its target (at `y_bytes`) into
  // the row.
  absl::Status CheckDirect(int64_t index, const std::string& path, const SampleLocation& loc,
                           const char* x_header, const char* y_bytes, int64_t row,
                           ShardBatch& batch) const;
  // Decodes sample `index` (its bytes `span` read from `range` of its
  // shard, at `loc`) into row `row` of `batch`.
  absl::Status Decode(int64_t index, const std::string& path, const SampleLocation& loc,
                      const char* span, const ByteRange& range, int64_t row,
                      ShardBatch& batch) const;
  // DecodeMember for the target, whose class ids (integer targets) must be
  // below options().num_classes.
  absl::Status DecodeTarget(int64_t index, const std::string& path, const ByteRange& member,
                            const char* bytes, bool to_float, char* out) const;
  // Parses and checks the `layout.kind` `member` at `bytes`, converting its
  // values to `out`; a .npy member that starts with layout.header and has
  // its size is not parsed again.
  absl::Status DecodeMember(int64_t index, const std::string& path, const ByteRange& member,
                            const char* bytes, const MemberLayout& layout, bool to_float,
                            char* out) const;
  // INVALID_ARGUMENT naming the file, offset, sample and member unless `a`
  // parsed and has `layout`'s type and shape.
  absl::Status CheckMember(int64_t index, const std::string& path, const ByteRange& member,
                           const absl::StatusOr<NpyArray>& a, const MemberLayout& layout) const;
  // ShardFormat::TokenPlace: where token `k` of a member lies.
  std::string TokenPlace(int64_t index, const SampleLocation& loc, bool input, int64_t k,
                         int64_t count) const;

  const MemberLayout x_, y_;
  const int64_t x_values_;  // the bytes of an input's values, as stored
  // Inputs are read straight into their batch rows: .npy members stored as
  // they are trained.
  const bool direct_;
};

TarFormat::TarFormat(const ShardIndex& index, const ShardReaderOptions& options, MemberLayout x,
                     MemberLayout y)
    : ShardFormat(index, options,
                  BatchShape{x.shape, y.shape,
                             IsFloating(x.type) || options.float_inputs ? at::kFloat : at::kLong,
                             IsFloating(y.type) ? at::kFloat : at::kLong}),
      x_(std::move(x)),
      y_(std::move(y)),
      x_values_(ElementCount(x_.shape) * ElementBytes(x_.type)),
      direct_(x_.kind == MemberKind::kNpy &&
              ((x_.type == ElementType::kFloat32 && batch_shape().x_type == at::kFloat) ||
               (x_.type == ElementType::kInt64 && batch_shape().x_type == at::kLong))) {}

size_t TarFormat::RunEnd(const std::vector<Placement>& order, size_t begin) const {
  if (!direct_ || order[begin].loc.x.size <= x_values_) return begin + 1;
  size_t end = begin + 1;
  while (end < order.size() && static_cast<int64_t>(end - begin) < kMaxRun) {
    const SampleLocation& last = order[end - 1].loc;
    const SampleLocation& next = order[end].loc;
    const int64_t gap = SpanOf(next).offset - SpanOf(last).end();
    if (next.shard != last.shard || gap < 0 || gap > kRunGap || next.x.size <= x_values_) break;
    ++end;
  }
  return end;
}

bool TarFormat::ReadRun(ShardFiles& files, const int64_t* indices, const Placement* run,
                        int64_t count, int64_t batch_size, std::vector<ShardBatch>& out,
                        const Failure& fail) const {
  const int64_t values = x_values_;
  const int64_t begin = SpanOf(run[0].loc).offset;
  const int64_t total = SpanOf(run[count - 1].loc).end() - begin;
  // The scratch buffer takes every byte of the run but the values, in file
  // order: the k-th sample's bytes before its values lie k values earlier
  // in it than in the file, those after them k + 1 values earlier.
  std::vector<char>& scratch = files.scratch();
  scratch.resize(total - count * values);
  std::vector<iovec>& parts = files.parts();
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
  const absl::StatusOr<int> fd = files.Open(run[0].loc.shard);
  if (!fd.ok()) return false;
  ssize_t r;
  do {
    r = ::preadv(*fd, parts.data(), static_cast<int>(parts.size()), begin);
  } while (r < 0 && errno == EINTR);
  if (r != total) return false;  // read again sample by sample, which says why
  files.Count(total);
  const std::string& path = files.path(run[0].loc.shard);
  for (int64_t k = 0; k < count; ++k) {
    const Placement& p = run[k];
    const char* x_header = scratch.data() + (p.loc.x.offset - begin) - k * values;
    const char* y_bytes = scratch.data() + (p.loc.y.offset - begin) -
                          (p.loc.y.offset < p.loc.x.offset ? k : k + 1) * values;
    absl::Status s = CheckDirect(indices[p.at], path, p.loc, x_header, y_bytes, p.at % batch_size,
                                 out[p.at / batch_size]);
    if (!s.ok()) fail(p.at, std::move(s));
  }
  return true;
}

absl::Status TarFormat::ReadSample(ShardFiles& files, int64_t index, const SampleLocation& loc,
                                   int64_t row, ShardBatch& batch) const {
  ASSIGN_OR_RETURN(const int fd, files.Open(loc.shard));
  if (direct_ && loc.x.size > x_values_) return ReadDirect(files, fd, index, loc, row, batch);
  const ByteRange range = SpanOf(loc);
  std::vector<char>& scratch = files.scratch();
  scratch.resize(range.size);
  RETURN_IF_ERROR(files.Read(loc.shard, range, scratch.data()));
  return Decode(index, files.path(loc.shard), loc, scratch.data(), range, row, batch);
}

absl::Status TarFormat::ReadDirect(ShardFiles& files, int fd, int64_t index,
                                   const SampleLocation& loc, int64_t row,
                                   ShardBatch& batch) const {
  // Note [Batch buffers] in shard_pipeline.cc: an input stored as it is
  // trained (float32, or int64 tokens ids) is read straight into its row,
  // around it the headers and the target into the scratch buffer.
  const ByteRange range = SpanOf(loc);
  const int64_t head = loc.x.end() - x_values_ - range.offset;
  const int64_t tail = range.end() - loc.x.end();
  std::vector<char>& scratch = files.scratch();
  scratch.resize(head + tail);
  char* x_row = static_cast<char*>(batch.x.data_ptr()) + row * x_values_;
  iovec parts[3] = {{scratch.data(), static_cast<size_t>(head)},
                    {x_row, static_cast<size_t>(x_values_)},
                    {scratch.data() + head, static_cast<size_t>(tail)}};
  const ssize_t r = ::preadv(fd, parts, 3, range.offset);
  if (r != range.size) return files.ReadError(loc.shard, range.offset, r);
  files.Count(range.size);
  const char* y_bytes = loc.y.offset < loc.x.offset
                            ? scratch.data() + (loc.y.offset - range.offset)
                            : scratch.data() + head + (loc.y.offset - loc.x.end());
  return CheckDirect(index, files.path(loc.shard), loc,
                     scratch.data() + (loc.x.offset - range.offset), y_bytes, row, batch);
}

absl::Status TarFormat::CheckDirect(int64_t index, const std::string& path,
                                    const SampleLocation& loc, const char* x_header,
                                    const char* y_bytes, int64_t row, ShardBatch& batch) const {
  const int64_t header = loc.x.size - x_values_;
  const std::string& known = x_.header;
  if (header != static_cast<int64_t>(known.size()) ||
      std::memcmp(x_header, known.data(), known.size()) != 0) {
    absl::StatusOr<NpyArray> a = ParseNpyHeader(x_header, header, loc.x.size);
    RETURN_IF_ERROR(CheckMember(index, path, loc.x, a, x_));
    if (a->data_offset != header) {  // a longer header than the values leave room for
      return CheckMember(index, path, loc.x,
                         absl::InvalidArgumentError("its .npy header is not where its size says"),
                         x_);
    }
  }
  return DecodeTarget(index, path, loc.y, y_bytes, batch.y.scalar_type() == at::kFloat,
                      RowData(batch.y, row));
}

absl::Status TarFormat::Decode(int64_t index, const std::string& path, const SampleLocation& loc,
                               const char* span, const ByteRange& range, int64_t row,
                               ShardBatch& batch) const {
  RETURN_IF_ERROR(DecodeMember(index, path, loc.x, span + (loc.x.offset - range.offset), x_,
                               batch.x.scalar_type() == at::kFloat, RowData(batch.x, row)));
  return DecodeTarget(index, path, loc.y, span + (loc.y.offset - range.offset),
                      batch.y.scalar_type() == at::kFloat, RowData(batch.y, row));
}

absl::Status TarFormat::DecodeTarget(int64_t index, const std::string& path,
                                     const ByteRange& member, const char* bytes, bool to_float,
                                     char* out) const {
  RETURN_IF_ERROR(DecodeMember(index, path, member, bytes, y_, to_float, out));
  if (to_float) return absl::OkStatus();
  return CheckClasses(index, path, member.offset, reinterpret_cast<const int64_t*>(out));
}

absl::Status TarFormat::DecodeMember(int64_t index, const std::string& path,
                                     const ByteRange& member, const char* bytes,
                                     const MemberLayout& layout, bool to_float, char* out) const {
  switch (layout.kind) {
    case MemberKind::kTextLabel: {
      // Note [Text label members] in tar_members.cc: int64, shape (), as the
      // first sample's.
      const absl::StatusOr<int64_t> label = ParseTextLabel(bytes, member.size);
      RETURN_IF_ERROR(CheckMember(
          index, path, member,
          label.ok() ? absl::StatusOr<NpyArray>(NpyArray{ElementType::kInt64}) : label.status(),
          layout));
      ConvertElements(reinterpret_cast<const char*>(&*label), ElementType::kInt64, 1, to_float,
                      out);
      return absl::OkStatus();
    }
    case MemberKind::kPt: {  // Note [.pt members] in tar_members.cc
      absl::StatusOr<PtMember> m = ParsePtMember(bytes, member.size);
      RETURN_IF_ERROR(CheckMember(
          index, path, member, m.ok() ? absl::StatusOr<NpyArray>(m->array) : m.status(), layout));
      ConvertElements(static_cast<const char*>(m->tensor.data_ptr()), layout.type, m->array.count(),
                      to_float, out);
      return absl::OkStatus();
    }
    case MemberKind::kNpy:
      break;
  }
  const std::string& known = layout.header;
  const int64_t count = ElementCount(layout.shape);
  if (!known.empty() &&
      member.size == static_cast<int64_t>(known.size()) + count * ElementBytes(layout.type) &&
      std::memcmp(bytes, known.data(), known.size()) == 0) {
    ConvertElements(bytes + known.size(), layout.type, count, to_float, out);
    return absl::OkStatus();
  }
  const absl::StatusOr<NpyArray> a = ParseNpy(bytes, member.size);
  RETURN_IF_ERROR(CheckMember(index, path, member, a, layout));
  ConvertElements(bytes + a->data_offset, layout.type, a->count(), to_float, out);
  return absl::OkStatus();
}

absl::Status TarFormat::CheckMember(int64_t index, const std::string& path, const ByteRange& member,
                                    const absl::StatusOr<NpyArray>& a,
                                    const MemberLayout& layout) const {
  const ElementType type = layout.type;
  const std::vector<int64_t>& shape = layout.shape;
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

absl::Status TarFormat::CheckBatch(const ShardBatch& batch) const {
  if (options().vocab_size <= 0) return absl::OkStatus();
  return CheckTokenIds(batch,
                       [this](int64_t index, const SampleLocation& loc, bool input, int64_t k,
                              int64_t count) { return TokenPlace(index, loc, input, k, count); });
}

std::string TarFormat::TokenPlace(int64_t index, const SampleLocation& loc, bool input, int64_t k,
                                  int64_t count) const {
  const ByteRange& member = input ? loc.x : loc.y;
  const MemberLayout& layout = input ? x_ : y_;
  const std::string& path = PathOf(loc.shard);
  const std::string name = TarMemberNameAt(path, member.offset);
  if (layout.kind == MemberKind::kPt) {
    // Note [.pt members] in tar_members.cc: where its values lie is
    // torch.save's.
    return absl::StrCat("data.shards: ", path, " at byte offset ", member.offset, " (sample ",
                        index, ", element ", k, " of member \"", name, "\")");
  }
  // A .npy member's values end it.
  return absl::StrCat("data.shards: ", path, " at byte offset ",
                      member.end() - (count - k) * ElementBytes(layout.type), " (sample ", index,
                      ", element ", k, " of member \"", name, "\")");
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardFormat>> OpenTarFormat(const ShardIndex& index,
                                                           const ShardReaderOptions& options,
                                                           ShardFiles& files) {
  // The first sample's members set the layout every sample must have.
  const v1::ShardedData& spec = index.spec();
  const SampleLocation first = index.Locate(0);
  ASSIGN_OR_RETURN(const int fd, files.Open(first.shard));
  const std::string& path = files.path(first.shard);
  ASSIGN_OR_RETURN(MemberLayout x,
                   ProbeMember(path, fd, first.x, InputMemberKind(spec.input_member())));
  ASSIGN_OR_RETURN(MemberLayout y,
                   ProbeMember(path, fd, first.y, TargetMemberKind(spec.target_member())));
  return std::make_unique<TarFormat>(index, options, std::move(x), std::move(y));
}

}  // namespace chorus
