// Bucket assignment for the data-parallel engines: a pure function from
// parameter sizes to buckets.
//
// See Note [Bucket order] in sdk/distributed_data_parallel.h.
#ifndef CHORUS_WORKER_REPLICA_BUCKET_ASSIGNMENT_H_
#define CHORUS_WORKER_REPLICA_BUCKET_ASSIGNMENT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace chorus {

struct BucketInput {
  int64_t bytes = 0;
  // Parameters of different dtypes never share a bucket.
  int dtype = 0;
};

// Walks `order` (indices into `params`), filling one open bucket per dtype; a
// bucket closes once it holds at least `first_cap_bytes` (the first bucket to
// close) or `cap_bytes` (every later one). Returns the buckets, each a list
// of parameter indices in walk order, sorted by the position of their first
// parameter in `order`, so bucket 0 is the one whose gradients are expected
// first. Every index of `order` appears in exactly one bucket.
std::vector<std::vector<size_t>> AssignBuckets(const std::vector<BucketInput>& params,
                                               const std::vector<size_t>& order,
                                               int64_t first_cap_bytes, int64_t cap_bytes);

}  // namespace chorus

#endif  // CHORUS_WORKER_REPLICA_BUCKET_ASSIGNMENT_H_
