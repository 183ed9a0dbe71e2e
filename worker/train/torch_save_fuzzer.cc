// Fuzz target: the torch.save reader of TENSOR_FILES shards
// (ReadTorchSaveDict: a zip directory and a data.pkl pickle, read without
// LibTorch) and the shard index built on it (ShardIndex::Build), on files a
// user's shard directory may hold.
//
// Input: one byte choosing how the file is made, then
//   even: the file's bytes as they are (the zip directory is fuzzed);
//   odd:  its zip members, each a u8 name length, the name, a u16 data
//         length and the data, written as a stored zip archive (a pickle
//         grown or shrunk by a mutation is still a well-formed member).
// The file is read by ReadTorchSaveDict and then indexed as the one shard
// of data.shards { format: TENSOR_FILES }.
//
// Properties checked besides memory safety and no escaping exception:
//   - an error of either names the file;
//   - an accepted file's entries: a tensor's storage lies inside the file
//     and has as many strides as sizes; an entry that is not a tensor says
//     what it is;
//   - an accepted shard: x and y are tensors of a read type, contiguous,
//     uncompressed, with sizes[0] samples each (the shard's count), whose
//     storage_offset + product(sizes) elements fit in their storage; a row
//     is product(sizes[1:]) >= 1 elements, each dimension >= 1; and the
//     rows Locate gives (first, middle, last) lie inside x's and y's
//     storage, so inside the file.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/scratch_dir.h"
#include "worker/train/shard_index.h"
#include "worker/train/torch_save_file.h"

namespace chorus {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "torch_save_fuzzer: %s\n", what.c_str());
  std::abort();
}

bool Inside(const ByteRange& r, const ByteRange& within) {
  return r.offset >= within.offset && r.size >= 0 && r.size <= within.end() - r.offset;
}

// The product of `dims` (each checked >= 0 by the caller), or -1 past int64.
int64_t Product(std::vector<int64_t>::const_iterator begin,
                std::vector<int64_t>::const_iterator end) {
  int64_t p = 1;
  for (auto it = begin; it != end; ++it) {
    if (__builtin_mul_overflow(p, *it, &p)) return -1;
  }
  return p;
}

void CheckEntries(const std::vector<SavedTensor>& saved, int64_t size) {
  const ByteRange file{0, size};
  for (const SavedTensor& t : saved) {
    if (!t.is_tensor) {
      if (t.what.empty() || t.what == "a tensor") Fail("'" + t.key + "' says it is " + t.what);
      continue;
    }
    if (t.what != "a tensor") Fail("tensor '" + t.key + "' says it is " + t.what);
    if (!Inside(t.storage, file)) {
      Fail(absl::StrCat("the storage of '", t.key, "' [", t.storage.offset, ", +", t.storage.size,
                        ") lies outside the file of ", size, " bytes"));
    }
    if (t.sizes.size() != t.strides.size()) Fail("'" + t.key + "' has sizes and strides apart");
  }
}

// `t` is a shard's x or y, `rows` its place in the index, `count` the
// shard's samples.
void CheckRows(const SavedTensor& t, const TensorRows& rows, int64_t count) {
  const std::string name = "'" + t.key + "'";
  if (!t.is_tensor || !t.type || t.compressed || !t.Contiguous() || t.sizes.empty()) {
    Fail(name + " was indexed though it is no contiguous tensor of a read type");
  }
  if (t.sizes[0] != count) Fail(name + "'s first dimension differs from the shard's count");
  for (int64_t d : t.sizes) {
    if (d < 0) Fail(absl::StrCat(name, " was indexed with a dimension of ", d));
  }
  for (int64_t d : rows.shape) {
    if (d < 1) Fail(absl::StrCat(name, "'s rows have a dimension of ", d));
  }
  const int64_t elem = ElementBytes(*t.type);
  const int64_t numel = Product(t.sizes.begin(), t.sizes.end());
  const int64_t row_elems = Product(t.sizes.begin() + 1, t.sizes.end());
  int64_t needed = 0;
  if (numel < 0 || row_elems < 1 || t.storage_offset < 0 ||
      __builtin_add_overflow(t.storage_offset, numel, &needed) ||
      __builtin_mul_overflow(needed, elem, &needed) || needed > t.storage.size) {
    Fail(absl::StrCat(name, ": storage_offset ", t.storage_offset, " + ", numel,
                      " elements do not fit its storage of ", t.storage.size, " bytes"));
  }
  if (rows.type != *t.type || rows.row_bytes != row_elems * elem ||
      rows.offset != t.storage.offset + t.storage_offset * elem) {
    Fail(name + "'s rows differ from its sizes, type or storage");
  }
}

