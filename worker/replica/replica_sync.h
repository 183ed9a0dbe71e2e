// Keeping replicas identical, for every data-parallel engine whatever it
// averages: a check that all ranks hold the same parameter set, and
// coalesced broadcasts of parameters and buffers.
//
// Thread-safety: called by the training thread; every rank calls the same
// functions in the same order (they are collectives).
//
// Example:
//   RETURN_IF_ERROR(CheckReplicasAgree(params, comm, "ddp:model", deadline));
//   RETURN_IF_ERROR(BroadcastCoalesced(tensors, 0, comm, "ddp:model/broadcast", deadline));
#ifndef CHORUS_WORKER_REPLICA_REPLICA_SYNC_H_
#define CHORUS_WORKER_REPLICA_REPLICA_SYNC_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "chorus/communicator.h"
#include "chorus/named_tensor.h"

namespace chorus {

// OK if every rank passed the same names, dtypes, shapes and requires_grad
// flags in the same order; otherwise INVALID_ARGUMENT on every rank, naming
// the first difference. `who` prefixes the message ("ddp:model").
absl::Status CheckReplicasAgree(const std::vector<NamedTensor>& tensors, Communicator& comm,
                                absl::string_view who, absl::Time deadline);

// Broadcasts `tensors` from `root`, one flat message per dtype.
absl::Status BroadcastCoalesced(const std::vector<at::Tensor>& tensors, int root,
                                Communicator& comm, const std::string& tag, absl::Time deadline);

// Replaces `values` by `root`'s (a bucket order, say), moved through `comm`
// on its device. Every rank must pass the same number of values.
absl::Status BroadcastIndices(std::vector<size_t>& values, int root, Communicator& comm,
                              const std::string& tag, absl::Time deadline);

}  // namespace chorus

#endif  // CHORUS_WORKER_REPLICA_REPLICA_SYNC_H_
