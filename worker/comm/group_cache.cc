#include "worker/comm/group_cache.h"

#include <utility>

#include "absl/strings/str_join.h"

namespace chorus {

absl::StatusOr<std::shared_ptr<Communicator>> GroupCache::GetOrCreate(
    const std::vector<int>& ranks, int size, int rank, const std::vector<int>& parent_group,
    Store& parent_store, const Factory& make) {
  absl::StatusOr<int> index = GroupIndexOf(ranks, size, rank);
  if (!index.ok()) return index.status();
  const std::string key = absl::StrJoin(ranks, ",");
  absl::MutexLock lock(&mu_);
  if (auto it = groups_.find(key); it != groups_.end()) return it->second;
  absl::StatusOr<std::shared_ptr<Communicator>> comm =
      make(*index, WorldRanks(ranks, parent_group),
           std::make_unique<PrefixStore>(parent_store, "group/" + key));
  if (comm.ok()) groups_[key] = *comm;
  return comm;
}

void GroupCache::AbortAll(absl::string_view reason) {
  absl::MutexLock lock(&mu_);
  for (auto& [key, group] : groups_) group->Abort(reason);
}

}  // namespace chorus
