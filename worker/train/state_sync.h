// State sync: how the members of a re-formed generation of an elastic job
// (docs/elastic.md) come to hold the same training state.
//
// Each member says which step its held state completed (-1: none, a
// newcomer); one small all-reduce finds the newest, a second the lowest rank
// holding it (the source). The source serializes its state — parameters,
// buffers, optimizer state, step and epoch position, the two files of a
// checkpoint (worker/train/checkpoint.h) — and broadcasts the bytes over the
// new communicator; every member loads them into its model and its freshly
// built optimizers. Nothing goes through disk or the coordinator.
//
// Decentralized training keeps one model per rank, so the survivors' models
// differ: after ShareNewestState, AverageHeldModels gives every member the
// exact mean of the models the survivors held (Note [Re-formed gossip]).
//
// Thread-safety: the training thread calls it; every member of the
// communicator must call it at the same point (it is a sequence of
// collectives).
//
// When no member holds any state (every rank that held a step was lost, or
// none had completed one), nothing is shared: the generation starts over
// from the job's starting point (Note [Starting over] in trainer.cc).
//
// Example:
//   ASSIGN_OR_RETURN(std::optional<SharedState> shared,
//                    ShareNewestState(comm, *model, strategy->optimizers(),
//                                     held ? &*held : nullptr, absl::Now() + absl::Minutes(5)));
//   if (!shared.has_value()) return StartOver(...);
//   TrainingPosition position = shared->position;
//   if (!strategy->replicas_identical()) {
//     ASSIGN_OR_RETURN(int averaged, AverageHeldModels(comm, *model, held ? &*held : nullptr,
//                                                      absl::Now() + absl::Minutes(5)));
//   }
#ifndef CHORUS_WORKER_TRAIN_STATE_SYNC_H_
#define CHORUS_WORKER_TRAIN_STATE_SYNC_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/communicator.h"
#include "worker/train/checkpoint.h"
#include "worker/train/model.h"

namespace torch::optim {
class Optimizer;
}

namespace chorus {

struct SharedState {
  TrainingPosition position;  // world_size: the communicator's
  int source = 0;             // the rank whose state every member now holds
  int64_t bytes = 0;          // the state's serialized size
};

// Agrees on the newest state any member holds (`held`, null for none) and
// loads it into `model` and `optimizers` on every member. Nullopt on every
// member, with nothing loaded, when no member holds any state; a failed
// collective's status otherwise.
absl::StatusOr<std::optional<SharedState>> ShareNewestState(
    Communicator& comm, Model& model, const std::vector<torch::optim::Optimizer*>& optimizers,
    const Snapshot* held, absl::Time deadline);

// Note [Re-formed gossip]
// A decentralized job's ranks each train their own model and mix it with a
// few peers, so when a generation fails its survivors hold different models
// (and possibly different steps: one finished step s+1, another had not).
// The next generation starts every member, newcomers included, from the mean
// of the models the survivors held: the consensus gossip converges to,
// reached at once, with nothing of a lost rank's model in it. What was in
// flight (an exchange received and not mixed yet) is dropped. The position
// and the optimizer state come from ShareNewestState (the newest step's
// holder); the parameters and floating-point buffers are replaced by the
// mean. Sums are taken in double precision and rounded once, so every
// member gets the same bits.
//
// Replaces `model`'s floating-point parameters and buffers on every member
// by the mean of the models the members hold (`held`, null for a newcomer,
// which adds nothing); integer buffers are left as they are. Returns how
// many models were averaged. FAILED_PRECONDITION when none is held;
// INTERNAL when `held` does not match the model's tensors (a bug); a failed
// collective's status otherwise. Every member must call it at the same
// point.
absl::StatusOr<int> AverageHeldModels(Communicator& comm, Model& model, const Snapshot* held,
                                      absl::Time deadline);

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_STATE_SYNC_H_
