#include "worker/train/dataset_pack.h"

#include <ATen/ATen.h>
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/train/data.h"
#include "worker/train/shard_writer.h"

namespace chorus {
namespace {

// Writes samples to consecutive shards of `samples_per_shard`.
class ShardSequence {
 public:
  explicit ShardSequence(const PackOptions& options) : options_(options) {}

  absl::Status Add(const std::string& key, const std::string& x, const std::string& y) {
    if (tar_ == nullptr) {
      path_ = absl::StrFormat("%s-%06d.tar", options_.out, result_.shards);
      ASSIGN_OR_RETURN(tar_, TarWriter::Create(path_));
    }
    RETURN_IF_ERROR(tar_->Add(key + ".x.npy", x));
    RETURN_IF_ERROR(tar_->Add(key + ".y.npy", y));
    ++result_.samples;
    if (result_.samples % options_.samples_per_shard == 0) return CloseShard();
    return absl::OkStatus();
  }

  absl::StatusOr<PackResult> Finish() {
    RETURN_IF_ERROR(CloseShard());
    if (result_.samples == 0) {
      return absl::InvalidArgumentError(absl::StrCat(options_.from, " holds no samples"));
    }
    result_.paths_glob = absl::StrCat(options_.out, "-*.tar");
    return result_;
  }

 private:
  absl::Status CloseShard() {
    if (tar_ == nullptr) return absl::OkStatus();
    RETURN_IF_ERROR(tar_->Close());
    // Note [Index files] in shard_index.cc: readers skip the header scan.
    RETURN_IF_ERROR(WriteIndexFile(path_, "x.npy", "y.npy"));
    result_.bytes += tar_->bytes();
    ++result_.shards;
    tar_.reset();
    return absl::OkStatus();
  }

  const PackOptions& options_;
  std::unique_ptr<TarWriter> tar_;
  std::string path_;  // of the shard being written
  PackResult result_;
};

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// KEY.x.npy and KEY.y.npy pairs of `dir`, by KEY in name order; each
// checked to be a .npy file this reader reads.
absl::StatusOr<PackResult> PackFolder(const PackOptions& options) {
  std::vector<std::string> keys;
  DIR* d = ::opendir(options.from.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", options.from));
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (absl::EndsWith(name, ".x.npy")) keys.push_back(name.substr(0, name.size() - 6));
  }
  ::closedir(d);
  std::sort(keys.begin(), keys.end());
  ShardSequence out(options);
  for (const std::string& key : keys) {
    std::string member[2];
    for (int m = 0; m < 2; ++m) {
      const std::string path = absl::StrCat(options.from, "/", key, m == 0 ? ".x.npy" : ".y.npy");
      absl::StatusOr<std::string> bytes = ReadWhole(path);
      if (!bytes.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, " is missing: every KEY.x.npy needs its KEY.y.npy"));
      }
      absl::StatusOr<NpyArray> parsed = ParseNpy(bytes->data(), bytes->size());
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", parsed.status().message()));
      }
      member[m] = *std::move(bytes);
    }
    RETURN_IF_ERROR(out.Add(key, member[0], member[1]));
  }
  return out.Finish();
}

// Row `i` of `t` (float32 or int64) as .npy bytes.
std::string RowNpy(const at::Tensor& t, int64_t i) {
  const at::Tensor row = t[i].contiguous();
  const std::vector<int64_t> shape(row.sizes().begin(), row.sizes().end());
  return NpyBytes(row.scalar_type() == at::kFloat ? ElementType::kFloat32 : ElementType::kInt64,
                  shape, row.data_ptr());
}

absl::StatusOr<PackResult> PackTensorFile(const PackOptions& options) {
  v1::JobSpec spec;
  spec.mutable_data()->mutable_tensor_file()->set_path(options.from);
  absl::StatusOr<Dataset> data = LoadDataset(spec, Split::kTrain);
  if (!data.ok()) return data.status();
  ShardSequence out(options);
  const int digits = static_cast<int>(std::to_string(data->size()).size());
  for (int64_t i = 0; i < data->size(); ++i) {
    RETURN_IF_ERROR(
        out.Add(absl::StrFormat("%0*d", digits, i), RowNpy(data->x, i), RowNpy(data->y, i)));
  }
  return out.Finish();
}

}  // namespace

absl::StatusOr<PackResult> PackDataset(const PackOptions& options) {
  if (options.samples_per_shard <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--samples_per_shard must be > 0, got ", options.samples_per_shard));
  }
  if (options.out.empty()) return absl::InvalidArgumentError("--out is required");
  struct stat st;
  if (::stat(options.from.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("--from ", options.from, " does not exist"));
  }
  return S_ISDIR(st.st_mode) ? PackFolder(options) : PackTensorFile(options);
}

}  // namespace chorus
