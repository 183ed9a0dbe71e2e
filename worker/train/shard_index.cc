#include "worker/train/shard_index.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

constexpr int64_t kBlock = 512;

// Reads exactly `size` bytes at `offset`; false on a short read or error.
bool ReadAt(int fd, char* out, int64_t size, int64_t offset) {
  while (size > 0) {
    const ssize_t n = ::pread(fd, out, static_cast<size_t>(size), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    out += n;
    size -= n;
    offset += n;
  }
  return true;
}

// A tar header's numeric field: octal digits (NUL/space terminated) or, with
// the high bit of the first byte set, GNU's big-endian base-256.
std::optional<int64_t> TarNumber(const char* field, int width) {
  const auto* u = reinterpret_cast<const unsigned char*>(field);
  if (u[0] & 0x80) {
    int64_t v = u[0] & 0x7f;
    for (int i = 1; i < width; ++i) {
      if (v > (INT64_MAX >> 8)) return std::nullopt;
      v = (v << 8) | u[i];
    }
    return v;
  }
  int64_t v = 0;
  int i = 0;
  while (i < width && field[i] == ' ') ++i;
  bool any = false;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (v > (INT64_MAX >> 3)) return std::nullopt;
    v = v * 8 + (field[i] - '0');
    any = true;
  }
  if (i < width && field[i] != '\0' && field[i] != ' ') return std::nullopt;
  return any ? std::optional<int64_t>(v) : std::nullopt;
}

// Whether the header block's checksum (bytes summed with the checksum
// field as spaces) matches its field.
bool ChecksumMatches(const char* h) {
  const std::optional<int64_t> stored = TarNumber(h + 148, 8);
  if (!stored) return false;
  int64_t sum = 0;
  for (int i = 0; i < kBlock; ++i) {
    sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
  }
  return sum == *stored;
}

std::string CString(const char* field, int width) {
  return std::string(field, strnlen(field, width));
}

// The value of the `path` record of a pax extended header ("LEN path=VALUE\n"
// records), if any.
std::optional<std::string> PaxPath(const std::string& records) {
  size_t at = 0;
  while (at < records.size()) {
    const size_t space = records.find(' ', at);
    int64_t len = 0;
    if (space == std::string::npos || !absl::SimpleAtoi(records.substr(at, space - at), &len) ||
        len <= 0 || at + len > records.size()) {
      return std::nullopt;
    }
    const std::string record = records.substr(space + 1, at + len - space - 2);
    if (absl::StartsWith(record, "path=")) return record.substr(5);
    at += len;
  }
  return std::nullopt;
}

// The sample being gathered from consecutive members of one key.
struct PendingSample {
  std::string key;
  int64_t offset = 0;  // of its first member's header
  std::optional<ByteRange> x, y;
};

std::string Where(const std::string& path, int64_t offset) {
  return absl::StrCat(path, " at byte offset ", offset);
}

// One member of a tar file, its long name (GNU or pax) applied.
struct TarMember {
  std::string name;
  char type = '0';
  int64_t header = 0;  // offset of its header block
  ByteRange data;
  int64_t next = 0;  // offset of the next header block
};

// Reads the member whose header (or whose long-name headers) start at
// `offset`; nullopt at the end of the archive. Errors name file and offset.
absl::StatusOr<std::optional<TarMember>> ReadMember(int fd, const std::string& path, int64_t size,
                                                    int64_t offset) {
  std::optional<std::string> long_name;
  char h[kBlock];
  for (; offset + kBlock <= size;) {
    if (!ReadAt(fd, h, kBlock, offset)) {
      return absl::DataLossError(absl::StrCat("data.shards: cannot read ", Where(path, offset),
                                              ": ", std::strerror(errno)));
    }
    if (std::all_of(h, h + kBlock, [](char c) { return c == '\0'; })) return std::nullopt;
    if (!ChecksumMatches(h)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.shards: ", Where(path, offset),
          ": not a tar header (bad checksum); the shard is damaged or not a tar file"));
    }
    const std::optional<int64_t> member_size = TarNumber(h + 124, 12);
    const int64_t data = offset + kBlock;
    if (!member_size || *member_size > size - data) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.shards: ", Where(path, offset), ": member \"", CString(h, 100),
                       "\" of ", member_size.value_or(-1), " bytes runs past the end of the file (",
                       size, " bytes): the shard is truncated"));
    }
    const int64_t next = data + (*member_size + kBlock - 1) / kBlock * kBlock;
    const char type = h[156];
    if (type != 'L' && type != 'x') {
      std::string name =
          long_name.value_or(std::memcmp(h + 257, "ustar", 5) == 0 && h[345] != '\0'
                                 ? absl::StrCat(CString(h + 345, 155), "/", CString(h, 100))
                                 : CString(h, 100));
      return TarMember{std::move(name), type, offset, ByteRange{data, *member_size}, next};
    }
    std::string text(static_cast<size_t>(*member_size), '\0');  // the next member's name
    if (!ReadAt(fd, text.data(), *member_size, data)) {
      return absl::DataLossError(absl::StrCat("data.shards: cannot read ", Where(path, data)));
    }
    if (type == 'L') long_name = CString(text.data(), static_cast<int>(text.size()));
    if (type == 'x') {
      if (std::optional<std::string> p = PaxPath(text)) long_name = *p;
    }
    offset = next;
  }
  if (offset < size) {
    return absl::InvalidArgumentError(absl::StrCat("data.shards: ", Where(path, offset),
                                                   ": the file ends inside a tar header: the "
                                                   "shard is truncated"));
  }
  return std::nullopt;
}

}  // namespace

