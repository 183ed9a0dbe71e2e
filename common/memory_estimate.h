// How much memory one rank of a job needs, estimated from its spec alone:
// the runtime (LibTorch, gRPC, threads), parameters, their gradients,
// optimizer state, the strategy's communication buffers (DDP buckets, gossip
// buffers), the checkpoint's copy, the dataset each rank holds in memory, and
// the larger of a training step's activations and an evaluation batch's.
//
// The figure is meant to catch sizes no machine can hold
// (`hidden_sizes: [2000000000]`) before a rank dies allocating them, and to
// place ranks on agents by memory. It is not an exact accounting, but it is
// checked against measured peaks: for the built-in models a rank's peak
// resident memory lies within [0.67, 1.5] x the estimate
// (tests/memory_estimate_e2e_test.sh, docs/benchmarks.md "Memory per rank"). Where the spec does not say a size (a
// TorchScript module, a tensor_file's shapes) the estimate uses the file's
// size as a lower bound, through the injected `file_size` callback, and
// counts nothing when the size is unknown.
//
// All arithmetic is in double, so products of huge dimensions cannot wrap
// (an int64 product of [100000, 100000] x 4096 samples would).
//
// Thread-safety: pure functions.
//
// Example:
//   RankMemoryEstimate m = EstimateRankMemory(normalized_spec);
//   if (m.total() > agent_memory_bytes)
//     return absl::FailedPreconditionError(absl::StrCat(m.field, ": a rank needs ", m.ToString()));
#ifndef CHORUS_COMMON_MEMORY_ESTIMATE_H_
#define CHORUS_COMMON_MEMORY_ESTIMATE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "chorus/v1/job.pb.h"

namespace chorus {

// Bytes per rank, by what holds them.
struct RankMemoryEstimate {
  double runtime = 0;  // LibTorch's and the rank's own baseline, whatever the job
  double parameters = 0;
  double gradients = 0;
  double optimizer = 0;      // SGD momentum 1x, Adam 2x, accumulating Adam 3x the parameters
  double communication = 0;  // DDP buckets or gossip buffers
  double checkpoint = 0;     // the parameters and optimizer state a checkpoint copies
  double data = 0;           // the training and test splits held in memory
  double activations = 0;    // a training step's saved activations and live gradients
  double evaluation = 0;     // an evaluation batch's forward pass (no gradients)
  // The spec field that drives the largest part, e.g. "model.mlp.hidden_sizes"
  // or "data.synthetic.input_shape": what a user would change.
  std::string field;

  // Training and evaluation take turns: only the larger counts.
  double total() const {
    return runtime + parameters + gradients + optimizer + communication + checkpoint + data +
           (activations > evaluation ? activations : evaluation);
  }
  // total() in bytes, saturated at INT64_MAX.
  int64_t total_bytes() const;
  // "about 1.4 TB (runtime 180.0 MB, parameters 344.0 GB, ..., activations
  // 2.0 TB)": the total and every non-zero part; activations and evaluation
  // as "the larger of activations X and evaluation Y" when both count.
  std::string ToString() const;
};

// Size in bytes of the file at a path, or -1 when unknown (cannot be read
// here).
using FileSizeFn = std::function<int64_t(const std::string& path)>;

// Estimates one rank of the normalized `spec` (NormalizeJobSpec); file sizes
// come from `file_size` (null: unknown). A program job's estimate is zero
// (unknown), its field "program".
RankMemoryEstimate EstimateRankMemory(const v1::JobSpec& spec, const FileSizeFn& file_size = {});

// The size of a local file via stat(2); -1 if it cannot be read.
int64_t LocalFileSize(const std::string& path);

// "16.0 TB", "512 B": decimal units, one decimal from kB on.
std::string FormatBytes(double bytes);

// "4 GiB", "256 MiB", "1.5 GiB", "512 B": binary units (what memory limits
// are set in), one decimal unless the size is a whole number of the unit.
std::string FormatBinaryBytes(int64_t bytes);

// The physical memory of this machine (/proc/meminfo MemTotal), or 0 when it
// cannot be read.
int64_t MachineMemoryBytes();

// Parses /proc/meminfo's text; 0 when it has no MemTotal line.
int64_t ParseMemTotal(const std::string& meminfo);

// The peak resident memory of this process since it started or last
// exec'd (/proc/self/status VmHWM), or 0 when it cannot be read. What a
// rank measures against its estimate (docs/benchmarks.md, "Memory per rank").
int64_t PeakResidentBytes();

// Parses /proc/PID/status's text; 0 when it has no VmHWM line.
int64_t ParseVmHwm(const std::string& status);

// No single machine holds more than this per process: specs whose estimate
// exceeds it are refused by validation whatever the cluster (64 TiB).
inline constexpr double kMaxRankMemoryBytes = 64.0 * (int64_t{1} << 40);

}  // namespace chorus

#endif  // CHORUS_COMMON_MEMORY_ESTIMATE_H_
