#include "worker/train/shard_index.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/output_limits.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/train/torch_save_file.h"

namespace chorus {

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

namespace {

constexpr int64_t kBlock = 512;

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

// Where a scan found something wrong: the file, the byte offset and the
// sample of the shard (0 first) that the member there belongs to.
std::string Where(const std::string& path, int64_t offset, int64_t sample) {
  return absl::StrCat(path, " at byte offset ", offset, " (sample ", sample, " of this shard)");
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
// `offset`; nullopt at the end of the archive. Errors name file, offset and
// `sample`, the shard's sample the member would belong to.
absl::StatusOr<std::optional<TarMember>> ReadMember(int fd, const std::string& path, int64_t size,
                                                    int64_t offset, int64_t sample) {
  std::optional<std::string> long_name;
  char h[kBlock];
  for (; offset + kBlock <= size;) {
    if (!ReadAt(fd, h, kBlock, offset)) {
      return absl::DataLossError(absl::StrCat(
          "data.shards: cannot read ", Where(path, offset, sample), ": ", std::strerror(errno)));
    }
    if (std::all_of(h, h + kBlock, [](char c) { return c == '\0'; })) return std::nullopt;
    if (!ChecksumMatches(h)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.shards: ", Where(path, offset, sample),
          ": not a tar header (bad checksum); the shard is damaged or not a tar file"));
    }
    const std::optional<int64_t> member_size = TarNumber(h + 124, 12);
    const int64_t data = offset + kBlock;
    if (!member_size || *member_size > size - data) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.shards: ", Where(path, offset, sample), ": member \"", CString(h, 100),
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
      return absl::DataLossError(
          absl::StrCat("data.shards: cannot read ", Where(path, data, sample)));
    }
    if (type == 'L') long_name = CString(text.data(), static_cast<int>(text.size()));
    if (type == 'x') {
      if (std::optional<std::string> p = PaxPath(text)) long_name = *p;
    }
    offset = next;
  }
  if (offset < size) {
    return absl::InvalidArgumentError(absl::StrCat("data.shards: ", Where(path, offset, sample),
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
      return absl::InvalidArgumentError(absl::StrCat(
          "data.shards: ", Where(path, pending.offset, static_cast<int64_t>(out.size())),
          ": sample \"", pending.key, "\" has no ", pending.x ? target_member : input_member,
          " member (a sample's members must be consecutive)"));
    }
    out.push_back(TarSample{pending.x->offset, pending.y->offset,
                            static_cast<int32_t>(pending.x->size),
                            static_cast<int32_t>(pending.y->size)});
    return absl::OkStatus();
  };
  for (int64_t offset = 0;;) {
    // A member after a whole sample's two begins the next sample.
    const int64_t sample = static_cast<int64_t>(out.size()) + (pending.x && pending.y ? 1 : 0);
    ASSIGN_OR_RETURN(const std::optional<TarMember> m, ReadMember(fd, path, size, offset, sample));
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
      return absl::InvalidArgumentError(
          absl::StrCat("data.shards: ", Where(path, m->header, static_cast<int64_t>(out.size())),
                       ": sample \"", key, "\" has a second ", suffix, " member"));
    }
    if (m->data.size > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.shards: ", Where(path, m->header, static_cast<int64_t>(out.size())), ": member \"",
          m->name, "\" has ", m->data.size, " bytes; members of 2 GiB or more are not read"));
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
      for (size_t m = 0; m < g.gl_pathc; ++m) {
        // Index files beside the shards (Note [Index files]) are no shards.
        if (!absl::EndsWith(g.gl_pathv[m], ".idx")) out.push_back(g.gl_pathv[m]);
      }
    }
    ::globfree(&g);
    if (rc != 0) {
      return absl::NotFoundError(absl::StrCat("data.shards.paths[", i, "]: \"", entry,
                                              "\" matches no file on this machine"));
    }
  }
  return out;
}

