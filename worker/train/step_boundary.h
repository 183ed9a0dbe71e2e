// Where an elastic job's planned change (a drain, a growth) may happen:
// Note [Step boundary] in trainer.cc. The coordinator's
// REFORM_AT_STEP_BOUNDARY names the next generation and the world size it
// plans for it; a rank keeps the newest request packed in one word, so that
// the ranks agree on both with one all-reduce (max).
//
// Thread-safety: pure functions.
//
// Example:
//   RaiseTo(progress.reform_request, PackReformRequest(d.generation(), d.world_size()));
//   ReformRequest asked = UnpackReformRequest(all_reduced_max);
//   int64_t every = BoundarySamples(2, 4, asked.world_size, 16, 4096);  // 48 for 3
#ifndef CHORUS_WORKER_TRAIN_STEP_BOUNDARY_H_
#define CHORUS_WORKER_TRAIN_STEP_BOUNDARY_H_

#include <cstdint>

namespace chorus {

struct ReformRequest {
  int64_t generation = 0;  // 0: none
  int world_size = 0;      // planned for that generation; 0: not known
};

// generation << 20 | world_size: the maximum of packed requests is the
// newest generation's (world sizes of 2^20 or more count as not known).
int64_t PackReformRequest(int64_t generation, int world_size);
ReformRequest UnpackReformRequest(int64_t packed);

// The samples of an epoch after which the ranks may stop for a planned
// change: the rest of the epoch then fills whole global batches of the next
// world, so that data.remainder DROP leaves out what an undisturbed run at
// that world would. A multiple of `planned_world` x `per_rank_step` when the
// planned world is known, else of the global batch of every world size in
// [min_ranks, max_ranks]; `epoch_samples` + 1 (only an epoch's start
// qualifies) when that is more than the epoch holds.
int64_t BoundarySamples(int min_ranks, int max_ranks, int planned_world, int64_t per_rank_step,
                        int64_t epoch_samples);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_STEP_BOUNDARY_H_
