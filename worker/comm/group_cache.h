// GroupCache: the sub-groups a communicator has made (NewGroup), cached by
// rank list, so the two backends (gloo_communicator.h, nccl_communicator.h)
// share validation, naming and caching.
//
// Internal to Chorus (the backends build on it; programs see only
// Communicator::NewGroup in chorus/communicator.h), so it is not part of the
// SDK's installed headers.
//
// Thread-safe.
//
// Example (a backend's NewGroup):
//   return groups_.GetOrCreate(ranks, size(), rank(), group(), *store_,
//       [&](int index, std::vector<int> world, std::unique_ptr<Store> store) {
//         return MakeGroup(index, std::move(world), std::move(store)); });
#ifndef CHORUS_WORKER_COMM_GROUP_CACHE_H_
#define CHORUS_WORKER_COMM_GROUP_CACHE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "chorus/communicator.h"
#include "worker/comm/store.h"

namespace chorus {

class GroupCache {
 public:
  // Builds the group's communicator: `index` is this rank's rank in it,
  // `world_ranks` its members as world ranks, `store` its own namespace.
  using Factory = std::function<absl::StatusOr<std::shared_ptr<Communicator>>(
      int index, std::vector<int> world_ranks, std::unique_ptr<Store> store)>;

  // The cached group for `ranks` (of a communicator of `size` ranks whose own
  // ranks map to `parent_group`), or a new one from `make`, namespaced under
  // `parent_store`.
  absl::StatusOr<std::shared_ptr<Communicator>> GetOrCreate(const std::vector<int>& ranks, int size,
                                                            int rank,
                                                            const std::vector<int>& parent_group,
                                                            Store& parent_store,
                                                            const Factory& make);
  // Aborts every cached group with `reason` (Communicator::Abort).
  void AbortAll(absl::string_view reason);

 private:
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Communicator>> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_GROUP_CACHE_H_
