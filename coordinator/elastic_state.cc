#include "coordinator/elastic_state.h"

namespace chorus {

namespace {

constexpr ReformKind kAllKinds[] = {ReformKind::kRankLost, ReformKind::kAgentLost,
                                    ReformKind::kHangRestart, ReformKind::kDrain,
                                    ReformKind::kScaleUp, ReformKind::kPreempt};

}  // namespace

bool IsFailure(ReformKind kind) {
  switch (kind) {
    case ReformKind::kRankLost:
    case ReformKind::kAgentLost:
    case ReformKind::kHangRestart:
      return true;
    case ReformKind::kDrain:
    case ReformKind::kScaleUp:
    case ReformKind::kPreempt:
      return false;
  }
  return false;
}

std::string_view ReformKindName(ReformKind kind) {
  switch (kind) {
    case ReformKind::kRankLost:
      return "rank_lost";
    case ReformKind::kAgentLost:
      return "agent_lost";
    case ReformKind::kHangRestart:
      return "hang_restart";
    case ReformKind::kDrain:
      return "drain";
    case ReformKind::kScaleUp:
      return "scale_up";
    case ReformKind::kPreempt:
      return "preempt";
  }
  return "unknown";
}

std::optional<ReformKind> ParseReformKind(std::string_view name) {
  for (ReformKind kind : kAllKinds) {
    if (ReformKindName(kind) == name) return kind;
  }
  return std::nullopt;
}

}  // namespace chorus
