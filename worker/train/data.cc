#include "worker/train/data.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/env_names.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace chorus {
namespace {

constexpr char kFashionMnistPackage[] = "dataset-fashion-mnist (deploy/setup.sh installs it)";
// Fashion-MNIST's published normalization.
constexpr double kFashionMean = 0.2860;
constexpr double kFashionStd = 0.3530;

// The uncompressed size a gzip file's trailer records (ISIZE, modulo 2^32),
// as a hint for how much to reserve; 0 when it cannot be read. A trailer
// is only a claim: the hint is at most what deflate can expand the file's
// bytes to (1032:1), so a small file cannot make us reserve gigabytes.
size_t GzipSizeHint(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return 0;
  uint8_t trailer[4] = {0, 0, 0, 0};
  long compressed = -1;
  const bool read = std::fseek(f, 0, SEEK_END) == 0 && (compressed = std::ftell(f)) >= 4 &&
                    std::fseek(f, -4, SEEK_END) == 0 && std::fread(trailer, 1, 4, f) == 4;
  std::fclose(f);
  if (!read) return 0;
  const size_t claimed = (uint32_t{trailer[3]} << 24) | (uint32_t{trailer[2]} << 16) |
                         (uint32_t{trailer[1]} << 8) | trailer[0];
  return std::min(claimed, static_cast<size_t>(compressed) * 1032);
}

absl::StatusOr<std::vector<uint8_t>> ReadGz(const std::string& path) {
  const size_t hint = GzipSizeHint(path);
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  gzbuffer(f, 1 << 18);  // zlib's default 8 KB input buffer costs reads
  // Decompressed straight into the result, which grows by doubling: no
  // staging copy (a rank's start-up, which an elastic generation waits for,
  // read Fashion-MNIST's 47 MB in 1 s that way, 0.4 s this way).
  constexpr size_t kChunk = 1 << 20;
  std::vector<uint8_t> bytes(hint + kChunk);  // never grows when the hint is right
  size_t size = 0;
  while (true) {
    if (bytes.size() - size < kChunk) bytes.resize(std::max(2 * bytes.size(), size + kChunk));
    int n = gzread(f, bytes.data() + size, static_cast<unsigned>(kChunk));
    if (n < 0) {
      int err = 0;
      std::string message = gzerror(f, &err);
      gzclose(f);
      return absl::InvalidArgumentError(absl::StrCat(path, " is corrupt: ", message));
    }
    if (n == 0) break;
    size += static_cast<size_t>(n);
  }
  gzclose(f);
  bytes.resize(size);
  return bytes;
}

// (pixel / 255 - mean) / std for every uint8 pixel of `images`, as floats.
// The 256 possible values are computed with exactly those tensor
// operations, so each is bit for bit what they give over the whole tensor;
// then one pass looks every pixel up. The tensor operations over
// Fashion-MNIST's 47 M pixels took 3.1 s of a rank's start (four passes over
// fresh memory), which the other ranks of an elastic job wait for whenever
// a newcomer joins; the lookup takes a tenth of a second.
at::Tensor NormalizedPixels(const at::Tensor& images) {
  const at::Tensor table =
      ((at::arange(256, at::kFloat) / 255.0 - kFashionMean) / kFashionStd).contiguous();
  const float* value = table.data_ptr<float>();
  const at::Tensor pixels = images.contiguous();
  at::Tensor out = at::empty(pixels.sizes(), at::kFloat);
  const uint8_t* in = pixels.data_ptr<uint8_t>();
  float* to = out.data_ptr<float>();
  const int64_t n = pixels.numel();
  for (int64_t i = 0; i < n; ++i) to[i] = value[in[i]];
  return out;
}

// Note [Decoded dataset cache]
// A rank's start decodes Fashion-MNIST: 26 MB of gzip inflated to 47 MB of
// pixels and turned into 188 MB of normalized floats — about a second of
// CPU on a quiet machine, more while other ranks train on the same cores —
// which an elastic job's survivors wait for whenever a newcomer joins, and
// which every rank of every job on the machine did again with memory of its
// own. The first rank to decode a split writes the result to a cache file
// (DecodedCacheDir); later ranks map that file (MAP_PRIVATE: a write would
// copy the page, never change the file), so loading takes milliseconds and
// the ranks on a machine share the same page-cache pages. The file's name
// holds a hash of the source files' paths, sizes and modification times
// and of the normalization and format, so a changed source is decoded
// again; the header and size are checked before use, and a file that does
// not match is ignored (and written anew). A writer writes a file of its
// own and renames it into place, so a reader sees a whole file or none.

constexpr char kCacheMagic[8] = {'C', 'H', 'O', 'R', 'U', 'S', 'D', '1'};
constexpr uint32_t kCacheVersion = 1;

struct CacheHeader {
  char magic[8];
  uint32_t version;
  uint32_t reserved;
  int64_t n, rows, cols, num_classes;
  int64_t padding[2];  // 64 bytes: the floats after it stay aligned
};
static_assert(sizeof(CacheHeader) == 64, "the cache header is 64 bytes");

// The cache file for decoding `sources` (empty: no cache, or a source that
// cannot be read, which the decoder then reports).
std::string CacheFile(const std::string& name, const std::vector<std::string>& sources) {
  const std::string dir = DecodedCacheDir();
  if (dir.empty()) return "";
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  for (const std::string& path : sources) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return "";
    mix(path.data(), path.size() + 1);
    mix(&st.st_size, sizeof(st.st_size));
    mix(&st.st_mtim.tv_sec, sizeof(st.st_mtim.tv_sec));
    mix(&st.st_mtim.tv_nsec, sizeof(st.st_mtim.tv_nsec));
  }
  const double normalization[2] = {kFashionMean, kFashionStd};
  mix(normalization, sizeof(normalization));
  mix(&kCacheVersion, sizeof(kCacheVersion));
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return absl::StrCat(dir, "/", name, "-", hex, ".bin");
}