namespace {

// Note [Index files]
// Indexing a TAR shard by its headers reads a 512-byte block per member
// spread over the whole file: on a cold disk, kernel read-ahead pulls in
// most of the file to do it, before a sample is trained. `chorus dataset
// pack` therefore writes SHARD.idx beside each shard, and ShardIndex::Build
// reads that instead (a few hundred KB against GB). Layout (little-endian):
//   "CHORUSI1"  8 bytes
//   int64       the shard's size in bytes
//   int64       the shard's mtime, whole seconds
//   int64       the number of samples N
//   uint32 A, uint32 B, then A + B bytes: input_member, target_member
//   N x 24 bytes: TarSample (x_offset, y_offset int64; x_size, y_size int32)
// An index whose size or mtime differ from the shard's, or that was written
// for other members, is stale: the shard is scanned instead (a warning
// names the file; a copy that keeps mtimes, `cp -p` or `rsync -t`, keeps
// the index valid). An index file that does not parse, or whose samples lie
// outside the shard, is an error naming it. Either way a sample's .npy
// header is still checked when it is read, so a shard rewritten within the
// same second to the same size is an error naming the file and offset, not
// wrong data.
constexpr char kIndexMagic[8] = {'C', 'H', 'O', 'R', 'U', 'S', 'I', '1'};
constexpr int64_t kIndexFixed = 40;  // magic, size, mtime, count, A, B
static_assert(sizeof(TarSample) == 24, "TarSample is stored as it is laid out");

std::string IndexHeader(int64_t shard_size, int64_t mtime, int64_t count,
                        const std::string& input_member, const std::string& target_member) {
  std::string out(kIndexFixed, '\0');
  const int64_t fields[3] = {shard_size, mtime, count};
  const uint32_t lengths[2] = {static_cast<uint32_t>(input_member.size()),
                               static_cast<uint32_t>(target_member.size())};
  std::memcpy(out.data(), kIndexMagic, 8);
  std::memcpy(out.data() + 8, fields, sizeof(fields));
  std::memcpy(out.data() + 32, lengths, sizeof(lengths));
  return absl::StrCat(out, input_member, target_member);
}

// Loads `path`'s index file into `out`: true if it was read, false if there
// is none or it is stale (Note [Index files]); an error if it is damaged.
absl::StatusOr<bool> LoadIndexFile(const std::string& path, const struct stat& shard,
                                   const v1::ShardedData& spec, std::vector<TarSample>& out) {
  const std::string idx = IndexFilePath(path);
  const int fd = ::open(idx.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  std::string bytes;
  bool read = ::fstat(fd, &st) == 0;
  if (read) {
    bytes.resize(static_cast<size_t>(st.st_size));
    read = ReadAt(fd, bytes.data(), st.st_size, 0);
  }
  ::close(fd);
  auto damaged = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.shards: the index file ", idx, " is damaged (", why,
        "): delete it (the shard is then scanned) or write it again with `chorus dataset pack`"));
  };
  if (!read) return damaged(absl::StrCat("cannot read it: ", std::strerror(errno)));
  int64_t fields[3];
  uint32_t lengths[2];
  if (bytes.size() < kIndexFixed || std::memcmp(bytes.data(), kIndexMagic, 8) != 0) {
    return damaged("no CHORUSI1 header");
  }
  std::memcpy(fields, bytes.data() + 8, sizeof(fields));
  std::memcpy(lengths, bytes.data() + 32, sizeof(lengths));
  const int64_t records = kIndexFixed + int64_t{lengths[0]} + lengths[1];
  const int64_t body = static_cast<int64_t>(bytes.size()) - records;
  constexpr int64_t kRecord = sizeof(TarSample);
  if (fields[2] < 0 || body < 0 || fields[2] > body / kRecord || body != fields[2] * kRecord) {
    return damaged(absl::StrCat(bytes.size(), " bytes do not hold its ", fields[2], " samples"));
  }
  const std::string input(bytes.data() + kIndexFixed, lengths[0]);
  const std::string target(bytes.data() + kIndexFixed + lengths[0], lengths[1]);
  if (fields[0] != shard.st_size || fields[1] != shard.st_mtime || input != spec.input_member() ||
      target != spec.target_member()) {
    LOG(WARNING) << "data.shards: ignoring the stale index file " << idx << " (written for "
                 << fields[0] << " bytes, mtime " << fields[1] << ", members " << input << "/"
                 << target << "; the shard has " << shard.st_size << " bytes, mtime "
                 << shard.st_mtime << ", the spec asks for " << spec.input_member() << "/"
                 << spec.target_member() << "): scanning " << path
                 << "; `chorus dataset pack` writes a fresh one";
    return false;
  }
  out.resize(static_cast<size_t>(fields[2]));
  std::memcpy(out.data(), bytes.data() + records, out.size() * sizeof(TarSample));
  for (size_t i = 0; i < out.size(); ++i) {
    const TarSample& t = out[i];
    if (t.x_offset < kBlock || t.y_offset < kBlock || t.x_size < 0 || t.y_size < 0 ||
        t.x_offset + t.x_size > shard.st_size || t.y_offset + t.y_size > shard.st_size) {
      out.clear();
      return damaged(absl::StrCat("sample ", i, "'s record at byte offset ",
                                  records + static_cast<int64_t>(i) * kRecord,
                                  " lies outside the shard's ", shard.st_size, " bytes"));
    }
  }
  return true;
}

}  // namespace

