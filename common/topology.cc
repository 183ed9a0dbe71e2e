#include "chorus/topology.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace chorus {
namespace {

bool IsPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

int Log2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

int CustomWorldSize(const TopologyConfig& config) {
  int size = 0;
  if (config.custom_steps.empty()) return 0;
  for (const auto& group : config.custom_steps[0]) size += static_cast<int>(group.size());
  return size;
}

// Why `config` cannot serve `n` ranks, or "" if it can.
std::string Unservable(const TopologyConfig& config, int n) {
  if (n < 1) return absl::StrCat("a world needs at least one rank, got ", n);
  switch (config.kind) {
    case TopologyKind::kComplete:
      return "";
    case TopologyKind::kRing:
      if (n == 1 || n % 2 == 0) return "";
      return absl::StrCat("ring pairs neighbours and needs an even number of ranks, got ", n);
    case TopologyKind::kOnePeerExponential:
      if (IsPowerOfTwo(n)) return "";
      return absl::StrCat(
          "one_peer_exponential pairs rank i with i xor 2^k and needs a "
          "power-of-two number of ranks, got ",
          n);
    case TopologyKind::kAlternatingExponentialRing: {
      const int local = config.local_world_size;
      if (local < 1) return absl::StrCat("local_world_size must be >= 1, got ", local);
      if (n % local != 0) {
        return absl::StrCat("alternating_exponential_ring needs whole nodes: ", n,
                            " ranks are not a multiple of local_world_size ", local);
      }
      if (!IsPowerOfTwo(n / local)) {
        return absl::StrCat(
            "alternating_exponential_ring pairs nodes a and a xor 2^k and needs a "
            "power-of-two number of nodes, got ",
            n / local, " (", n, " ranks / local_world_size ", local, ")");
      }
      return "";
    }
    case TopologyKind::kCustom: {
      const int size = CustomWorldSize(config);
      if (size == 0) return "a custom topology needs at least one step";
      if (n != size) {
        return absl::StrCat("the custom topology's steps cover ", size, " ranks, the world has ",
                            n);
      }
      for (size_t s = 0; s < config.custom_steps.size(); ++s) {
        std::vector<int> seen(n, 0);
        for (const auto& group : config.custom_steps[s]) {
          if (group.empty()) return absl::StrCat("custom step ", s, " has an empty group");
          for (int r : group) {
            if (r < 0 || r >= n)
              return absl::StrCat("custom step ", s, ": rank ", r, " is outside [0, ", n, ")");
            if (seen[r]++)
              return absl::StrCat("custom step ", s, ": rank ", r, " is in more than one group");
          }
        }
        for (int r = 0; r < n; ++r) {
          if (!seen[r]) return absl::StrCat("custom step ", s, ": rank ", r, " is in no group");
        }
      }
      return "";
    }
  }
  return "unknown topology";
}

}  // namespace

const char* TopologyName(TopologyKind kind) {
  switch (kind) {
    case TopologyKind::kComplete:
      return "complete";
    case TopologyKind::kRing:
      return "ring";
    case TopologyKind::kOnePeerExponential:
      return "one_peer_exponential";
    case TopologyKind::kAlternatingExponentialRing:
      return "alternating_exponential_ring";
    case TopologyKind::kCustom:
      return "custom";
  }
  return "unknown";
}

absl::Status CheckWorldSize(const TopologyConfig& config, int world_size) {
  const std::string why = Unservable(config, world_size);
  if (why.empty()) return absl::OkStatus();
  // The nearest sizes on either side that work (custom schedules serve one).
  std::vector<int> nearest;
  if (config.kind == TopologyKind::kCustom) {
    if (CustomWorldSize(config) > 0 && Unservable(config, CustomWorldSize(config)).empty()) {
      nearest.push_back(CustomWorldSize(config));
    }
  } else if (world_size >= 1) {
    for (int n = world_size - 1; n >= 1; --n) {
      if (Unservable(config, n).empty()) {
        nearest.push_back(n);
        break;
      }
    }
    for (int n = world_size + 1; n <= 2 * world_size + 2 * std::max(1, config.local_world_size);
         ++n) {
      if (Unservable(config, n).empty()) {
        nearest.push_back(n);
        break;
      }
    }
  }
  if (nearest.empty()) return absl::InvalidArgumentError(why);
  return absl::InvalidArgumentError(
      absl::StrCat(why, "; nearest world sizes that work: ", absl::StrJoin(nearest, " and ")));
}

