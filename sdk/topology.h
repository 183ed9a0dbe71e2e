// Topologies of decentralized (gossip) training: which ranks average their
// parameters together at each step.
//
// A topology is a periodic schedule. Each step is a partition of the ranks
// into groups; the members of a group replace their parameters by the group's
// mean (equal weights 1/|group|). Every rank is in exactly one group per
// step, so each step's mixing matrix is symmetric and doubly stochastic and
// the ranks' mean is preserved. A group of one means "no exchange".
//
//   complete                      one group of all ranks (exact average).
//   ring                          even n; even steps pair (0,1)(2,3)..., odd
//                                 steps pair (1,2)(3,4)...(n-1,0).
//   one_peer_exponential          n a power of two; step t pairs i with
//                                 i xor 2^(t mod log2 n); after log2 n steps
//                                 every rank holds the exact mean.
//   alternating_exponential_ring  n = nodes * local_world_size, nodes a power
//                                 of two; even steps average within each
//                                 node, odd steps pair local rank l of node a
//                                 with local rank l of node a xor 2^k, k
//                                 cycling through log2(nodes).
//   custom                        the steps as given (checked to be
//                                 partitions of [0, n)).
//
// Pure functions of their inputs; thread-compatible.
//
// Example:
//   ASSIGN_OR_RETURN(Topology ring, Topology::Create({TopologyKind::kRing}, 4));
//   const std::vector<int>& peers = ring.GroupOf(step, rank);
//
// Part of the SDK's interface ("chorus/topology.h"): a gossip program picks
// its topology in DecentralizedOptions::topology (chorus/
// decentralized_data_parallel.h). The schedule itself is a few pure
// functions with no dependency beyond Abseil, so it is public with it.
#ifndef CHORUS_SDK_TOPOLOGY_H_
#define CHORUS_SDK_TOPOLOGY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace chorus {

enum class TopologyKind {
  kComplete,
  kRing,
  kOnePeerExponential,
  kAlternatingExponentialRing,
  kCustom,
};
const char* TopologyName(TopologyKind kind);

// One step: groups of ranks, each sorted, together covering every rank once.
using TopologyStep = std::vector<std::vector<int>>;

struct TopologyConfig {
  TopologyKind kind = TopologyKind::kOnePeerExponential;
  // Ranks per node (alternating_exponential_ring only).
  int local_world_size = 1;
  // kCustom only: step t uses custom_steps[t % custom_steps.size()].
  std::vector<TopologyStep> custom_steps;
};

// OK if `config` can serve `world_size` ranks; otherwise INVALID_ARGUMENT
// with the reason and the nearest world sizes it can serve.
absl::Status CheckWorldSize(const TopologyConfig& config, int world_size);

// The largest world size <= `world_size` that `config` serves. An elastic
// decentralized job that has `world_size` ranks trains with that many; the
// others are hot spares (Note [Hot spares] in
// sdk/decentralized_data_parallel.h). INVALID_ARGUMENT with
// CheckWorldSize's reason if no size up to `world_size` is served.
absl::StatusOr<int> ServedWorldSize(const TopologyConfig& config, int world_size);

class Topology {
 public:
  static absl::StatusOr<Topology> Create(const TopologyConfig& config, int world_size);

  int world_size() const { return world_size_; }
  // Steps before the schedule repeats.
  int period() const { return static_cast<int>(steps_.size()); }
  const TopologyStep& Step(int64_t t) const { return steps_[Index(t)]; }
  // The group `rank` averages with at step `t` (itself included).
  const std::vector<int>& GroupOf(int64_t t, int rank) const {
    const int i = Index(t);
    return steps_[i][group_of_[i][rank]];
  }
  // Step t's mixing matrix, row-major n x n: W[i][j] = 1/|g| if i and j are
  // in the same group g, else 0.
  std::vector<double> MixingMatrix(int64_t t) const;

 private:
  Topology(int world_size, std::vector<TopologyStep> steps);
  int Index(int64_t t) const { return static_cast<int>(t % static_cast<int64_t>(steps_.size())); }

  int world_size_;
  std::vector<TopologyStep> steps_;
  std::vector<std::vector<int>> group_of_;  // [step][rank] -> group index
};

}  // namespace chorus

#endif  // CHORUS_SDK_TOPOLOGY_H_
