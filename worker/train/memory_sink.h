// Test helpers: checkpoints kept in memory (a CheckpointStorage), for the
// trainer's tests on the CPU and on GPUs.
#ifndef CHORUS_WORKER_TRAIN_MEMORY_SINK_H_
#define CHORUS_WORKER_TRAIN_MEMORY_SINK_H_

#include <ATen/core/Tensor.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "checkpoint/layout.h"
#include "checkpoint/storage.h"
#include "chorus/v1/coordinator.pb.h"

namespace chorus {

// Checkpoints kept in memory, by step (the parts of per-rank checkpoints
// gathered under their step).
class MemorySink : public CheckpointStorage {
 public:
  absl::Status Store(int64_t step, const std::vector<CheckpointFileSource>& files) override {
    std::vector<CheckpointFileData> data;
    for (const CheckpointFileSource& f : files) {
      absl::StatusOr<CheckpointFileData> d = ReadAll(f);
      if (!d.ok()) return d.status();
      data.push_back(*std::move(d));
    }
    return Put(step, data);
  }
  // Stores files already in memory (copies another sink's checkpoint).
  absl::Status Put(int64_t step, const std::vector<CheckpointFileData>& files) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const CheckpointFileData& f : files) {
      auto& stored = stored_[step];
      auto it = std::find_if(stored.begin(), stored.end(),
                             [&f](const CheckpointFileData& s) { return s.name == f.name; });
      if (it != stored.end()) {
        *it = f;
      } else {
        stored.push_back(f);
      }
    }
    return absl::OkStatus();
  }
  // The files the manifest names (all when it names none).
  absl::StatusOr<std::vector<CheckpointFileData>> Load(const v1::CheckpointManifest& m) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = stored_.find(m.step());
    if (it == stored_.end()) return absl::NotFoundError("no such step");
    if (m.files_size() == 0) return it->second;
    std::vector<CheckpointFileData> out;
    for (const v1::CheckpointFile& f : m.files()) {
      for (const CheckpointFileData& s : it->second) {
        if (s.name == f.name()) out.push_back(s);
      }
    }
    return out;
  }
  std::vector<std::string> Files(int64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const CheckpointFileData& f : stored_.at(step)) out.push_back(f.name);
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<int64_t> Steps() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int64_t> out;
    for (const auto& [step, files] : stored_) out.push_back(step);
    return out;
  }
  // The model tensors stored at `step` (rank `rank`'s part of a per-rank
  // checkpoint).
  std::map<std::string, at::Tensor> Model(int64_t step, int rank = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, at::Tensor> out;
    for (const CheckpointFileData& f : stored_.at(step)) {
      if (f.name != ModelFileName(rank)) continue;
      c10::IValue v = torch::jit::pickle_load(std::vector<char>(f.bytes.begin(), f.bytes.end()));
      for (const auto& item : v.toGenericDict())
        out[item.key().toStringRef()] = item.value().toTensor();
    }
    return out;
  }

 private:
  std::mutex mu_;
  std::map<int64_t, std::vector<CheckpointFileData>> stored_;
};

// The manifest that resumes from `step` of a MemorySink.
inline v1::CheckpointManifest At(int64_t step) {
  v1::CheckpointManifest m;
  m.set_job_id("job-1");
  m.set_step(step);
  return m;
}

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_MEMORY_SINK_H_