std::string TarMemberNameAt(const std::string& path, int64_t data_offset) {
  char h[kBlock];
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const bool read = fd >= 0 && data_offset >= kBlock && ReadAt(fd, h, kBlock, data_offset - kBlock);
  if (fd >= 0) ::close(fd);
  if (!read || !ChecksumMatches(h)) return "?";
  return std::memcmp(h + 257, "ustar", 5) == 0 && h[345] != '\0'
             ? absl::StrCat(CString(h + 345, 155), "/", CString(h, 100))
             : CString(h, 100);
}

std::string IndexFilePath(const std::string& shard_path) { return shard_path + ".idx"; }

absl::Status WriteIndexFile(const std::string& shard_path, const std::string& input_member,
                            const std::string& target_member) {
  const int fd = ::open(shard_path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return absl::NotFoundError(absl::StrCat("cannot open ", shard_path, ": ", std::strerror(err)));
  }
  std::vector<TarSample> samples;
  const absl::Status scanned =
      ScanTar(fd, shard_path, st.st_size, input_member, target_member, samples);
  ::close(fd);
  RETURN_IF_ERROR(scanned);
  const std::string idx = IndexFilePath(shard_path);
  const std::string partial = absl::StrCat(idx, ".partial-", ::getpid());
  const std::string header = IndexHeader(
      st.st_size, st.st_mtime, static_cast<int64_t>(samples.size()), input_member, target_member);
  const size_t body = samples.size() * sizeof(TarSample);
  std::FILE* f = std::fopen(partial.c_str(), "wb");
  bool ok = f != nullptr && std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(samples.data(), 1, body, f) == body;
  const int err = errno;
  ok = f != nullptr && std::fclose(f) == 0 && ok && std::rename(partial.c_str(), idx.c_str()) == 0;
  if (!ok) {
    std::remove(partial.c_str());
    return absl::DataLossError(
        absl::StrCat("cannot write the index file ", idx, ": ", std::strerror(err ? err : errno)));
  }
  return absl::OkStatus();
}

namespace {

// The samples of the TAR shard `path` (open as `fd`): from its index file,
// or by scanning it.
absl::Status IndexTarShard(int fd, const std::string& path, const struct stat& st,
                           const v1::ShardedData& spec, std::vector<TarSample>& samples) {
  ASSIGN_OR_RETURN(const bool loaded, LoadIndexFile(path, st, spec, samples));
  if (loaded) return absl::OkStatus();
  return ScanTar(fd, path, st.st_size, spec.input_member(), spec.target_member(), samples);
}

// Note [Tensor file shards]
// A TENSOR_FILES shard is a torch.save({'x': inputs, 'y': targets}) file.
// Loading it whole would make a rank's memory the size of a shard and read
// every rank's samples on every rank; instead the index reads only the
// file's zip directory and data.pkl (torch_save_file.h). torch.save stores
// each storage uncompressed as one zip member, so row i of a C-contiguous
// tensor of sizes [N, d1, ...] is the row_bytes = d1*...*elem_size bytes at
// storage_offset_in_file + (tensor_storage_offset + i*row_elems)*elem_size.
// Each sample is then two byte ranges, as a TAR sample's members are, and
// the reader's machinery (random access, read-ahead, the exactly-once
// sampler, the checkpointed position) is the same; the index holds no
// per-sample data. What does not fit that (a non-contiguous or compressed
// storage, x or y missing, first dimensions that differ, another dtype or
// row shape than the first shard's) is INVALID_ARGUMENT naming the file.
absl::Status TensorFileRows(const std::string& path, const SavedTensor& t, TensorRows& rows) {
  const std::string fix =
      "; save contiguous tensors of float32/float64/int8/uint8/int16/int32/int64 "
      "(torch.save({'x': x.contiguous(), 'y': y.contiguous()}, path)) or convert the file with "
      "`chorus dataset pack`";
  auto fail = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.shards: ", path, ": '", t.key, "' ", why, fix));
  };
  if (!t.type) return fail(absl::StrCat("has storage ", t.storage_class, ", which is not read"));
  if (t.sizes.empty() || t.sizes[0] < 0) return fail("is a scalar, not [samples, ...]");
  if (t.compressed) return fail("is stored compressed in the zip archive");
  if (!t.Contiguous()) return fail("is not contiguous (a view, transpose or slice with a step)");
  rows.type = *t.type;
  rows.shape.assign(t.sizes.begin() + 1, t.sizes.end());
  // Contiguous() has multiplied all sizes within int64 (the reader refuses
  // negative ones), so neither product below overflows; the file's
  // storage_offset is compared by division, never multiplied unchecked.
  int64_t row_elems = 1;
  for (int64_t d : rows.shape) row_elems *= d;
  if (row_elems <= 0) return fail("has no values per sample");
  const int64_t elem = ElementBytes(rows.type);
  const int64_t capacity = t.storage.size / elem;  // elements
  if (row_elems > std::numeric_limits<int64_t>::max() / elem) {
    return fail("has rows of more than 2^63 bytes (the file is damaged)");
  }
  rows.row_bytes = row_elems * elem;
  if (t.storage_offset < 0 || t.storage_offset > capacity ||
      t.sizes[0] * row_elems > capacity - t.storage_offset) {
    return fail(absl::StrCat("needs more values than its storage of ", t.storage.size,
                             " bytes holds (the file is damaged)"));
  }
  rows.offset = t.storage.offset + t.storage_offset * elem;
  return absl::OkStatus();
}

