#include "worker/train/shard_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

constexpr int64_t kBlock = 512;

std::string NpyDescr(ElementType t) {
  switch (t) {
    case ElementType::kFloat32:
      return "<f4";
    case ElementType::kFloat64:
      return "<f8";
    case ElementType::kInt8:
      return "|i1";
    case ElementType::kUInt8:
      return "|u1";
    case ElementType::kInt16:
      return "<i2";
    case ElementType::kUInt16:
      return "<u2";
    case ElementType::kInt32:
      return "<i4";
    case ElementType::kUInt32:
      return "<u4";
    case ElementType::kInt64:
      return "<i8";
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<TarWriter>> TarWriter::Create(const std::string& path) {
  const std::string partial = absl::StrCat(path, ".partial-", ::getpid());
  std::FILE* f = std::fopen(partial.c_str(), "wb");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create ", partial, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<TarWriter>(new TarWriter(f, path, partial));
}

TarWriter::~TarWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(partial_.c_str());
  }
}

absl::Status TarWriter::Write(absl::string_view bytes) {
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
    return absl::DataLossError(absl::StrCat("cannot write ", partial_, ": ", std::strerror(errno)));
  }
  bytes_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::Status TarWriter::Header(const std::string& name, int64_t size, char type) {
  char h[kBlock] = {};
  std::memcpy(h, name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(h + 100, 8, "%07o", 0644);
  std::snprintf(h + 108, 8, "%07o", 0);
  std::snprintf(h + 116, 8, "%07o", 0);
  std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  std::snprintf(h + 136, 12, "%011o", 0);
  h[156] = type;
  std::memcpy(h + 257, "ustar", 6);  // "ustar\0" then version "00"
  std::memcpy(h + 263, "00", 2);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < kBlock; ++i) sum += static_cast<unsigned char>(h[i]);
  std::snprintf(h + 148, 8, "%06o", sum);  // six digits, NUL, then the space kept
  h[155] = ' ';
  return Write(absl::string_view(h, kBlock));
}

absl::Status TarWriter::Add(const std::string& name, absl::string_view bytes) {
  static const char kZeros[kBlock] = {};
  auto pad = [&](int64_t size) {
    return Write(absl::string_view(kZeros, (kBlock - size % kBlock) % kBlock));
  };
  if (name.size() > 100) {
    RETURN_IF_ERROR(Header("././@LongLink", static_cast<int64_t>(name.size()) + 1, 'L'));
    RETURN_IF_ERROR(Write(absl::string_view(name.c_str(), name.size() + 1)));
    RETURN_IF_ERROR(pad(static_cast<int64_t>(name.size()) + 1));
  }
  RETURN_IF_ERROR(Header(name, static_cast<int64_t>(bytes.size()), '0'));
  RETURN_IF_ERROR(Write(bytes));
  return pad(static_cast<int64_t>(bytes.size()));
}

absl::Status TarWriter::Close() {
  static const char kZeros[2 * kBlock] = {};
  RETURN_IF_ERROR(Write(absl::string_view(kZeros, sizeof(kZeros))));
  std::FILE* f = file_;
  file_ = nullptr;
  if (std::fclose(f) != 0 || std::rename(partial_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::remove(partial_.c_str());
    return absl::DataLossError(absl::StrCat("cannot write ", path_, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

std::string NpyBytes(ElementType type, const std::vector<int64_t>& shape, const void* values) {
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string header = absl::StrCat("{'descr': '", NpyDescr(type),
                                    "', 'fortran_order': False, 'shape': (", dims, "), }");
  // Magic (6) + version (2) + length (2) + header + '\n', padded to 64 bytes.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out.append(static_cast<const char*>(values), count * ElementBytes(type));
  return out;
}

}  // namespace chorus
