#include "coordinator/scheduling/elastic_state.h"

#include <utility>

#include "glog/logging.h"

namespace chorus {

namespace {

constexpr ReformKind kAllKinds[] = {ReformKind::kRankLost,    ReformKind::kAgentLost,
                                    ReformKind::kHangRestart, ReformKind::kDrain,
                                    ReformKind::kScaleUp,     ReformKind::kPreempt};

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

std::optional<absl::Time> ElasticPhase::started() const {
  if (const Forming* f = forming()) return f->started;
  if (const Waiting* w = waiting()) return w->started;
  if (const Restarting* r = restarting()) return r->started;
  return std::nullopt;
}

void ElasticPhase::BeginForming(ReformKind kind, absl::Time now, absl::Time deadline) {
  phase_ = Forming{kind, started().value_or(now), deadline};
  planned_.reset();
}

void ElasticPhase::BeginWaiting(std::string cause, ReformKind kind, absl::Time now,
                                absl::Time until) {
  CHECK(waiting() == nullptr) << "BeginWaiting while waiting";
  std::optional<Forming> unformed;
  if (const Forming* f = forming()) unformed = *f;
  phase_ = Waiting{std::move(cause), kind, started().value_or(now), until, std::move(unformed)};
}

void ElasticPhase::BeginRestarting(std::string cause, ReformKind kind, absl::Time now,
                                   absl::Time deadline) {
  CHECK(restarting() == nullptr) << "BeginRestarting while restarting";
  phase_ = Restarting{std::move(cause), kind, started().value_or(now), deadline};
}

std::optional<ElasticPhase::Forming> ElasticPhase::GenerationFormed() {
  if (const Forming* f = forming()) {
    Forming formed = *f;
    phase_ = Steady{};
    return formed;
  }
  if (Waiting* w = std::get_if<Waiting>(&phase_); w != nullptr && w->unformed.has_value()) {
    std::optional<Forming> formed = std::move(w->unformed);
    w->unformed.reset();
    return formed;
  }
  return std::nullopt;
}

bool ElasticPhase::Plan(Planned planned) {
  if (planned_.has_value() && planned_->kind == ReformKind::kDrain &&
      planned.kind != ReformKind::kDrain) {
    return false;
  }
  planned_ = std::move(planned);
  return true;
}

}  // namespace chorus
