#include "worker/train/torch_save_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

constexpr int64_t kMaxDirectoryBytes = int64_t{64} << 20;
constexpr int64_t kMaxPickleBytes = int64_t{16} << 20;
// What data.pkl's values and the entries read from them may take (Note
// [Pickle values]); a dict of a few tensors takes a few KiB.
constexpr int64_t kMaxValueBytes = int64_t{64} << 20;

uint64_t Le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string Help() {
  return "; a tensor_file shard is torch.save({'x': inputs, 'y': targets}, path) with PyTorch's "
         "default (zip) serialization: load it and save it so with PyTorch 1.6 or later";
}

absl::Status NotTorchSave(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("data.shards: ", path, " is not a torch.save file that is read: ", why, Help()));
}

// A zip member: where its data lie and whether it is stored as is.
struct ZipEntry {
  ByteRange data;
  bool compressed = false;
};

// The zip's end-of-central-directory record: where its directory lies.
absl::StatusOr<ByteRange> FindDirectory(int fd, const std::string& path, int64_t size) {
  const int64_t tail = std::min<int64_t>(size, 22 + 65535);
  std::string buf(static_cast<size_t>(tail), '\0');
  if (!ReadAt(fd, buf.data(), tail, size - tail)) {
    return absl::DataLossError(
        absl::StrCat("data.shards: cannot read ", path, ": ", std::strerror(errno)));
  }
  int64_t at = tail - 22;
  while (at >= 0 && Le(buf.data() + at, 4) != 0x06054b50) --at;
  if (at < 0) return NotTorchSave(path, "no zip directory (a legacy or damaged file)");
  const char* e = buf.data() + at;
  ByteRange dir{static_cast<int64_t>(Le(e + 16, 4)), static_cast<int64_t>(Le(e + 12, 4))};
  if (dir.offset == 0xffffffff || dir.size == 0xffffffff) {  // zip64: its locator precedes
    const int64_t locator = size - tail + at - 20;
    char l[20], z[56];
    if (locator < 0 || !ReadAt(fd, l, 20, locator) || Le(l, 4) != 0x07064b50 ||
        !ReadAt(fd, z, 56, static_cast<int64_t>(Le(l + 8, 8))) || Le(z, 4) != 0x06064b50) {
      return NotTorchSave(path, "its zip64 directory record is damaged");
    }
    dir = ByteRange{static_cast<int64_t>(Le(z + 48, 8)), static_cast<int64_t>(Le(z + 40, 8))};
  }
  if (dir.offset < 0 || dir.size < 0 || dir.size > kMaxDirectoryBytes ||
      dir.offset > size - dir.size) {
    return NotTorchSave(path, "its zip directory lies outside the file (truncated?)");
  }
  return dir;
}

// The zip64 extra field's values for the 32-bit fields that are all ones.
void ApplyZip64(const char* extra, int64_t length, uint64_t& uncompressed, uint64_t& compressed,
                uint64_t& local) {
  for (int64_t at = 0; at + 4 <= length;) {
    const uint64_t id = Le(extra + at, 2), n = Le(extra + at + 2, 2);
    if (id == 1) {
      int64_t p = at + 4;
      for (uint64_t* field : {&uncompressed, &compressed, &local}) {
        if (*field == 0xffffffff && p + 8 <= at + 4 + static_cast<int64_t>(n) && p + 8 <= length) {
          *field = Le(extra + p, 8);
          p += 8;
        }
      }
      return;
    }
    at += 4 + static_cast<int64_t>(n);
  }
}

