// FairShare: each user's recent usage in slot-seconds, decayed so that it
// halves every half-life (the policy's fair_share_half_life). The queue
// plan (queue_plan.h) puts, within a priority, the user with the least
// usage first.
//
// Usage is integrated exactly for slots held at a constant count between two
// calls: s slots held for t with half-life h add s * h / ln 2 * (1 - 2^(-t/h))
// on top of the old usage times 2^(-t/h). The caller passes, at each call,
// the slots every user has held since the previous one.
//
// Thread-safety: not thread-safe; the scheduler calls it under its lock.
//
// Example:
//   FairShare share(absl::Hours(1), clock.Now());
//   share.Advance(clock.Now(), {{"alice", 8}});
//   double alice = share.usage().at("alice");
#ifndef CHORUS_COORDINATOR_SCHEDULING_FAIR_SHARE_H_
#define CHORUS_COORDINATOR_SCHEDULING_FAIR_SHARE_H_

#include <map>
#include <string>

#include "absl/time/time.h"

namespace chorus {

class FairShare {
 public:
  FairShare(absl::Duration half_life, absl::Time now);

  // Decays every user's usage to `now` and adds the slot-seconds of
  // `slots_held` (per owner) since the previous call. A `now` before the
  // previous call counts as no time.
  void Advance(absl::Time now, const std::map<std::string, int>& slots_held);
  // Per owner; owners whose usage decayed below a thousandth of a
  // slot-second are dropped.
  const std::map<std::string, double>& usage() const { return usage_; }

 private:
  absl::Duration half_life_;
  absl::Time last_;
  std::map<std::string, double> usage_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_FAIR_SHARE_H_