// `file`'s images [N, 1, rows, cols] float and labels [N] int64, mapped;
// nullopt when it is missing or does not hold what its header says.
std::optional<Dataset> MapDecoded(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st;
  CacheHeader h;
  const bool headed = ::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(sizeof(h)) &&
                      ::pread(fd, &h, sizeof(h), 0) == static_cast<ssize_t>(sizeof(h)) &&
                      std::memcmp(h.magic, kCacheMagic, sizeof(kCacheMagic)) == 0 &&
                      h.version == kCacheVersion && h.n >= 0 && h.rows > 0 && h.cols > 0 &&
                      h.n <= (int64_t{1} << 32) && h.rows <= 4096 && h.cols <= 4096;
  const int64_t pixels = headed ? h.n * h.rows * h.cols : 0;
  const int64_t size = static_cast<int64_t>(sizeof(h)) + pixels * 4 + h.n * 8;
  if (!headed || st.st_size != size) {
    ::close(fd);
    LOG(WARNING) << "ignoring the decoded-data cache file " << file
                 << ": it is not a whole cache file of this version";
    return std::nullopt;
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return std::nullopt;
  // Both tensors keep the mapping alive; the last one unmaps it.
  auto mapping = std::shared_ptr<void>(base, [size](void* p) { ::munmap(p, size); });
  char* bytes = static_cast<char*>(base);
  Dataset d;
  d.x = at::from_blob(
      bytes + sizeof(h), {h.n, 1, h.rows, h.cols}, [mapping](void*) {}, at::kFloat);
  d.y = at::from_blob(
      bytes + sizeof(h) + pixels * 4, {h.n}, [mapping](void*) {}, at::kLong);
  d.num_classes = static_cast<int>(h.num_classes);
  d.cache_file = file;
  return d;
}

// Writes `d` to `file` (best effort: a cache that cannot be written only
// costs the next rank the decoding).
void WriteDecoded(const std::string& file, const Dataset& d) {
  const std::string dir = file.substr(0, file.rfind('/'));
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    ::mkdir(dir.substr(0, slash).c_str(), 0755);  // EEXIST is fine
    if (slash == std::string::npos) break;
  }
  CacheHeader h = {};
  std::memcpy(h.magic, kCacheMagic, sizeof(kCacheMagic));
  h.version = kCacheVersion;
  h.n = d.x.size(0);
  h.rows = d.x.size(2);
  h.cols = d.x.size(3);
  h.num_classes = d.num_classes;
  const std::string partial = absl::StrCat(file, ".partial-", ::getpid());
  std::FILE* out = std::fopen(partial.c_str(), "wbx");
  if (out == nullptr) {
    LOG(WARNING) << "cannot write the decoded-data cache " << partial << ": "
                 << std::strerror(errno) << " (set CHORUS_DATA_CACHE to a writable directory, "
                 << "or to off)";
    return;
  }
  const at::Tensor x = d.x.contiguous();
  const at::Tensor y = d.y.contiguous();
  const bool written =
      std::fwrite(&h, sizeof(h), 1, out) == 1 &&
      std::fwrite(x.data_ptr(), 4, x.numel(), out) == static_cast<size_t>(x.numel()) &&
      std::fwrite(y.data_ptr(), 8, y.numel(), out) == static_cast<size_t>(y.numel());
  if (std::fclose(out) != 0 || !written || std::rename(partial.c_str(), file.c_str()) != 0) {
    LOG(WARNING) << "cannot write the decoded-data cache " << file << ": " << std::strerror(errno);
    std::remove(partial.c_str());
  }
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Gaussian inputs with labels from a fixed random linear teacher, so the
// task is learnable and identical on every rank for a given seed.
Dataset Synthetic(const v1::JobSpec& spec, Split split) {
  const v1::SyntheticData& s = spec.data().synthetic();
  const int64_t n =
      split == Split::kTrain ? s.num_samples() : std::max<int64_t>(1, s.num_samples() / 5);
  std::vector<int64_t> shape = {n};
  int64_t features = 1;
  for (int64_t d : s.input_shape()) {
    shape.push_back(d);
    features *= d;
  }
  at::Generator teacher_gen = at::detail::createCPUGenerator(s.seed());
  at::Generator data_gen =
      at::detail::createCPUGenerator(s.seed() * 1000003 + (split == Split::kTrain ? 1 : 2));
  Dataset d;
  d.x = at::randn(shape, data_gen, at::kFloat);
  if (s.kind() == v1::SyntheticData::REGRESSION) {
    at::Tensor w = at::randn({features, 1}, teacher_gen, at::kFloat);
    d.y = d.x.reshape({n, features}).matmul(w).reshape({n});
  } else {
    at::Tensor w = at::randn({features, s.num_classes()}, teacher_gen, at::kFloat);
    d.y = d.x.reshape({n, features}).matmul(w).argmax(1);
    d.num_classes = s.num_classes();
  }
  return d;
}

// Token streams from a fixed random Markov chain: each token has four
// likely successors (probabilities 0.7, 0.1, 0.1, 0.1), so a language model
// can learn to predict the next token with accuracy near 0.7. x is a sequence
// of input_shape[0] tokens, y the same sequence shifted by one.
Dataset SyntheticTokens(const v1::JobSpec& spec, Split split) {
  const v1::SyntheticData& s = spec.data().synthetic();
  const int64_t n =
      split == Split::kTrain ? s.num_samples() : std::max<int64_t>(1, s.num_samples() / 5);
  const int64_t t = s.input_shape(0);
  const int64_t vocab = spec.model().has_transformer_lm()
                            ? spec.model().transformer_lm().vocab_size()
                            : s.num_classes();
  at::Generator teacher_gen = at::detail::createCPUGenerator(s.seed());
  at::Generator data_gen =
      at::detail::createCPUGenerator(s.seed() * 1000003 + (split == Split::kTrain ? 1 : 2));
  at::Tensor successors = at::randint(vocab, {vocab, 4}, teacher_gen, at::kLong);
  at::Tensor choice_probs = at::tensor({0.7, 0.1, 0.1, 0.1}, at::kDouble).expand({n, 4});
  at::Tensor seq = at::empty({n, t + 1}, at::kLong);
  seq.select(1, 0).copy_(at::randint(vocab, {n}, data_gen, at::kLong));
  for (int64_t i = 1; i <= t; ++i) {
    at::Tensor which = at::multinomial(choice_probs, 1, /*replacement=*/true, data_gen).squeeze(1);
    at::Tensor prev = seq.select(1, i - 1);
    seq.select(1, i).copy_(successors.index({prev, which}));
  }
  Dataset d;
  d.x = seq.narrow(1, 0, t).contiguous();
  d.y = seq.narrow(1, 1, t).contiguous();
  d.num_classes = static_cast<int>(vocab);
  return d;
}

absl::StatusOr<std::vector<char>> ReadFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::vector<char> bytes;
  std::vector<char> chunk(1 << 20);
  size_t n;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), f)) > 0)
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::DataLossError(absl::StrCat("error reading ", path));
  return bytes;
}