absl::StatusOr<int> ServedWorldSize(const TopologyConfig& config, int world_size) {
  for (int n = world_size; n >= 1; --n) {
    if (Unservable(config, n).empty()) return n;
  }
  // `world_size` itself is not served here, so this is never OK.
  return CheckWorldSize(config, world_size);
}

Topology::Topology(int world_size, std::vector<TopologyStep> steps)
    : world_size_(world_size), steps_(std::move(steps)) {
  group_of_.assign(steps_.size(), std::vector<int>(world_size_, 0));
  for (size_t s = 0; s < steps_.size(); ++s) {
    for (auto& group : steps_[s]) std::sort(group.begin(), group.end());
    for (size_t g = 0; g < steps_[s].size(); ++g) {
      for (int r : steps_[s][g]) group_of_[s][r] = static_cast<int>(g);
    }
  }
}

absl::StatusOr<Topology> Topology::Create(const TopologyConfig& config, int n) {
  if (absl::Status s = CheckWorldSize(config, n); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology ", TopologyName(config.kind), ": ", s.message()));
  }
  // Pairs i with i xor d among `count` slots mapped to ranks by `rank_of`.
  auto xor_pairs = [](int count, int d, auto rank_of) {
    TopologyStep step;
    for (int i = 0; i < count; ++i) {
      const int j = i ^ d;
      if (i < j) step.push_back({rank_of(i), rank_of(j)});
    }
    return step;
  };
  auto identity = [n] {
    TopologyStep step;
    for (int r = 0; r < n; ++r) step.push_back({r});
    return step;
  };
  std::vector<TopologyStep> steps;
  if (n == 1) return Topology(1, {identity()});
  switch (config.kind) {
    case TopologyKind::kComplete: {
      std::vector<int> all(n);
      for (int r = 0; r < n; ++r) all[r] = r;
      steps.push_back({all});
      break;
    }
    case TopologyKind::kRing: {
      TopologyStep even, odd;
      for (int i = 0; i < n; i += 2) even.push_back({i, i + 1});
      for (int i = 1; i < n; i += 2) odd.push_back({i, (i + 1) % n});
      steps.push_back(even);
      if (n > 2) steps.push_back(odd);
      break;
    }
    case TopologyKind::kOnePeerExponential:
      for (int k = 0; k < Log2(n); ++k) {
        steps.push_back(xor_pairs(n, 1 << k, [](int i) { return i; }));
      }
      break;
    case TopologyKind::kAlternatingExponentialRing: {
      const int local = config.local_world_size;
      const int nodes = n / local;
      TopologyStep intra;
      for (int a = 0; a < nodes; ++a) {
        std::vector<int> node;
        for (int l = 0; l < local; ++l) node.push_back(a * local + l);
        intra.push_back(node);
      }
      if (nodes == 1) {
        steps.push_back(intra);
        break;
      }
      for (int k = 0; k < Log2(nodes); ++k) {
        TopologyStep inter;
        for (int l = 0; l < local; ++l) {
          for (auto& pair : xor_pairs(nodes, 1 << k, [&](int a) { return a * local + l; })) {
            inter.push_back(pair);
          }
        }
        if (local > 1) steps.push_back(intra);
        steps.push_back(inter);
      }
      break;
    }
    case TopologyKind::kCustom:
      steps = config.custom_steps;
      break;
  }
  return Topology(n, std::move(steps));
}

std::vector<double> Topology::MixingMatrix(int64_t t) const {
  std::vector<double> w(static_cast<size_t>(world_size_) * world_size_, 0.0);
  for (const auto& group : Step(t)) {
    for (int i : group) {
      for (int j : group) w[static_cast<size_t>(i) * world_size_ + j] = 1.0 / group.size();
    }
  }
  return w;
}

}  // namespace chorus