absl::Status ScanTar(int fd, const std::string& path, int64_t size, const std::string& input_member,
                     const std::string& target_member, std::vector<TarSample>& out) {
  PendingSample pending;
  auto close_sample = [&]() -> absl::Status {
    if (!pending.x && !pending.y) return absl::OkStatus();  // a key with neither: not a sample
    if (!pending.x || !pending.y) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.shards: ", Where(path, pending.offset), ": sample \"", pending.key,
                       "\" has no ", pending.x ? target_member : input_member,
                       " member (a sample's members must be consecutive)"));
    }
    out.push_back(TarSample{pending.x->offset, pending.y->offset,
                            static_cast<int32_t>(pending.x->size),
                            static_cast<int32_t>(pending.y->size)});
    return absl::OkStatus();
  };
  for (int64_t offset = 0;;) {
    ASSIGN_OR_RETURN(const std::optional<TarMember> m, ReadMember(fd, path, size, offset));
    if (!m) break;
    offset = m->next;
    if (m->type != '0' && m->type != '\0' && m->type != '7') continue;  // not a regular file
    const size_t slash = m->name.rfind('/');
    const size_t dot = m->name.find('.', slash == std::string::npos ? 0 : slash + 1);
    const std::string key = dot == std::string::npos ? m->name : m->name.substr(0, dot);
    const std::string suffix = dot == std::string::npos ? "" : m->name.substr(dot + 1);
    if (key != pending.key) {
      RETURN_IF_ERROR(close_sample());
      pending = PendingSample{key, m->header, std::nullopt, std::nullopt};
    }
    std::optional<ByteRange>* slot = suffix == input_member    ? &pending.x
                                     : suffix == target_member ? &pending.y
                                                               : nullptr;
    if (slot == nullptr) continue;
    if (slot->has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("data.shards: ", Where(path, m->header),
                                                     ": sample \"", key, "\" has a second ", suffix,
                                                     " member"));
    }
    if (m->data.size > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.shards: ", Where(path, m->header), ": member \"", m->name, "\" has ",
                       m->data.size, " bytes; members of 2 GiB or more are not read"));
    }
    *slot = m->data;
  }
  return close_sample();
}

absl::StatusOr<std::vector<std::string>> ExpandShardPaths(const v1::ShardedData& spec) {
  std::vector<std::string> out;
  for (int i = 0; i < spec.paths_size(); ++i) {
    const std::string& entry = spec.paths(i);
    if (entry.find_first_of("*?[") == std::string::npos) {
      out.push_back(entry);
      continue;
    }
    glob_t g;
    const int rc = ::glob(entry.c_str(), GLOB_ERR, nullptr, &g);  // sorted by name
    if (rc == 0) {
      for (size_t m = 0; m < g.gl_pathc; ++m) out.push_back(g.gl_pathv[m]);
    }
    ::globfree(&g);
    if (rc != 0) {
      return absl::NotFoundError(absl::StrCat("data.shards.paths[", i, "]: \"", entry,
                                              "\" matches no file on this machine"));
    }
  }
  return out;
}