// A file written by torch.save({'x': ..., 'y': ...}) (or torch::pickle_save
// of a dict): x float or int64 [N, ...], y int64 classes or float targets,
// same N.
absl::StatusOr<Dataset> LoadTensorFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<char> bytes, ReadFile(path));
  const std::string help =
      "; data.tensor_file expects torch.save({'x': inputs, 'y': targets}, path) with the same "
      "first dimension";
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a torch.save file (", e.what_without_backtrace(), ")", help));
  }
  if (!value.isGenericDict()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " holds a ", value.tagKind(), ", not a dict", help));
  }
  c10::Dict<c10::IValue, c10::IValue> dict = value.toGenericDict();
  at::Tensor x, y;
  std::vector<std::string> keys;
  for (const auto& item : dict) {
    if (!item.key().isString()) continue;
    const std::string key = item.key().toStringRef();
    keys.push_back(key);
    if ((key == "x" || key == "y") && !item.value().isTensor()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": '", key, "' is a ", item.value().tagKind(), ", not a tensor", help));
    }
    if (key == "x") x = item.value().toTensor();
    if (key == "y") y = item.value().toTensor();
  }
  if (!x.defined() || !y.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " has keys [", absl::StrJoin(keys, ", "),
                                                   "] but needs both 'x' and 'y'", help));
  }
  if (x.dim() < 1 || y.dim() < 1 || x.size(0) != y.size(0) || x.size(0) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": x has shape ", c10::str(x.sizes()),
                                                   " and y has shape ", c10::str(y.sizes()), help));
  }
  Dataset d;
  d.x = at::isFloatingType(x.scalar_type()) ? x.to(at::kFloat).contiguous()
                                            : x.to(at::kLong).contiguous();
  if (at::isFloatingType(y.scalar_type())) {
    d.y = y.to(at::kFloat).contiguous();
  } else {
    d.y = y.to(at::kLong).contiguous();
    if (d.y.min().item<int64_t>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": y holds negative class ids", help));
    }
    const int64_t top = d.y.max().item<int64_t>();
    if (top >= std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": y holds class id ", top,
                                                     "; class ids must be below ",
                                                     std::numeric_limits<int>::max(), help));
    }
    d.num_classes = static_cast<int>(top + 1);
  }
  return d;
}

}  // namespace