// Indexes the TENSOR_FILES shard `path` (Note [Tensor file shards]).
absl::Status IndexTensorFile(int fd, const std::string& path, int64_t size,
                             ShardIndex::Shard& shard) {
  ASSIGN_OR_RETURN(const std::vector<SavedTensor> saved, ReadTorchSaveDict(fd, path, size));
  const SavedTensor* x = nullptr;
  const SavedTensor* y = nullptr;
  std::vector<std::string> keys;
  for (const SavedTensor& t : saved) {
    keys.push_back(t.key);
    if (t.key != "x" && t.key != "y") continue;
    if (!t.is_tensor) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.shards: ", path, ": '", t.key, "' is ", t.what, ", not a tensor"));
    }
    (t.key == "x" ? x : y) = &t;
  }
  if (x == nullptr || y == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.shards: ", path, " has keys [", absl::StrJoin(keys, ", "),
        "] but a tensor_file shard needs both 'x' and 'y' (torch.save({'x': inputs, 'y': "
        "targets}, path))"));
  }
  RETURN_IF_ERROR(TensorFileRows(path, *x, shard.x_rows));
  RETURN_IF_ERROR(TensorFileRows(path, *y, shard.y_rows));
  if (x->sizes[0] != y->sizes[0]) {
    return absl::InvalidArgumentError(absl::StrCat("data.shards: ", path, ": x has ", x->sizes[0],
                                                   " samples (first dimension) and y has ",
                                                   y->sizes[0], "; they must have the same"));
  }
  shard.count = x->sizes[0];
  return absl::OkStatus();
}

std::string RowsString(const TensorRows& r) {
  return absl::StrCat("[N, ", absl::StrJoin(r.shape, ", "), "] of ", ElementBytes(r.type), "-byte ",
                      IsFloating(r.type) ? "floats" : "integers");
}

