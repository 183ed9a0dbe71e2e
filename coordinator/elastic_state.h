// Elastic state: the kinds of change that move an elastic job to its next
// generation (docs/elastic.md).
//
// Thread-safety: plain values and pure functions.
//
// Example:
//   ReformKind kind = ReformKind::kRankLost;
//   if (IsFailure(kind)) ++run.restarts;
//   metrics.GenerationStarted(std::string(ReformKindName(kind)));
#ifndef CHORUS_COORDINATOR_ELASTIC_STATE_H_
#define CHORUS_COORDINATOR_ELASTIC_STATE_H_

#include <optional>
#include <string_view>

namespace chorus {

// Why an elastic job changes generation.
enum class ReformKind {
  // Failures: they count against elastic.max_restarts.
  kRankLost,     // a rank exited with a non-zero code
  kAgentLost,    // the agent of a rank is gone
  kHangRestart,  // hang_detection.action RESTART with no rank to evict
  // Planned changes, at a step boundary: not restarts.
  kDrain,        // an agent the job runs on is drained
  kScaleUp,      // free slots let the job grow (or take replacements owed)
  kPreempt,      // a higher-priority job takes some of its ranks
};

// Whether a change of `kind` was not planned (counts as a restart).
bool IsFailure(ReformKind kind);

// The kind's name: the `cause` label of chorus_generations_total, and what
// the state database keeps (coordinator::ElasticRecord). These strings are
// part of the metrics and the saved records: never change one.
std::string_view ReformKindName(ReformKind kind);

// The kind ReformKindName names; nullopt for any other string (a record
// written by a newer coordinator, say).
std::optional<ReformKind> ParseReformKind(std::string_view name);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_ELASTIC_STATE_H_