std::string DecodedCacheDir() {
  if (const char* set = std::getenv(kEnvDataCache); set != nullptr) {
    const std::string dir = set;
    return dir == "off" ? "" : dir;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/') {
    return absl::StrCat(xdg, "/chorus/datasets");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') {
    return absl::StrCat(home, "/.cache/chorus/datasets");
  }
  return "";
}

absl::StatusOr<at::Tensor> ReadIdx(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadGz(path));
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a uint8 IDX file (bad magic number)"));
  }
  const int dims = bytes[3];
  if (dims < 1 || dims > 4 || bytes.size() < 4 + 4 * static_cast<size_t>(dims)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " has a malformed IDX header"));
  }
  const size_t offset = 4 + 4 * dims;
  std::vector<int64_t> shape;
  // The values the header promises; more than the file holds is as wrong
  // as any other mismatch (and is not multiplied further: the product of
  // four 32-bit sizes can wrap around 64 bits).
  size_t count = 1;
  bool too_many = false;
  for (int i = 0; i < dims; ++i) {
    shape.push_back(BigEndian32(bytes.data() + 4 + 4 * i));
    if (!too_many) {
      count *= static_cast<size_t>(shape.back());
      too_many = count > bytes.size() - offset;
    }
  }
  if (too_many) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is truncated: the header says ", absl::StrJoin(shape, " x "),
                     " values, the file has ", bytes.size() - offset));
  }
  if (bytes.size() != offset + count) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is truncated or too long: the header says ", count,
                     " values, the file has ", bytes.size() - offset));
  }
  at::Tensor t = at::empty(shape, at::kByte);
  // An empty tensor has no data pointer, and memcpy must not get null.
  if (count > 0) std::memcpy(t.data_ptr(), bytes.data() + offset, count);
  return t;
}