absl::StatusOr<ShardIndex> ShardIndex::Build(const v1::ShardedData& spec) {
  ShardIndex index;
  index.spec_ = spec;
  ASSIGN_OR_RETURN(const std::vector<std::string> paths, ExpandShardPaths(spec));
  const int64_t token_bytes = index.token_bytes();
  for (const std::string& path : paths) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      const int err = errno;
      if (fd >= 0) ::close(fd);
      return absl::NotFoundError(
          absl::StrCat("data.shards.paths: cannot open ", path, ": ", std::strerror(err)));
    }
    Shard shard;
    shard.path = path;
    shard.first = index.size_;
    absl::Status scanned;
    if (spec.format() == v1::ShardedData::TAR) {
      scanned =
          ScanTar(fd, path, st.st_size, spec.input_member(), spec.target_member(), shard.samples);
      shard.count = static_cast<int64_t>(shard.samples.size());
    } else if (st.st_size % token_bytes != 0) {
      scanned = absl::InvalidArgumentError(
          absl::StrCat("data.shards: ", path, " has ", st.st_size, " bytes, not a whole number of ",
                       token_bytes, "-byte tokens (data.shards.token_type)"));
    } else {
      const int64_t tokens = st.st_size / token_bytes;
      shard.count = tokens > 0 ? (tokens - 1) / spec.sequence_length() : 0;
    }
    ::close(fd);
    RETURN_IF_ERROR(scanned);
    index.size_ += shard.count;
    index.shards_.push_back(std::move(shard));
  }
  if (index.size_ == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.shards.paths: the ", paths.size(), " shard file(s) hold no samples",
                     spec.format() == v1::ShardedData::TAR
                         ? absl::StrCat(" (members *.", spec.input_member(), " with *.",
                                        spec.target_member(), ")")
                         : absl::StrCat(" of ", spec.sequence_length(), " + 1 tokens")));
  }
  return index;
}

std::vector<int64_t> ShardIndex::ShardSizes() const {
  std::vector<int64_t> sizes;
  sizes.reserve(shards_.size());
  for (const Shard& s : shards_) sizes.push_back(s.count);
  return sizes;
}

SampleLocation ShardIndex::Locate(int64_t index) const {
  // The last shard whose first sample is at or before `index` (empty shards
  // share their `first` with the next one, which upper_bound skips past).
  auto it = std::upper_bound(shards_.begin(), shards_.end(), index,
                             [](int64_t i, const Shard& s) { return i < s.first; });
  const int shard = static_cast<int>(it - shards_.begin()) - 1;
  const Shard& s = shards_[shard];
  const int64_t local = index - s.first;
  if (spec_.format() == v1::ShardedData::TAR) {
    const TarSample& t = s.samples[local];
    return SampleLocation{shard, ByteRange{t.x_offset, t.x_size}, ByteRange{t.y_offset, t.y_size}};
  }
  const int64_t length = spec_.sequence_length();
  const ByteRange tokens{local * length * token_bytes(), (length + 1) * token_bytes()};
  return SampleLocation{shard, tokens, tokens};
}

bool IsFloating(ElementType t) { return t == ElementType::kFloat32 || t == ElementType::kFloat64; }

int ElementBytes(ElementType t) {
  switch (t) {
    case ElementType::kInt8:
    case ElementType::kUInt8:
      return 1;
    case ElementType::kInt16:
    case ElementType::kUInt16:
      return 2;
    case ElementType::kFloat32:
    case ElementType::kInt32:
    case ElementType::kUInt32:
      return 4;
    case ElementType::kFloat64:
    case ElementType::kInt64:
      return 8;
  }
  return 1;
}

int64_t NpyArray::count() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// The quoted or bare value after `'key':` in a .npy header dict.
std::optional<std::string> NpyField(const std::string& header, const std::string& key) {
  const size_t at = header.find(absl::StrCat("'", key, "'"));
  if (at == std::string::npos) return std::nullopt;
  const size_t colon = header.find(':', at);
  if (colon == std::string::npos) return std::nullopt;
  size_t begin = header.find_first_not_of(' ', colon + 1);
  if (begin == std::string::npos) return std::nullopt;
  if (header[begin] == '\'') {
    const size_t end = header.find('\'', begin + 1);
    if (end == std::string::npos) return std::nullopt;
    return header.substr(begin + 1, end - begin - 1);
  }
  if (header[begin] == '(') {
    const size_t end = header.find(')', begin);
    if (end == std::string::npos) return std::nullopt;
    return header.substr(begin + 1, end - begin - 1);
  }
  const size_t end = header.find_first_of(",}", begin);
  return std::string(absl::StripAsciiWhitespace(header.substr(begin, end - begin)));
}