// Every member of the zip `path`, by name, with where its data start (from
// its local header).
absl::StatusOr<std::map<std::string, ZipEntry>> ReadZip(int fd, const std::string& path,
                                                        int64_t size) {
  ASSIGN_OR_RETURN(const ByteRange dir, FindDirectory(fd, path, size));
  std::string d(static_cast<size_t>(dir.size), '\0');
  if (!ReadAt(fd, d.data(), dir.size, dir.offset)) {
    return absl::DataLossError(absl::StrCat("data.shards: cannot read ", path, "'s zip directory"));
  }
  std::map<std::string, ZipEntry> out;
  for (int64_t at = 0; at + 46 <= dir.size;) {
    const char* c = d.data() + at;
    if (Le(c, 4) != 0x02014b50) return NotTorchSave(path, "its zip directory is damaged");
    const int64_t name_len = Le(c + 28, 2), extra_len = Le(c + 30, 2), comment_len = Le(c + 32, 2);
    if (at + 46 + name_len + extra_len > dir.size) {
      return NotTorchSave(path, "its zip directory is damaged");
    }
    uint64_t uncompressed = Le(c + 24, 4), compressed = Le(c + 20, 4), local = Le(c + 42, 4);
    ApplyZip64(c + 46 + name_len, extra_len, uncompressed, compressed, local);
    char h[30];
    if (local + 30 > static_cast<uint64_t>(size) || !ReadAt(fd, h, 30, local) ||
        Le(h, 4) != 0x04034b50) {
      return NotTorchSave(path, absl::StrCat("a zip member's header at byte offset ", local,
                                             " is damaged or past the end (truncated?)"));
    }
    const int64_t data = static_cast<int64_t>(local) + 30 + Le(h + 26, 2) + Le(h + 28, 2);
    ZipEntry e{ByteRange{data, static_cast<int64_t>(compressed)}, Le(c + 10, 2) != 0};
    if (e.data.size < 0 || e.data.size > size - data) {
      return NotTorchSave(path, absl::StrCat("a zip member at byte offset ", data,
                                             " runs past the end of the file (truncated?)"));
    }
    if (!e.compressed && uncompressed != compressed) {
      return NotTorchSave(path, "its zip directory is damaged");
    }
    out[std::string(c + 46, static_cast<size_t>(name_len))] = e;
    at += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

// Note [Pickle subset]
// data.pkl is read by a small pickle machine that knows what torch.save and
// torch::pickle_save write for a dict of tensors (protocol 2, also the
// protocol 4 framing ops): dicts, lists, tuples, strings, ints, bools,
// None, globals, their memo, persistent ids (storages), and REDUCE of
// _rebuild_tensor_v2, OrderedDict and torch::pickle_save's
// restore_type_tag. Any other call (REDUCE/BUILD of
// another global) yields an opaque value, so a dict entry that is not a
// tensor is reported by its key, not as a parse error. Anything else (an op
// not listed) is an error naming the op: the file is not a dict of tensors.
struct PValue;
using PRef = std::shared_ptr<PValue>;
struct PValue {
  enum class Kind {
    kMark,
    kNone,
    kBool,
    kInt,
    kString,
    kGlobal,
    kTuple,
    kDict,
    kStorage,
    kTensor,
    kOther
  };
  Kind kind = Kind::kNone;
  int64_t i = 0;
  std::string s;            // string; global "module name"; storage class; other: what it is
  std::vector<PRef> items;  // tuple or list; dict as key, value, key, value...
  SavedTensor tensor;       // storage (key, numel in `i`) or tensor
};

// Note [Pickle values]
// A damaged pickle can nest values as deep as it is long (each TUPLE1 op
// wraps the value before it) and can put a list inside itself (APPEND of
// its own memo entry). Values freed through each other would recurse once
// per level, past the end of the stack, and a cycle would never be freed.
// So the machine owns every value it makes and, when it is destroyed, empties
// them all before any is freed: no value then frees another.
// A few bytes of pickle can also copy many: a memo entry names a string or
// tuple of megabytes, and each REDUCE, STACK_GLOBAL or dict entry that uses
// it again copied it. So what values take (their own size, their strings,
// the sizes and keys a tensor copies) is counted, and a pickle whose values
// take more than kMaxValueBytes is an error; the entries copied out of the
// dict are counted the same way.
class PickleMachine {
 public:
  PickleMachine(const std::string& pickle, const std::string& path) : p_(pickle), path_(path) {}
  // Empties every value made (Note [Pickle values]): what Run returned holds
  // no items afterwards.
  ~PickleMachine() {
    for (const PRef& v : made_) v->items.clear();
  }
  PickleMachine(const PickleMachine&) = delete;
  PickleMachine& operator=(const PickleMachine&) = delete;

  // The value the pickle builds. Its items stay valid while the machine lives.
  absl::StatusOr<PRef> Run();

 private:
  PRef Make(PValue::Kind kind, int64_t i = 0, std::string s = "") {
    spent_ += static_cast<int64_t>(sizeof(PValue) + s.size());
    auto v = std::make_shared<PValue>();
    v->kind = kind;
    v->i = i;
    v->s = std::move(s);
    made_.push_back(v);
    return v;
  }
  absl::Status Fail(const std::string& why) const {
    return absl::InvalidArgumentError(
        absl::StrCat("data.shards: ", path_, ": data.pkl at byte ", at_, ": ", why, Help()));
  }
  bool Take(int64_t n, const char** out) {
    if (n < 0 || n > static_cast<int64_t>(p_.size()) - at_) return false;
    *out = p_.data() + at_;
    at_ += n;
    return true;
  }
  absl::StatusOr<PRef> Pop() {
    if (stack_.empty()) return Fail("the pickle's stack is empty");
    PRef v = stack_.back();
    stack_.pop_back();
    return v;
  }
  // The values pushed since the last MARK, which is removed.
  absl::StatusOr<std::vector<PRef>> PopMark();
  absl::Status Op(char op);
  absl::StatusOr<bool> ValueOp(char op);
  // Pushes a string of the length in the next `width` bytes.
  absl::Status PushString(int width);
  absl::Status Reduce();
  absl::Status PersistentId();

  const std::string& p_;
  const std::string& path_;
  int64_t at_ = 0;
  std::vector<PRef> stack_;
  std::map<int64_t, PRef> memo_;
  std::vector<PRef> made_;  // every value made, Note [Pickle values]
  int64_t spent_ = 0;       // bytes that values take, Note [Pickle values]
};

absl::StatusOr<std::vector<PRef>> PickleMachine::PopMark() {
  auto mark = std::find_if(stack_.rbegin(), stack_.rend(),
                           [](const PRef& v) { return v->kind == PValue::Kind::kMark; });
  if (mark == stack_.rend()) return Fail("no MARK on the pickle's stack");
  const auto begin = mark.base();
  std::vector<PRef> items(begin, stack_.end());
  stack_.erase(begin - 1, stack_.end());
  return items;
}

absl::Status PickleMachine::PersistentId() {
  ASSIGN_OR_RETURN(const PRef pid, Pop());
  // ('storage', torch.FloatStorage, key, location, numel)
  const std::vector<PRef>& t = pid->items;
  if (pid->kind != PValue::Kind::kTuple || t.size() < 5 || t[0]->s != "storage" ||
      t[1]->kind != PValue::Kind::kGlobal || t[2]->kind != PValue::Kind::kString ||
      t[4]->kind != PValue::Kind::kInt) {
    return Fail("a persistent id that is not a tensor storage");
  }
  PRef storage = Make(PValue::Kind::kStorage, t[4]->i, t[1]->s);
  storage->tensor.storage_key = t[2]->s;
  spent_ += static_cast<int64_t>(t[2]->s.size());
  stack_.push_back(storage);
  return absl::OkStatus();
}

absl::Status PickleMachine::Reduce() {
  ASSIGN_OR_RETURN(const PRef args, Pop());
  ASSIGN_OR_RETURN(const PRef callable, Pop());
  const std::string& name = callable->s;
  if (callable->kind == PValue::Kind::kGlobal && name == "collections OrderedDict") {
    stack_.push_back(Make(PValue::Kind::kDict));
    return absl::OkStatus();
  }
  // torch::pickle_save tags a typed container (restore_type_tag(dict,
  // "Dict[str, Tensor]")): the container is what was saved.
  // A tensor with requires_grad (or an nn.Parameter) is saved as
  // _rebuild_parameter(tensor, requires_grad, hooks): the tensor is what counts.
  if (callable->kind == PValue::Kind::kGlobal &&
      (name == "torch.jit._pickle restore_type_tag" || name == "torch._utils _rebuild_parameter") &&
      args->kind == PValue::Kind::kTuple && !args->items.empty()) {
    stack_.push_back(args->items[0]);
    return absl::OkStatus();
  }
  if (callable->kind != PValue::Kind::kGlobal || name != "torch._utils _rebuild_tensor_v2") {
    stack_.push_back(Make(PValue::Kind::kOther, 0, absl::StrCat("a ", name)));
    return absl::OkStatus();
  }
  const std::vector<PRef>& a = args->items;
  if (args->kind != PValue::Kind::kTuple || a.size() < 4 || a[0]->kind != PValue::Kind::kStorage ||
      a[1]->kind != PValue::Kind::kInt || a[2]->kind != PValue::Kind::kTuple ||
      a[3]->kind != PValue::Kind::kTuple || a[2]->items.size() != a[3]->items.size()) {
    return Fail("a _rebuild_tensor_v2 call with arguments that are not read");
  }
  PRef t = Make(PValue::Kind::kTensor);
  SavedTensor& s = t->tensor;
  s.is_tensor = true;
  const std::string& storage_type = a[0]->s;  // "torch FloatStorage"
  s.storage_class = storage_type.substr(storage_type.find(' ') + 1);
  s.storage_key = a[0]->tensor.storage_key;
  s.storage.size = a[0]->i;  // its element count, until placed
  s.storage_offset = a[1]->i;
  spent_ += static_cast<int64_t>(s.storage_class.size() + s.storage_key.size() +
                                 2 * sizeof(int64_t) * a[2]->items.size());
  for (size_t d = 0; d < a[2]->items.size(); ++d) {
    if (a[2]->items[d]->kind != PValue::Kind::kInt || a[3]->items[d]->kind != PValue::Kind::kInt) {
      return Fail("a tensor whose size or stride is not a tuple of ints");
    }
    if (a[2]->items[d]->i < 0) return Fail("a tensor with a negative size");
    s.sizes.push_back(a[2]->items[d]->i);
    s.strides.push_back(a[3]->items[d]->i);
  }
  stack_.push_back(t);
  return absl::OkStatus();
}

absl::StatusOr<PRef> PickleMachine::Run() {
  while (at_ < static_cast<int64_t>(p_.size())) {
    const char op = p_[at_++];
    if (op == '.') {  // STOP
      return Pop();
    }
    RETURN_IF_ERROR(Op(op));
    if (spent_ > kMaxValueBytes) {
      return Fail(absl::StrCat("its values take more than ", kMaxValueBytes >> 20,
                               " MiB (a dict of a few tensors takes a few KiB)"));
    }
  }
  return Fail("the pickle ends without STOP (truncated?)");
}

absl::Status PickleMachine::PushString(int width) {
  const char* b = nullptr;
  if (!Take(width, &b)) return Fail("truncated pickle");
  const int64_t n = static_cast<int64_t>(Le(b, width));
  if (!Take(n, &b)) return Fail("truncated pickle");
  stack_.push_back(Make(PValue::Kind::kString, 0, std::string(b, static_cast<size_t>(n))));
  return absl::OkStatus();
}

// Pushes the value `op` reads (a constant, int, string or global): false if
// `op` is not one of those.
absl::StatusOr<bool> PickleMachine::ValueOp(char op) {
  using K = PValue::Kind;
  const char* b = nullptr;
  auto need = [&](int64_t n) { return Take(n, &b) ? absl::OkStatus() : Fail("truncated pickle"); };
  switch (static_cast<unsigned char>(op)) {
    case 0x80:
      RETURN_IF_ERROR(need(1));
      return true;  // PROTO
    case 0x95:
      RETURN_IF_ERROR(need(8));
      return true;  // FRAME
    case '(':
    case '}':
    case ']':  // EMPTY_LIST, kept as a tuple
    case ')':
    case 'N':
      stack_.push_back(Make(op == '('   ? K::kMark
                            : op == '}' ? K::kDict
                            : op == 'N' ? K::kNone
                                        : K::kTuple));
      return true;
    case 0x88:  // NEWTRUE
    case 0x89:  // NEWFALSE
      stack_.push_back(Make(K::kBool, static_cast<unsigned char>(op) == 0x88));
      return true;
    case 'K':
      RETURN_IF_ERROR(need(1));
      stack_.push_back(Make(K::kInt, Le(b, 1)));
      return true;
    case 'M':
      RETURN_IF_ERROR(need(2));
      stack_.push_back(Make(K::kInt, Le(b, 2)));
      return true;
    case 'J':
      RETURN_IF_ERROR(need(4));
      stack_.push_back(Make(K::kInt, static_cast<int32_t>(Le(b, 4))));
      return true;
    case 0x8a: {  // LONG1: little-endian two's complement of n bytes
      RETURN_IF_ERROR(need(1));
      const int n = static_cast<unsigned char>(*b);
      if (n > 8) return Fail("an integer wider than 64 bits");
      RETURN_IF_ERROR(need(n));
      int64_t v = n == 0 ? 0 : static_cast<int64_t>(Le(b, n) << (64 - 8 * n)) >> (64 - 8 * n);
      stack_.push_back(Make(K::kInt, v));
      return true;
    }
    case 'X':
      RETURN_IF_ERROR(PushString(4));
      return true;  // BINUNICODE
    case 0x8c:
      RETURN_IF_ERROR(PushString(1));
      return true;  // SHORT_BINUNICODE
    case 0x8d:
      RETURN_IF_ERROR(PushString(8));
      return true;  // BINUNICODE8
    case 'c': {     // GLOBAL "module\nname\n"
      const size_t nl1 = p_.find('\n', at_);
      const size_t nl2 = nl1 == std::string::npos ? nl1 : p_.find('\n', nl1 + 1);
      if (nl2 == std::string::npos) return Fail("truncated GLOBAL");
      std::string name =
          absl::StrCat(p_.substr(at_, nl1 - at_), " ", p_.substr(nl1 + 1, nl2 - nl1 - 1));
      at_ = static_cast<int64_t>(nl2) + 1;
      stack_.push_back(Make(K::kGlobal, 0, std::move(name)));
      return true;
    }
    case 0x93: {  // STACK_GLOBAL
      ASSIGN_OR_RETURN(const PRef name, Pop());
      ASSIGN_OR_RETURN(const PRef module, Pop());
      stack_.push_back(Make(K::kGlobal, 0, absl::StrCat(module->s, " ", name->s)));
      return true;
    }
    default:
      return false;
  }
}

absl::Status PickleMachine::Op(char op) {
  using K = PValue::Kind;
  ASSIGN_OR_RETURN(const bool pushed, ValueOp(op));
  if (pushed) return absl::OkStatus();
  const char* b = nullptr;
  auto need = [&](int64_t n) { return Take(n, &b) ? absl::OkStatus() : Fail("truncated pickle"); };
  auto memo_put = [&](int64_t key) -> absl::Status {
    if (stack_.empty()) return Fail("memo of an empty stack");
    memo_[key] = stack_.back();
    return absl::OkStatus();
  };
  auto memo_get = [&](int64_t key) -> absl::Status {
    auto it = memo_.find(key);
    if (it == memo_.end()) return Fail(absl::StrCat("memo ", key, " is not set"));
    stack_.push_back(it->second);
    return absl::OkStatus();
  };
  switch (static_cast<unsigned char>(op)) {
    case 'q':
      RETURN_IF_ERROR(need(1));
      return memo_put(static_cast<int64_t>(Le(b, 1)));
    case 'r':
      RETURN_IF_ERROR(need(4));
      return memo_put(static_cast<int64_t>(Le(b, 4)));
    case 0x94:
      return memo_put(static_cast<int64_t>(memo_.size()));  // MEMOIZE
    case 'h':
      RETURN_IF_ERROR(need(1));
      return memo_get(static_cast<int64_t>(Le(b, 1)));
    case 'j':
      RETURN_IF_ERROR(need(4));
      return memo_get(static_cast<int64_t>(Le(b, 4)));
    case 't': {  // TUPLE
      ASSIGN_OR_RETURN(std::vector<PRef> items, PopMark());
      PRef t = Make(K::kTuple);
      t->items = std::move(items);
      stack_.push_back(t);
      return absl::OkStatus();
    }
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1..3
      const size_t n = static_cast<unsigned char>(op) - 0x84;
      if (stack_.size() < n) return Fail("the pickle's stack is too short");
      PRef t = Make(K::kTuple);
      t->items.assign(stack_.end() - n, stack_.end());
      stack_.resize(stack_.size() - n);
      stack_.push_back(t);
      return absl::OkStatus();
    }
    case 'Q':
      return PersistentId();  // BINPERSID
    case 'R':
      return Reduce();
    case 'b':  // BUILD: the state is not looked at
      RETURN_IF_ERROR(Pop().status());
      return stack_.empty() ? Fail("BUILD without an object") : absl::OkStatus();
    case 'a':
    case 'e':
    case 's':
    case 'u': {  // APPEND(S), SETITEM(S)
      std::vector<PRef> items;
      if (op == 'a' || op == 's') {
        const size_t n = op == 'a' ? 1 : 2;
        if (stack_.size() < n + 1) return Fail("the pickle's stack is too short");
        items.assign(stack_.end() - n, stack_.end());
        stack_.resize(stack_.size() - n);
      } else {
        ASSIGN_OR_RETURN(items, PopMark());
      }
      if (stack_.empty()) return Fail("the pickle's stack is empty");
      std::vector<PRef>& to = stack_.back()->items;
      to.insert(to.end(), items.begin(), items.end());
      return absl::OkStatus();
    }
    default:
      return Fail(absl::StrCat("pickle op 0x", absl::Hex(static_cast<unsigned char>(op)),
                               " is not read (the file holds more than a dict of tensors)"));
  }
}

std::string KindName(const PValue& v) {
  switch (v.kind) {
    case PValue::Kind::kDict:
      return "a dict";
    case PValue::Kind::kTuple:
      return "a tuple or list";
    case PValue::Kind::kString:
      return "a string";
    case PValue::Kind::kInt:
      return "an int";
    case PValue::Kind::kBool:
      return "a bool";
    case PValue::Kind::kNone:
      return "None";
    case PValue::Kind::kTensor:
      return "a tensor";
    case PValue::Kind::kOther:
      return v.s;
    default:
      return "not a tensor";
  }
}

// OK unless the archive says its values are big-endian (PyTorch 1.13+
// writes ARCHIVE/byteorder; older files are little-endian).
absl::Status CheckByteOrder(int fd, const std::string& path,
                            const std::map<std::string, ZipEntry>& zip,
                            const std::string& archive) {
  auto order = zip.find(archive + "byteorder");
  if (order == zip.end() || order->second.compressed || order->second.data.size > 16) {
    return absl::OkStatus();
  }
  std::string value(static_cast<size_t>(order->second.data.size), '\0');
  if (!ReadAt(fd, value.data(), order->second.data.size, order->second.data.offset)) {
    return absl::DataLossError(absl::StrCat("data.shards: cannot read ", path, "'s byteorder"));
  }
  if (value == "big") return NotTorchSave(path, "its values are saved big-endian");
  return absl::OkStatus();
}

std::optional<ElementType> StorageType(const std::string& storage_class) {
  static constexpr std::pair<const char*, ElementType> kTypes[] = {
      {"FloatStorage", ElementType::kFloat32}, {"DoubleStorage", ElementType::kFloat64},
      {"CharStorage", ElementType::kInt8},     {"ByteStorage", ElementType::kUInt8},
      {"ShortStorage", ElementType::kInt16},   {"IntStorage", ElementType::kInt32},
      {"LongStorage", ElementType::kInt64}};
  for (const auto& [name, type] : kTypes) {
    if (storage_class == name) return type;
  }
  return std::nullopt;
}

}  // namespace