absl::StatusOr<Dataset> LoadDataset(const v1::JobSpec& spec, Split split) {
  const v1::DataSpec& data = spec.data();
  if (data.has_synthetic()) {
    if (data.synthetic().kind() == v1::SyntheticData::TOKENS) return SyntheticTokens(spec, split);
    return Synthetic(spec, split);
  }
  if (data.has_fashion_mnist()) {
    const std::string dir = data.fashion_mnist().dir();
    const std::string prefix = split == Split::kTrain ? "train" : "t10k";
    const std::string images_path = absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte.gz");
    const std::string labels_path = absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte.gz");
    const int64_t limit = data.fashion_mnist().train_limit();
    auto limited = [&](Dataset d) {
      if (split == Split::kTrain && limit > 0 && limit < d.size()) {
        d.x = d.x.narrow(0, 0, limit).contiguous();
        d.y = d.y.narrow(0, 0, limit).contiguous();
      }
      return d;
    };
    const std::string cache =
        CacheFile(absl::StrCat("fashion-mnist-", prefix), {images_path, labels_path});
    if (!cache.empty()) {
      if (std::optional<Dataset> cached = MapDecoded(cache)) return limited(*std::move(cached));
    }
    absl::StatusOr<at::Tensor> images = ReadIdx(images_path);
    if (!images.ok()) {
      return absl::Status(
          images.status().code(),
          absl::StrCat("Fashion-MNIST: ", images.status().message(),
                       "; the files come from the Debian package ", kFashionMnistPackage));
    }
    absl::StatusOr<at::Tensor> labels = ReadIdx(labels_path);
    if (!labels.ok()) {
      return absl::Status(
          labels.status().code(),
          absl::StrCat("Fashion-MNIST: ", labels.status().message(),
                       "; the files come from the Debian package ", kFashionMnistPackage));
    }
    if (images->dim() != 3 || labels->dim() != 1 || images->size(0) != labels->size(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Fashion-MNIST: ", images_path, " and ", labels_path, " do not match"));
    }
    if (labels->numel() > 0 && labels->max().item<int>() >= 10) {
      return absl::InvalidArgumentError(absl::StrCat("Fashion-MNIST: ", labels_path,
                                                     " holds label ", labels->max().item<int>(),
                                                     "; the classes are 0..9"));
    }
    Dataset d;
    d.x = NormalizedPixels(*images).unsqueeze(1);
    d.y = labels->to(at::kLong);
    d.num_classes = 10;
    if (!cache.empty()) WriteDecoded(cache, d);
    return limited(std::move(d));
  }
  if (data.has_tensor_file()) {
    const std::string& path =
        split == Split::kTrain ? data.tensor_file().path() : data.tensor_file().eval_path();
    if (path.empty()) return Dataset{};  // no held-out split: evaluation is skipped
    absl::StatusOr<Dataset> d;
    try {
      d = LoadTensorFile(path);
    } catch (const c10::Error& e) {
      // Tensors of a kind the conversions above do not take (quantized,
      // sparse, ...): the file's problem, not the rank's.
      d = absl::InvalidArgumentError(
          absl::StrCat(path, ": its tensors cannot be used (", e.what_without_backtrace(), ")"));
    }
    if (!d.ok()) {
      return absl::Status(d.status().code(),
                          absl::StrCat(split == Split::kTrain ? "data.tensor_file.path: "
                                                              : "data.tensor_file.eval_path: ",
                                       d.status().message()));
    }
    return d;
  }
  return absl::InvalidArgumentError("job spec has no data source");
}

}  // namespace chorus
