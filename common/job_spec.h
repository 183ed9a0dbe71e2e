// Loading, normalizing and validating job specs (chorus.v1.JobSpec).
//
// A spec is read from .textproto/.pbtxt, .json or .yaml/.yml into the same
// message. Unknown fields are errors. Normalization fills every default the
// proto documents, so the result is the spec as it will run. Validation
// reports every problem at once, each with its field path and what is allowed:
//   strategy.ddp.bucket_cap_mb: must be > 0, got -3
//
// All functions are thread-compatible and touch no global state.
//
// Example:
//   absl::StatusOr<chorus::v1::JobSpec> spec = LoadJobSpec("job.yaml");
//   if (!spec.ok()) { std::cerr << spec.status().message(); return 2; }
#ifndef CHORUS_COMMON_JOB_SPEC_H_
#define CHORUS_COMMON_JOB_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chorus/topology.h"
#include "chorus/v1/job.pb.h"
#include "common/memory_estimate.h"

namespace chorus {

enum class SpecFormat { kTextProto, kJson, kYaml };

// The format implied by a file name's extension; INVALID_ARGUMENT naming the
// accepted extensions otherwise.
absl::StatusOr<SpecFormat> SpecFormatFromPath(absl::string_view path);

// Parses `text` as `format`. `source` names the input in error messages
// (usually the file path). Does not normalize or validate.
absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view text, SpecFormat format,
                                         absl::string_view source);

// Fills unset fields with their documented defaults. Idempotent; never
// changes a value the user set, except that paths are stored in one form
// ("/mnt/ckpt/" -> "/mnt/ckpt"; Note [Paths in one form]).
void NormalizeJobSpec(v1::JobSpec& spec);

// The largest job spec, serialized: the coordinator keeps every spec and
// sends it in each job listing, so program.env and argv are bounded here;
// large data goes in files.
inline constexpr size_t kMaxJobSpecBytes = size_t{256} << 10;

// One problem found by validation.
struct SpecError {
  std::string field;    // e.g. "strategy.ddp.bucket_cap_mb"
  std::string message;  // e.g. "must be > 0, got -3"
};

// Processes and threads one rank may have when resources.max_processes is
// unset (the cgroup's pids.max; Note [Rank cgroups] in
// worker/agent/rank_cgroup.cc).
inline constexpr int kDefaultMaxProcesses = 4096;
// The smallest resources.memory_bytes: a rank's runtime alone needs more.
inline constexpr int64_t kMinRankMemoryBytes = int64_t{64} << 20;

// The memory limit each rank of the normalized `spec` runs under, in bytes
// (0: none): resources.memory_bytes when set; for the built-in trainer
// twice the memory estimate plus 1 GiB (plus 4 GiB more on CUDA, whose
// runtime's host memory the estimate does not count), rounded up to 64 MiB
// (the estimate is within 1.5x of measured peaks: docs/benchmarks.md); none for a
// program, whose memory nothing in the spec tells, nor for a trainer job
// whose sizes are in files (a TorchScript module, tensor_file or shards
// data): the coordinator decides the limit and reads no files.
int64_t RankMemoryLimitBytes(const v1::JobSpec& spec);

// The process limit of each rank: resources.max_processes, or
// kDefaultMaxProcesses.
int RankProcessLimit(const v1::JobSpec& spec);

// Every problem in a normalized spec; empty when the spec is valid. A spec
// over kMaxJobSpecBytes is refused as a whole ("spec"). A spec
// whose per-rank memory estimate (common/memory_estimate.h) exceeds what any
// one machine holds is refused, the error on the field that drives it:
//   model.mlp.hidden_sizes: a rank needs about 98.0 TB (...), more than ...
std::vector<SpecError> ValidateJobSpec(const v1::JobSpec& spec);

// "a rank needs about 1.4 TB (parameters ...), more than the 24.0 GB `what`;
// make the job smaller".
std::string RankMemoryMessage(const RankMemoryEstimate& memory, double limit_bytes,
                              absl::string_view what);

// OK, or INVALID_ARGUMENT listing every error, one "field: message" per line,
// after a header naming `source`.
absl::Status CheckJobSpec(const v1::JobSpec& spec, absl::string_view source);

// Where a SHARED_DIR job's checkpoint directories are: shared_dir, then
// shared_dir_namespace when set ("/mnt/ckpt/3f9a1c2b4d5e"); checkpoints are
// <that>/<job>/<step>. Ranks, grants and recovery all build paths from it.
std::string SharedCheckpointRoot(const v1::CheckpointSpec& checkpoint);

// The topology a decentralized strategy asks for (sdk/topology.h).
TopologyConfig TopologyFromSpec(const v1::DecentralizedStrategy& decentralized);

// Whether some world size in [resources.min_ranks, resources.max_ranks] of
// an elastic decentralized job is one its topology does not serve, so that
// ranks beyond the largest served size are hot spares (Note [Hot spares] in
// sdk/decentralized_data_parallel.h).
bool MayHaveHotSpares(const v1::JobSpec& spec);

// How many ranks of a world of `world_size` train: all of them but for a
// job with hot spares, where ranks [0, result) train (the largest size the
// topology serves) and the others are spares. INVALID_ARGUMENT if the
// topology serves no size up to `world_size`.
absl::StatusOr<int> TrainingRanks(const v1::JobSpec& spec, int world_size);

// Micro-batches of training.batch_size_per_rank a rank trains per optimizer
// step at `world_size` training ranks: training.global_batch_size /
// (batch_size_per_rank x world_size) when the global batch is set, else
// strategy.ddp.grad_accum_steps (1 for other strategies). INVALID_ARGUMENT
// naming the field and the world size when the global batch does not split
// into whole micro-batches on every rank.
absl::StatusOr<int> MicroBatchesPerStep(const v1::JobSpec& spec, int world_size);

// Reads, parses, normalizes and validates the spec at `path`.
// NOT_FOUND if the file cannot be read; INVALID_ARGUMENT for bad contents.
// A program spec without program.working_dir gets `program_working_dir`
// (the client passes the directory the user ran it in) before validation.
absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path,
                                        const std::string& program_working_dir = "");

// The spec in text format, fields in declaration order.
std::string JobSpecToText(const v1::JobSpec& spec);
// The spec as JSON (snake_case field names, enum names).
std::string JobSpecToJson(const v1::JobSpec& spec);

}  // namespace chorus

#endif  // CHORUS_COMMON_JOB_SPEC_H_
