// DecentralizedDataParallel: gossip averaging. Instead of all-reducing
// gradients, each rank keeps its own model, takes local optimizer steps, and
// averages its parameters with the few peers the topology names for that
// step (sdk/topology.h); the exchange overlaps a whole iteration.
//
// Parameters are cut into buckets (bucket_cap_mb) whose parameters become
// views into one contiguous block per bucket (Note [Flat views] in
// worker/replica/bucket_layout.h). Each bucket has its own
// optimizer (from the factory) and follows the same LR schedule. Once every
// gradient of a bucket is ready (autograd hook), the bucket
//   1. waits for the exchange it launched in the previous iteration and mixes:
//      x_i <- mean of its group's parameters (Note [Mixing]);
//   2. takes its local optimizer step with its own gradients;
//   3. launches the exchange of the result with the next step's group.
// So one iteration computes x_{t+1} = W_t x_t - lr * update(grad f_i(x_t)),
// where W_t is the topology's mixing matrix for step t (the first step of an
// instance has no mix).
//
// One iteration:
//   loss = model->forward(x) ...; loss.backward();
//   RETURN_IF_ERROR(engine->FinishStep());   // buckets whose hooks did not run
// No optimizer.step() or zero_grad(): the engine owns the optimizers.
// Evaluation and checkpoints: GlobalAverage(), use the model,
// RevertGlobalAverage() (or keep the average).
//
// Thread-safety: one training thread drives an instance; hooks run on it.
// Several instances may share a communicator if every rank calls them in the
// same order.
//
// Example:
//   DecentralizedOptions options;
//   options.topology.kind = TopologyKind::kRing;
//   ASSIGN_OR_RETURN(auto engine, DecentralizedDataParallel::Create(
//       params, buffers, *comm, [](const std::vector<at::Tensor>& p) {
//         return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1)); },
//       nullptr, options));
//   RETURN_IF_ERROR(engine->BroadcastParameters(0));
//
// Part of the SDK's interface ("chorus/decentralized_data_parallel.h"): a
// program drives the engine itself (chorus/data_parallel.h makes one for a
// module) and sets its DecentralizedOptions. The class is already a pimpl,
// so this header names only Communicator, NamedTensor and the topology
// config; its buckets, hooks and exchanges stay in worker/decentralized and
// worker/replica, not installed.
#ifndef CHORUS_SDK_DECENTRALIZED_DATA_PARALLEL_H_
#define CHORUS_SDK_DECENTRALIZED_DATA_PARALLEL_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/communicator.h"
#include "chorus/named_tensor.h"
#include "chorus/topology.h"

namespace torch::optim {
class Optimizer;
}

namespace chorus {

struct DecentralizedOptions {
  TopologyConfig topology;
  double bucket_cap_mb = 25;
  // Gradient clipping (clip_norm > 0): by the norm of all of this rank's
  // gradients (then buckets update after backward, in FinishStep, because
  // the norm needs every gradient), or by each bucket's own norm (updates
  // stay in the hooks, overlapping backward).
  enum class Clip { kGlobalNorm, kPerBucket };
  Clip clip_mode = Clip::kGlobalNorm;
  double clip_norm = 0;
  // GlobalAverage() also averages floating-point buffers (batch-norm
  // statistics).
  bool average_buffers = false;
  // Names this instance in flight-recorder tags: "dec:<name>/bucket<i>".
  std::string name = "model";
  // How long a wait for an exchange or a setup collective may take.
  absl::Duration timeout = absl::Minutes(5);
  // Ranks [0, training_ranks) train and gossip over the topology; the
  // others are hot spares (Note [Hot spares]). 0: every rank trains.
  int training_ranks = 0;
};

// Makes the optimizer of one bucket over its parameters.
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(const std::vector<at::Tensor>& params)>;
// The learning rate of the update taken at `step` (0-based); null keeps the
// optimizers' own.
using LrSchedule = std::function<double(int64_t step)>;

class DecentralizedDataParallel {
 public:
  // `parameters` with requires_grad are trained and averaged; the others and
  // `buffers` are only broadcast (and buffers averaged by GlobalAverage if
  // average_buffers); a tensor listed twice (tied weights) counts once.
  // Every rank must pass the same names, shapes and dtypes;
  // otherwise every rank gets INVALID_ARGUMENT naming the first difference.
  // INVALID_ARGUMENT if the topology cannot serve comm.size() ranks.
  // `comm` must outlive the instance.
  static absl::StatusOr<std::unique_ptr<DecentralizedDataParallel>> Create(
      std::vector<NamedTensor> parameters, std::vector<NamedTensor> buffers, Communicator& comm,
      OptimizerFactory make_optimizer, LrSchedule lr_schedule, DecentralizedOptions options);

  DecentralizedDataParallel(const DecentralizedDataParallel&) = delete;
  DecentralizedDataParallel& operator=(const DecentralizedDataParallel&) = delete;
  // Waits (up to min(timeout, 30 s)) for the exchanges in flight, which the
  // peers expect to complete, and removes the hooks.
  ~DecentralizedDataParallel();

  // Copies `root`'s parameters and buffers to every rank (exchanges in
  // flight are waited for and dropped).
  absl::Status BroadcastParameters(int root);

  // Call after each backward: updates the buckets whose hooks did not run
  // (parameters without a gradient count as ready) and ends the step.
  // Returns the first error of an exchange or of a misuse (two backwards
  // without FinishStep). Inside Accumulate() it does nothing.
  absl::Status FinishStep();

