// Pieces every data-parallel engine needs, whatever it averages: named
// tensors, a check that all ranks hold the same parameter set, coalesced
// broadcasts, and "gradient is ready" hooks on parameters.
//
// Thread-safety: the functions are called by the training thread; hooks run
// on the thread that runs backward (the training thread for CPU tensors).
//
// Example:
//   RETURN_IF_ERROR(CheckReplicasAgree(params, comm, "ddp:model", deadline));
//   GradientReadyHooks hooks(tensors, [&](size_t i) { MarkReady(i); });
#ifndef CHORUS_WORKER_DDP_REPLICA_SYNC_H_
#define CHORUS_WORKER_DDP_REPLICA_SYNC_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

namespace torch::autograd {
struct Node;
}

namespace chorus {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

// OK if every rank passed the same names, dtypes, shapes and requires_grad
// flags in the same order; otherwise INVALID_ARGUMENT on every rank, naming
// the first difference. `who` prefixes the message ("ddp:model").
absl::Status CheckReplicasAgree(const std::vector<NamedTensor>& tensors, Communicator& comm,
                                absl::string_view who, absl::Time deadline);

// Broadcasts `tensors` from `root`, one flat message per dtype.
absl::Status BroadcastCoalesced(const std::vector<at::Tensor>& tensors, int root, Communicator& comm,
                                const std::string& tag, absl::Time deadline);

// Calls `ready(i)` each time backward has finished writing tensors[i].grad.
// See Note [Gradient hooks] in distributed_data_parallel.h. The hooks are
// removed by the destructor. REQUIRES: every tensor requires grad and is a
// leaf.
class GradientReadyHooks {
 public:
  GradientReadyHooks(const std::vector<at::Tensor>& tensors, std::function<void(size_t)> ready);
  ~GradientReadyHooks();
  GradientReadyHooks(const GradientReadyHooks&) = delete;
  GradientReadyHooks& operator=(const GradientReadyHooks&) = delete;

 private:
  std::function<void(size_t)> ready_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> keys_;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_DDP_REPLICA_SYNC_H_