// Every TENSOR_FILES shard's x and y have the first shard's type and row
// shape, else INVALID_ARGUMENT naming the first that differs.
absl::Status CheckSameRows(const std::vector<ShardIndex::Shard>& shards) {
  for (const ShardIndex::Shard& s : shards) {
    for (const auto& [name, rows, first] : {std::tuple{"x", &s.x_rows, &shards[0].x_rows},
                                            std::tuple{"y", &s.y_rows, &shards[0].y_rows}}) {
      if (rows->type != first->type || rows->shape != first->shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.shards: ", s.path, ": ", name, " is ", RowsString(*rows), ", but ",
            shards[0].path, "'s is ", RowsString(*first),
            "; every shard must have the same row shape and dtype (save them alike, or convert "
            "them with `chorus dataset pack`)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

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
      scanned = IndexTarShard(fd, path, st, spec, shard.samples);
      shard.count = static_cast<int64_t>(shard.samples.size());
    } else if (spec.format() == v1::ShardedData::TENSOR_FILES) {
      scanned = IndexTensorFile(fd, path, st.st_size, shard);
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
  if (spec.format() == v1::ShardedData::TENSOR_FILES && !index.shards_.empty()) {
    RETURN_IF_ERROR(CheckSameRows(index.shards_));
  }
  if (index.size_ == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.shards.paths: the ", paths.size(), " shard file(s) hold no samples",
        spec.format() == v1::ShardedData::TAR ? absl::StrCat(" (members *.", spec.input_member(),
                                                             " with *.", spec.target_member(), ")")
        : spec.format() == v1::ShardedData::TOKENS
            ? absl::StrCat(" of ", spec.sequence_length(), " + 1 tokens")
            : " (their x and y have no rows)"));
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
  if (spec_.format() == v1::ShardedData::TENSOR_FILES) {
    const TensorRows& x = s.x_rows;
    const TensorRows& y = s.y_rows;
    return SampleLocation{shard, ByteRange{x.offset + local * x.row_bytes, x.row_bytes},
                          ByteRange{y.offset + local * y.row_bytes, y.row_bytes}};
  }
  const int64_t length = spec_.sequence_length();
  const ByteRange tokens{local * length * token_bytes(), (length + 1) * token_bytes()};
  return SampleLocation{shard, tokens, tokens};
}

// Note [Shard fingerprints]
// The position a checkpoint holds is (epoch, samples of the epoch trained),
// and the epoch's order is a function of the shards' sample counts
// (Note [Streamed order] in sampler.cc): resumed over shards that were
// added, removed, renamed or rewritten with other samples, the same
// position names other samples, and some of the epoch would be trained
// twice and some never, silently. So checkpoints carry a fingerprint of
// each shard (FNV-1a, 64 bits, of its base name, sample count and TAR
// member places, or TENSOR_FILES row places; stable across processes and
// machines, unlike absl::Hash),
// and a resume over shards whose fingerprints differ fails naming the first
// such shard. Moving the shards to another directory keeps them; a shard
// rewritten with other values in the same places is not seen (values are
// not read to index a shard).
namespace {

class Fnv1a {
 public:
  void Add(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) hash_ = (hash_ ^ p[i]) * 0x100000001b3ull;
  }
  template <typename T>
  void AddValue(T v) {
    Add(&v, sizeof(v));
  }
  int64_t value() const { return static_cast<int64_t>(hash_); }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::vector<int64_t> ShardIndex::Fingerprints() const {
  std::vector<int64_t> out;
  out.reserve(shards_.size());
  for (const Shard& s : shards_) {
    Fnv1a h;
    const std::string name = BaseName(s.path);
    h.Add(name.data(), name.size());
    h.AddValue(s.count);
    for (const TarSample& t : s.samples) {
      h.AddValue(t.x_offset);
      h.AddValue(t.y_offset);
      h.AddValue(t.x_size);
      h.AddValue(t.y_size);
    }
    if (format() == v1::ShardedData::TENSOR_FILES) {
      for (const TensorRows* r : {&s.x_rows, &s.y_rows}) {
        h.AddValue(r->offset);
        h.AddValue(r->row_bytes);
      }
    }
    out.push_back(h.value());
  }
  return out;
}

absl::Status CheckFingerprints(const ShardIndex& index, const std::vector<int64_t>& saved) {
  if (saved.empty()) return absl::OkStatus();
  const std::vector<int64_t> now = index.Fingerprints();
  const std::string fix =
      ": resuming over other shards would train some samples of the epoch twice and others "
      "never; restore the shards the checkpoint was trained on, or start the job afresh "
      "(Note [Shard fingerprints])";
  for (size_t i = 0; i < std::min(now.size(), saved.size()); ++i) {
    if (now[i] != saved[i]) {
      const ShardIndex::Shard& s = index.shards()[i];
      return absl::FailedPreconditionError(absl::StrCat(
          "data.shards: shard ", i, " (", s.path, ", ", s.count,
          " samples) is not the shard the checkpoint was trained on (its name, sample count or "
          "member places differ)",
          fix));
    }
  }
  if (now.size() != saved.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("data.shards.paths gives ", now.size(),
                     " shard files, the checkpoint was trained on ", saved.size(),
                     now.size() > saved.size()
                         ? absl::StrCat(" (", index.shards()[saved.size()].path, " is new)")
                         : absl::StrCat(" (its shard ", now.size(), " and after are missing)"),
                     fix));
  }
  return absl::OkStatus();
}

bool IsFloating(ElementType t) { return t == ElementType::kFloat32 || t == ElementType::kFloat64; }

const char* ElementTypeName(ElementType t) {
  switch (t) {
    case ElementType::kFloat32:
      return "float32";
    case ElementType::kFloat64:
      return "float64";
    case ElementType::kInt8:
      return "int8";
    case ElementType::kUInt8:
      return "uint8";
    case ElementType::kInt16:
      return "int16";
    case ElementType::kUInt16:
      return "uint16";
    case ElementType::kInt32:
      return "int32";
    case ElementType::kUInt32:
      return "uint32";
    case ElementType::kInt64:
      return "int64";
  }
  return "?";
}

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
    // The header quoted on one line (it ends in a newline) and bounded.
    return absl::InvalidArgumentError(absl::StrCat(".npy header \"", EscapeErrorText(header, 256),
                                                   "\" lacks descr, fortran_order or shape"));
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