void CheckIndex(const std::string& path, const std::vector<SavedTensor>& saved, int64_t size) {
  v1::ShardedData spec;
  spec.set_format(v1::ShardedData::TENSOR_FILES);
  spec.add_paths(path);
  absl::StatusOr<ShardIndex> index = ShardIndex::Build(spec);
  if (!index.ok()) {
    // The one error about all shards together: none holds a sample.
    const bool no_samples = index.status().message().find("hold no samples") != std::string::npos;
    if (!no_samples && index.status().message().find(path) == absl::string_view::npos) {
      Fail("an index error does not name the file: " + index.status().ToString());
    }
    return;
  }
  if (index->shards().size() != 1) Fail("one file made other than one shard");
  const ShardIndex::Shard& shard = index->shards()[0];
  const SavedTensor* x = nullptr;
  const SavedTensor* y = nullptr;
  for (const SavedTensor& t : saved) {  // the last entry of a key is the one indexed
    if (t.key == "x") x = &t;
    if (t.key == "y") y = &t;
  }
  if (x == nullptr || y == nullptr) Fail("a shard was indexed without both 'x' and 'y'");
  if (shard.count < 1 || index->size() != shard.count) Fail("the shard's count is not its size");
  CheckRows(*x, shard.x_rows, shard.count);
  CheckRows(*y, shard.y_rows, shard.count);
  const ByteRange file{0, size};
  for (int64_t i : {int64_t{0}, shard.count / 2, shard.count - 1}) {
    const SampleLocation loc = index->Locate(i);
    if (loc.shard != 0 || !Inside(loc.x, x->storage) || !Inside(loc.y, y->storage) ||
        !Inside(loc.x, file) || !Inside(loc.y, file)) {
      Fail(absl::StrCat("sample ", i, " of ", shard.count,
                        " lies outside its tensors' storage: x [", loc.x.offset, ", +", loc.x.size,
                        "), y [", loc.y.offset, ", +", loc.y.size, ")"));
    }
  }
}

std::string Le(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}

// The members in `in` as a zip archive whose members are stored, with local
// headers, a central directory and its end record (what torch.save writes,
// less the alignment padding and CRCs, which the reader does not look at).
std::string StoredZip(FuzzInput& in) {
  std::string local, directory;
  int members = 0;
  while (!in.empty() && members < 0xffff) {
    const std::string name = in.Bytes(in.Byte());
    const std::string data = in.Bytes(in.U16());
    const std::string sizes = Le(0, 4) + Le(data.size(), 4) + Le(data.size(), 4);
    directory += Le(0x02014b50, 4) + Le(20, 2) + Le(20, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) +
                 sizes + Le(name.size(), 2) + std::string(12, '\0') + Le(local.size(), 4) + name;
    local += Le(0x04034b50, 4) + Le(20, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) + sizes +
             Le(name.size(), 2) + Le(0, 2) + name + data;
    ++members;
  }
  return local + directory + Le(0x06054b50, 4) + Le(0, 4) + Le(members, 2) + Le(members, 2) +
         Le(directory.size(), 4) + Le(local.size(), 4) + Le(0, 2);
}

void CheckTorchSaveFile(const std::string& bytes) {
  const std::string path = ScratchDir() + "/input.pt";
  WriteScratchFile(path, bytes);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Fail("cannot open " + path);
  const int64_t size = static_cast<int64_t>(bytes.size());
  absl::StatusOr<std::vector<SavedTensor>> saved = ReadTorchSaveDict(fd, path, size);
  ::close(fd);
  if (!saved.ok()) {
    if (saved.status().message().find(path) == absl::string_view::npos) {
      Fail("an error does not name the file: " + saved.status().ToString());
    }
    return;
  }
  CheckEntries(*saved, size);
  CheckIndex(path, *saved, size);
}

}  // namespace
}  // namespace chorus

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::FuzzInput in(data, size);
  if (in.Byte() % 2 == 0) {
    chorus::CheckTorchSaveFile(in.Rest());
  } else {
    chorus::CheckTorchSaveFile(chorus::StoredZip(in));
  }
  return 0;
}