bool SavedTensor::Contiguous() const {
  int64_t expected = 1;
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    if (sizes[d] != 1 && strides[d] != expected) return false;
    // A product past int64 is no tensor in memory (a damaged file's sizes).
    if (__builtin_mul_overflow(expected, sizes[d], &expected)) return false;
  }
  return true;
}

absl::StatusOr<std::vector<SavedTensor>> ReadTorchSaveDict(int fd, const std::string& path,
                                                           int64_t size) {
  ASSIGN_OR_RETURN(const auto zip, ReadZip(fd, path, size));
  auto pkl = std::find_if(zip.begin(), zip.end(), [](const auto& e) {
    return e.first == "data.pkl" || absl::EndsWith(e.first, "/data.pkl");
  });
  if (pkl == zip.end()) return NotTorchSave(path, "its zip archive has no data.pkl");
  const std::string archive = pkl->first.substr(0, pkl->first.size() - 8);  // "ARCHIVE/"
  if (pkl->second.compressed || pkl->second.data.size > kMaxPickleBytes) {
    return NotTorchSave(path, "its data.pkl is compressed or larger than 16 MiB");
  }
  std::string pickle(static_cast<size_t>(pkl->second.data.size), '\0');
  if (!ReadAt(fd, pickle.data(), pkl->second.data.size, pkl->second.data.offset)) {
    return absl::DataLossError(absl::StrCat("data.shards: cannot read ", path, "'s data.pkl"));
  }
  RETURN_IF_ERROR(CheckByteOrder(fd, path, zip, archive));
  PickleMachine machine(pickle, path);  // owns what `top` holds (Note [Pickle values])
  ASSIGN_OR_RETURN(const PRef top, machine.Run());
  if (top->kind != PValue::Kind::kDict) return NotTorchSave(path, "it holds no dict");
  std::vector<SavedTensor> out;
  int64_t spent = 0;  // by the entries copied out (Note [Pickle values])
  for (size_t i = 0; i + 1 < top->items.size(); i += 2) {
    if (top->items[i]->kind != PValue::Kind::kString) continue;
    const PValue& v = *top->items[i + 1];
    spent += static_cast<int64_t>(sizeof(SavedTensor) + top->items[i]->s.size() + v.s.size() +
                                  v.tensor.storage_key.size() + v.tensor.storage_class.size() +
                                  2 * sizeof(int64_t) * v.tensor.sizes.size());
    if (spent > kMaxValueBytes) {
      return NotTorchSave(
          path, absl::StrCat("its dict's entries take more than ", kMaxValueBytes >> 20, " MiB"));
    }
    SavedTensor t = v.tensor;
    t.key = top->items[i]->s;
    if (v.kind != PValue::Kind::kTensor) {
      t.what = KindName(v);
      out.push_back(std::move(t));
      continue;
    }
    t.type = StorageType(t.storage_class);
    const int64_t numel = t.storage.size;
    auto record = zip.find(absl::StrCat(archive, "data/", t.storage_key));
    if (record == zip.end()) {
      return NotTorchSave(path, absl::StrCat("the storage of '", t.key, "' (", archive, "data/",
                                             t.storage_key, ") is not in its zip archive"));
    }
    t.storage = record->second.data;
    t.compressed = record->second.compressed;
    t.what = "a tensor";
    // numel is the file's: compared by division, as numel * bytes may be past int64.
    if (t.type && !t.compressed &&
        (numel < 0 || t.storage.size % ElementBytes(*t.type) != 0 ||
         t.storage.size / ElementBytes(*t.type) != numel)) {
      return NotTorchSave(path, absl::StrCat("the storage of '", t.key, "' has ", t.storage.size,
                                             " bytes for ", numel, " elements"));
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace chorus
