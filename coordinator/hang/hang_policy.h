// Hang policy: what the coordinator does with the hang detector's diagnoses
// of a running job (hang_detector.h diagnoses; this decides).
//
// DiagnosisHistory remembers when each current diagnosis was first seen, so
// that a diagnosis becomes a job event once, when it appears, and another
// ("cleared: ...") when it goes away. HangFailure says whether the job's
// hang_detection.action fails the job for them: ABORT fails it with the
// first diagnosis that is not a warning (STRAGGLER, NODE_SLOW); REPORT never does.
// RESTART of an elastic job never comes here: the Scheduler evicts a DEAD
// or NEVER_JOINED rank and re-forms every rank's transport after a MISMATCH
// or STUCK_IN_COLLECTIVE (Note [Hang restart] in
// coordinator/scheduling/hang_restart.h).
// RESTART of a job without an elastic block fails it as ABORT does, and
// the reason says that RESTART needs one.
//
// Thread-safety: none; the Scheduler holds its lock around every call.
//
// Example:
//   std::vector<v1::Diagnosis> now = DiagnoseHangs(spec, views, clock.Now());
//   for (v1::JobEvent& e : history.Update(now, clock.Now())) jobs.AddEvent(id, e);
//   if (auto reason = HangFailure(spec.action(), now)) Fail(id, *reason);
#ifndef CHORUS_COORDINATOR_HANG_HANG_POLICY_H_
#define CHORUS_COORDINATOR_HANG_HANG_POLICY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"

namespace chorus {

// Identifies "the same problem" across ticks: kind, culprits and collective,
// e.g. "MISMATCH ranks 0,1 at #12".
std::string DiagnosisKey(const v1::Diagnosis& diagnosis);

class DiagnosisHistory {
 public:
  // Sets each of `current`'s first_seen_us (now for a new one) and makes
  // them the remembered set. Returns the job events to record: one per new
  // diagnosis, one per remembered diagnosis that is gone.
  std::vector<v1::JobEvent> Update(std::vector<v1::Diagnosis>& current, absl::Time now);
  // Sets first_seen_us as Update would, remembering nothing (for status).
  void Annotate(std::vector<v1::Diagnosis>& current, absl::Time now) const;

 private:
  std::map<std::string, int64_t> seen_us_;  // first seen, by DiagnosisKey
};

// The reason to fail the job for under `action`, or nullopt to keep it.
// REQUIRES: for RESTART, a job without an elastic block.
std::optional<std::string> HangFailure(v1::HangDetectionSpec::Action action,
                                       const std::vector<v1::Diagnosis>& diagnoses);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_HANG_HANG_POLICY_H_
