// Data parallelism for a program's own modules: Chorus's synchronous DDP
// (sdk/distributed_data_parallel.h) and decentralized gossip
// training (sdk/decentralized_data_parallel.h) over any
// torch::nn::Module, or over a named subset of its parameters — DDP on the
// networks one method updates, everything else left local (an RL agent's
// target networks, a replay buffer, counters).
//
// A subset is given as dotted-name prefixes of the module's parameters
// ("actor.", "critic."); a prefix that matches no parameter is an error, so
// a renamed submodule is not silently left unsynchronized.
//
// Thread-safety: the helpers are plain functions; the engines' contracts are
// in their headers (one training thread drives an instance).
//
// Example:
//   DdpOptions options;
//   options.find_unused_parameters = true;  // a branch only some ranks run
//   ASSIGN_OR_RETURN(auto ddp, DistributedDataParallelFor(*agent, {"actor.", "critic."},
//                                                         session.communicator(), options));
//   RETURN_IF_ERROR(ddp->BroadcastParameters(0));
//   RETURN_IF_ERROR(ddp->PrepareForBackward());
//   loss.backward();
//   RETURN_IF_ERROR(ddp->FinishGradientSync());
#ifndef CHORUS_SDK_DATA_PARALLEL_H_
#define CHORUS_SDK_DATA_PARALLEL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "chorus/communicator.h"
#include "chorus/decentralized_data_parallel.h"
#include "chorus/distributed_data_parallel.h"
#include "chorus/named_tensor.h"

namespace torch::nn {
class Module;
}

namespace chorus {

// `module`'s parameters whose dotted names start with one of `prefixes`
// (all of them when `prefixes` is empty), in the module's order, each
// shared tensor once. INVALID_ARGUMENT naming a prefix that matches none.
absl::StatusOr<std::vector<NamedTensor>> NamedParameters(
    torch::nn::Module& module, const std::vector<std::string>& prefixes = {});

// The same for buffers; a prefix may match no buffer (most modules have
// none).
std::vector<NamedTensor> NamedBuffers(torch::nn::Module& module,
                                      const std::vector<std::string>& prefixes = {});

// DDP over the parameters and buffers of `module` under `prefixes` (all
// when empty). `comm` must outlive the engine; every rank passes the same
// prefixes.
absl::StatusOr<std::unique_ptr<DistributedDataParallel>> DistributedDataParallelFor(
    torch::nn::Module& module, const std::vector<std::string>& prefixes, Communicator& comm,
    DdpOptions options = DdpOptions());

// Decentralized training of the same subset: the engine owns the optimizer
// (one per bucket, made by `make_optimizer`) and steps it in the backward
// hooks.
absl::StatusOr<std::unique_ptr<DecentralizedDataParallel>> DecentralizedDataParallelFor(
    torch::nn::Module& module, const std::vector<std::string>& prefixes, Communicator& comm,
    OptimizerFactory make_optimizer, LrSchedule lr_schedule,
    DecentralizedOptions options = DecentralizedOptions());

}  // namespace chorus

#endif  // CHORUS_SDK_DATA_PARALLEL_H_