std::optional<ElementType> NpyType(const std::string& descr) {
  if (descr.size() != 3 || (descr[0] != '<' && descr[0] != '|' && descr[0] != '=')) {
    return std::nullopt;
  }
  const std::string kind = descr.substr(1);
  if (kind == "f4") return ElementType::kFloat32;
  if (kind == "f8") return ElementType::kFloat64;
  if (kind == "i1") return ElementType::kInt8;
  if (kind == "u1") return ElementType::kUInt8;
  if (kind == "i2") return ElementType::kInt16;
  if (kind == "u2") return ElementType::kUInt16;
  if (kind == "i4") return ElementType::kInt32;
  if (kind == "u4") return ElementType::kUInt32;
  if (kind == "i8") return ElementType::kInt64;
  return std::nullopt;
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(const char* data, int64_t size) {
  return ParseNpyHeader(data, size, size);
}

absl::StatusOr<NpyArray> ParseNpyHeader(const char* data, int64_t available, int64_t size) {
  if (available < 10 || std::memcmp(data, "\x93NUMPY", 6) != 0) {
    return absl::InvalidArgumentError("not a .npy file (no \\x93NUMPY magic)");
  }
  const auto* u = reinterpret_cast<const unsigned char*>(data);
  const int major = u[6];
  int64_t header_len, header_at;
  if (major == 1) {
    header_len = u[8] | (u[9] << 8);
    header_at = 10;
  } else if ((major == 2 || major == 3) && available >= 12) {
    header_len =
        int64_t{u[8]} | (int64_t{u[9]} << 8) | (int64_t{u[10]} << 16) | (int64_t{u[11]} << 24);
    header_at = 12;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(".npy version ", major, " is not read"));
  }
  if (header_at + header_len > available) {
    return absl::InvalidArgumentError(".npy header is truncated");
  }
  const std::string header(data + header_at, static_cast<size_t>(header_len));
  const std::optional<std::string> descr = NpyField(header, "descr");
  const std::optional<std::string> fortran = NpyField(header, "fortran_order");
  const std::optional<std::string> shape = NpyField(header, "shape");
  if (!descr || !fortran || !shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(".npy header \"", header, "\" lacks descr, fortran_order or shape"));
  }
  NpyArray a;
  const std::optional<ElementType> type = NpyType(*descr);
  if (!type) {
    return absl::InvalidArgumentError(
        absl::StrCat(".npy type '", *descr,
                     "' is not read (little-endian f4, f8, i1, u1, i2, u2, i4, u4 or i8 are)"));
  }
  if (*fortran != "False") {
    return absl::InvalidArgumentError(".npy array is in Fortran order; write it in C order");
  }
  a.type = *type;
  for (absl::string_view dim : absl::StrSplit(*shape, ',', absl::SkipWhitespace())) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(dim, &d) || d < 0 || d > (int64_t{1} << 40)) {
      return absl::InvalidArgumentError(absl::StrCat(".npy shape (", *shape, ") is not valid"));
    }
    a.shape.push_back(d);
  }
  a.data_offset = header_at + header_len;
  const int64_t bytes = size - a.data_offset;
  if (a.count() > bytes / ElementBytes(a.type) || a.count() * ElementBytes(a.type) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(".npy shape (", *shape, ") of '", *descr,
                                                   "' needs ", a.count() * ElementBytes(a.type),
                                                   " bytes of values, the member has ", bytes));
  }
  return a;
}

namespace {

template <typename From>
void ConvertFrom(const char* src, int64_t count, bool to_float, void* dst) {
  for (int64_t i = 0; i < count; ++i) {
    From v;
    std::memcpy(&v, src + i * sizeof(From), sizeof(From));
    if (to_float) {
      static_cast<float*>(dst)[i] = static_cast<float>(v);
    } else {
      static_cast<int64_t*>(dst)[i] = static_cast<int64_t>(v);
    }
  }
}

}  // namespace

void ConvertElements(const char* src, ElementType from, int64_t count, bool to_float, void* dst) {
  switch (from) {
    case ElementType::kFloat32:
      if (to_float) {
        std::memcpy(dst, src, count * sizeof(float));
        return;
      }
      return ConvertFrom<float>(src, count, to_float, dst);
    case ElementType::kFloat64:
      return ConvertFrom<double>(src, count, to_float, dst);
    case ElementType::kInt8:
      return ConvertFrom<int8_t>(src, count, to_float, dst);
    case ElementType::kUInt8:
      return ConvertFrom<uint8_t>(src, count, to_float, dst);
    case ElementType::kInt16:
      return ConvertFrom<int16_t>(src, count, to_float, dst);
    case ElementType::kUInt16:
      return ConvertFrom<uint16_t>(src, count, to_float, dst);
    case ElementType::kInt32:
      return ConvertFrom<int32_t>(src, count, to_float, dst);
    case ElementType::kUInt32:
      return ConvertFrom<uint32_t>(src, count, to_float, dst);
    case ElementType::kInt64:
      if (!to_float) {
        std::memcpy(dst, src, count * sizeof(int64_t));
        return;
      }
      return ConvertFrom<int64_t>(src, count, to_float, dst);
  }
}

}  // namespace chorus
