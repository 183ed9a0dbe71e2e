#include "worker/replica/bucket_assignment.h"

#include <algorithm>
#include <map>

namespace chorus {

std::vector<std::vector<size_t>> AssignBuckets(const std::vector<BucketInput>& params,
                                               const std::vector<size_t>& order,
                                               int64_t first_cap_bytes, int64_t cap_bytes) {
  struct Open {
    std::vector<size_t> members;
    int64_t bytes = 0;
    size_t first_position = 0;
  };
  std::map<int, Open> open;                                    // by dtype
  std::vector<std::pair<size_t, std::vector<size_t>>> closed;  // (first position, members)
  bool first_closed = false;
  for (size_t pos = 0; pos < order.size(); ++pos) {
    const size_t index = order[pos];
    Open& bucket = open[params[index].dtype];
    if (bucket.members.empty()) bucket.first_position = pos;
    bucket.members.push_back(index);
    bucket.bytes += params[index].bytes;
    const int64_t cap = first_closed ? cap_bytes : first_cap_bytes;
    if (bucket.bytes >= cap) {
      closed.emplace_back(bucket.first_position, std::move(bucket.members));
      bucket = Open();
      first_closed = true;
    }
  }
  for (auto& [dtype, bucket] : open) {
    if (!bucket.members.empty())
      closed.emplace_back(bucket.first_position, std::move(bucket.members));
  }
  std::sort(closed.begin(), closed.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::vector<size_t>> buckets;
  buckets.reserve(closed.size());
  for (auto& [pos, members] : closed) buckets.push_back(std::move(members));
  return buckets;
}

}  // namespace chorus
