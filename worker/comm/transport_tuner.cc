#include "worker/comm/transport_tuner.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace chorus {

namespace {

std::string Bytes(double bytes) {
  if (bytes >= (1 << 20)) return absl::StrFormat("%g MiB", bytes / (1 << 20));
  if (bytes >= (1 << 10)) return absl::StrFormat("%g KiB", bytes / (1 << 10));
  return absl::StrFormat("%g B", bytes);
}

}  // namespace

const char* PathName(TransportTuner::Path path) {
  return path == TransportTuner::Path::kSharedMemory ? "shared memory" : "the TCP ring";
}

int TransportTuner::SizeClass(size_t bytes) {
  int k = 12;  // everything below 4 KiB
  while (k < 62 && (uint64_t{1} << (k + 1)) <= bytes) ++k;
  return k;
}

TransportTuner::Path TransportTuner::Next(size_t bytes) const {
  auto it = classes_.find(SizeClass(bytes));
  if (it == classes_.end()) return Path::kSharedMemory;
  if (it->second.decided) return it->second.path;
  return it->second.ops % 2 == 0 ? Path::kSharedMemory : Path::kTcp;
}

bool TransportTuner::Record(size_t bytes, Path path, double seconds) {
  Class& c = classes_[SizeClass(bytes)];
  if (c.decided) return false;
  const int round = c.ops / 2;  // each round runs both paths once
  ++c.ops;
  if (round >= options_.warmup_per_path) {
    double& best = path == Path::kSharedMemory ? c.best.shared_memory : c.best.tcp;
    if (best < 0 || seconds < best) best = seconds;
  }
  return c.ops == 2 * (options_.warmup_per_path + options_.samples_per_path);
}

bool TransportTuner::Measuring(size_t bytes) const {
  auto it = classes_.find(SizeClass(bytes));
  return it == classes_.end() || !it->second.decided;
}

TransportTuner::Timings TransportTuner::Measured(size_t bytes) const {
  auto it = classes_.find(SizeClass(bytes));
  return it == classes_.end() ? Timings{} : it->second.best;
}

std::string TransportTuner::Decide(size_t bytes, const Timings& agreed) {
  const int k = SizeClass(bytes);
  Class& c = classes_[k];
  c.decided = true;
  c.path = agreed.tcp < agreed.shared_memory * (1 - options_.tcp_margin) ? Path::kTcp
                                                                         : Path::kSharedMemory;
  const std::string hi = Bytes(static_cast<double>(uint64_t{1} << (k + 1)));
  const std::string sizes = k == 12 ? absl::StrCat("below ", hi)
                                    : absl::StrCat("of ", Bytes(uint64_t{1} << k), " to ", hi);
  return absl::StrFormat(
      "all-reduces %s: shared memory %.3f ms, TCP ring %.3f ms (slowest rank, best of %d): "
      "using %s",
      sizes, agreed.shared_memory * 1e3, agreed.tcp * 1e3, options_.samples_per_path,
      PathName(c.path));
}

}  // namespace chorus