  // While alive, backward passes only accumulate gradients; the next
  // backward outside it updates with the sum.
  class AccumulateScope {
   public:
    explicit AccumulateScope(DecentralizedDataParallel& engine);
    ~AccumulateScope();
    AccumulateScope(const AccumulateScope&) = delete;
    AccumulateScope& operator=(const AccumulateScope&) = delete;

   private:
    DecentralizedDataParallel& engine_;
    bool previous_;
  };
  AccumulateScope Accumulate() { return AccumulateScope(*this); }

  // Whether this rank is a hot spare (rank >= options.training_ranks).
  bool spare() const;

  // Replaces every rank's parameters (and float buffers if average_buffers)
  // by the exact mean over the training ranks (spares get it too), keeping
  // a copy of its own. Waits for
  // the exchanges in flight first; their results are kept for the next step
  // if the average is reverted and dropped if it is not (averaged parameters
  // are already in consensus). REQUIRES: between steps.
  absl::Status GlobalAverage();
  // Restores the parameters (and buffers) GlobalAverage replaced, exactly;
  // a spare keeps the average. FAILED_PRECONDITION if there is no average
  // to revert.
  absl::Status RevertGlobalAverage();

  // The step the next update takes (0 at creation): it selects the LR and
  // the topology's groups.
  int64_t step() const;
  // Continues a run at `step` (after restoring a checkpoint). REQUIRES: no
  // exchange in flight, same value on every rank.
  void SetStep(int64_t step);

  // The exchanges the last step launched, for checkpoints of every rank's
  // own model that resume bit for bit (Note [Exchange in checkpoints]).
  struct PendingExchange {
    bool pair = false;                  // received = the peer's values (else the group's mean)
    std::vector<NamedTensor> received;  // by parameter name; empty when nothing is pending
  };
  // Waits for the exchanges in flight and returns (copies of) what they
  // brought; they are still mixed in at the next step as usual. Empty after
  // a kept global average (its step mixes nothing) or before the first step.
  // REQUIRES: between steps, no reverted-pending global average in effect.
  absl::StatusOr<PendingExchange> TakePendingExchange();
  // Makes `pending` (from TakePendingExchange of the same rank, same world
  // size and topology) the exchange the next step mixes in. REQUIRES:
  // nothing in flight (a new instance). INVALID_ARGUMENT naming the
  // parameter if names or shapes do not match.
  absl::Status RestorePendingExchange(const PendingExchange& pending);
  size_t bucket_count() const;
  std::vector<std::string> bucket_parameters(size_t b) const;
  // The buckets' optimizers, in bucket order (for checkpoints). The bucket
  // layout changes once, at the end of the first step (Note [Bucket order] in
  // sdk/distributed_data_parallel.h); optimizer state moves with its parameters.
  std::vector<torch::optim::Optimizer*> optimizers() const;
  // Bytes this rank has put on the wire in exchanges (payload), and seconds
  // the training thread waited for exchanges of the previous step.
  int64_t bytes_sent() const;
  double exchange_wait_seconds() const;

  class Impl;

 private:
  explicit DecentralizedDataParallel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Note [Exchange in checkpoints]
// A step's update uses gradients computed at the parameters from before the
// previous step's exchange arrived (the exchange overlaps the iteration).
// A checkpoint of the ranks' own models must therefore hold the received
// values as well: restoring only the parameters would start the resumed run
// with nothing to mix and put it on a different trajectory. With both, the
// first resumed step mixes exactly what the uninterrupted run mixes. The
// bucket layout may differ after a restore (it is rebuilt from the gradient
// order); mixing is elementwise, so pairs give identical bits, while group
// means of more than two ranks may round differently (a ring all-reduce
// sums each element in an order that depends on where it sits in its block).

// Note [Hot spares]
// An elastic job re-forms at whatever size its ranks allow, and some
// topologies serve only some sizes (one_peer_exponential: powers of two).
// With n ranks the job trains with k = ServedWorldSize(topology, n) of them
// (sdk/topology.h), ranks 0..k-1, and keeps ranks k..n-1 as hot spares:
// processes that have loaded the data and built the model, take part in
// every collective of the whole world, and train on nothing. For the
// engine a spare is a rank whose group is itself at every step (no
// exchange) and whose optimizers never step. GlobalAverage() is the mean of
// the k training ranks' models (spares add zeros; the sum is divided by k)
// and a spare keeps it when the trainers revert, so a spare holds the model
// of the last evaluation, checkpoint or global average. When a member is
// lost, the next generation forms with the survivors: ranks are numbered
// again, a spare may now be below k and train, and its state comes from the
// survivors that trained (worker/train/state_sync.h), as a newcomer's does,
// but without a process to start or data to load.

// Note [Mixing]
// Every group of a step averages with equal weights, so a pair exchanges
// blocks with one SendRecv (each side sends its block and receives the
// peer's, then x <- (x + peer) / 2), and a larger group all-reduces a copy
// with ReduceOp::kAvg on its own sub-communicator (x <- group mean). The
// block itself is sent, without a copy: it is not written until the next
// step's hook has waited for the exchange. Exchanges of all buckets are
// issued in bucket index order on every rank, so the k-th exchange of a rank
// always meets the k-th exchange of its peer.

}  // namespace chorus

#endif  // CHORUS_SDK_DECENTRALIZED_DATA_PARALLEL_H_
