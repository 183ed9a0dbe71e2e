// SchedulingPolicy: the administrator's limits per user (slots in use per
// device, queued jobs, highest priority) and the fair-share half-life, read
// from the coordinator's --scheduling_policy file (docs/scheduling.md).
//
// The file is plain text, one statement a line; '#' starts a comment:
//   fair_share_half_life 1h
//   default cpu_slots=16 cuda_slots=4 queued_jobs=100 max_priority=NORMAL
//   user alice cpu_slots=8 max_priority=HIGH
// A `user` line overrides the `default` line's settings it names; a setting
// neither names is unlimited (max_priority: HIGH). Jobs without an owner
// (a coordinator without a token file) count as one user, "anonymous",
// with the default limits.
//
// Thread-safety: a value type; const methods may be called concurrently.
//
// Example:
//   ASSIGN_OR_RETURN(SchedulingPolicy policy, LoadSchedulingPolicy(path));
//   const UserLimits& limits = policy.For(job.owner());
#ifndef CHORUS_COORDINATOR_SCHEDULING_SCHEDULING_POLICY_H_
#define CHORUS_COORDINATOR_SCHEDULING_SCHEDULING_POLICY_H_

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "chorus/v1/job.pb.h"

namespace chorus {

// What one user may have.
struct UserLimits {
  // Slots of a device the user's running jobs may hold at once; a device
  // absent here is unlimited.
  std::map<v1::ResourceSpec::Device, int> max_slots;
  // PENDING jobs the user may have; one more submission is refused.
  std::optional<int> max_queued_jobs;
  // The highest priority the user's jobs may ask for; higher is refused.
  v1::JobSpec::Priority max_priority = v1::JobSpec::HIGH;
};

struct SchedulingPolicy {
  UserLimits defaults;
  std::map<std::string, UserLimits> users;  // by owner name
  // A user's usage (slot-seconds) halves over this long (fair share).
  absl::Duration fair_share_half_life = absl::Hours(1);

  // `owner`'s limits ("" is the anonymous user: the defaults).
  const UserLimits& For(const std::string& owner) const;
};

// The owner's name in messages: "" is "anonymous".
std::string OwnerName(const std::string& owner);
// A spec's priority with PRIORITY_UNSPECIFIED read as NORMAL.
v1::JobSpec::Priority PriorityOf(const v1::JobSpec& spec);
// "LOW", "NORMAL", "HIGH".
std::string PriorityName(v1::JobSpec::Priority priority);

// Parses the text of a policy file; errors name `file`:line and the setting.
absl::StatusOr<SchedulingPolicy> ParseSchedulingPolicy(absl::string_view text,
                                                       absl::string_view file);
// Reads and parses `path`.
absl::StatusOr<SchedulingPolicy> LoadSchedulingPolicy(const std::string& path);

// Whether `owner` may submit `spec` now, holding `queued` PENDING jobs:
// PERMISSION_DENIED above the user's max_priority, RESOURCE_EXHAUSTED at
// max_queued_jobs, each saying what the policy allows.
absl::Status CheckSubmission(const SchedulingPolicy& policy, const std::string& owner,
                             const v1::JobSpec& spec, int queued);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_SCHEDULING_POLICY_H_
