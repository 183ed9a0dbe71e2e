// Elastic programs: what a user's training loop needs to live through a
// re-formed generation (docs/elastic.md, docs/sdk.md "Elastic programs").
// When a member of an elastic job is lost or the coordinator plans a change,
// the survivors keep their processes: each aborts its communicator, joins the
// next generation (Session::JoinNextGeneration builds a new communicator),
// and then every member — newcomers started for the new generation included
// — agrees on the newest state any of them holds and takes it from the
// lowest rank holding it, over the new communicator (ShareNewestTensors).
// Decentralized (gossip) programs, whose replicas differ, start every member
// from the mean of what the survivors held instead (AverageHeldTensors).
//
// Thread-safety: the functions here are sequences of collectives: every
// member of the communicator calls them at the same point, from one thread.
//
// Example (a survivor and a newcomer run the same code):
//   std::vector<chorus::NamedTensor> state = ...;  // parameters, optimizer state, position
//   int64_t held = newcomer ? -1 : step;
//   ASSIGN_OR_RETURN(chorus::SharedTensors shared,
//                    chorus::ShareNewestTensors(comm, held, state, absl::Now() +
//                    absl::Minutes(1)));
//   step = shared.step;  // every member now holds the tensors of that step
#ifndef CHORUS_SDK_ELASTIC_H_
#define CHORUS_SDK_ELASTIC_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chorus/communicator.h"
#include "chorus/named_tensor.h"

namespace chorus {

// Whether a collective's failure means the generation is gone and, in an
// elastic job, the rank should join the next one: a peer was lost
// (UNAVAILABLE), the communicator was aborted because the coordinator
// formed a new generation (ABORTED), or an op timed out (DEADLINE_EXCEEDED).
bool IsMembershipLost(const absl::Status& status);

struct SharedTensors {
  // The step every member now holds: the newest `held_step` of any member,
  // or -1 when none held any (then rank 0's tensors were taken).
  int64_t step = -1;
  int source = 0;     // the rank whose tensors every member now holds
  int64_t bytes = 0;  // what was broadcast
};

// Agrees on the newest `held_step` among the members (-1: this member holds
// nothing, a newcomer) and copies the tensors of the lowest rank holding it
// into every member's `tensors`, in place (values only; shapes, dtypes and
// the autograd flags stay). Every member passes the same names, shapes and
// dtypes in the same order: INVALID_ARGUMENT says they differ (a mismatch
// found by a checksum of the list, so it cannot name the tensor). A failed
// collective's status otherwise.
absl::StatusOr<SharedTensors> ShareNewestTensors(Communicator& comm, int64_t held_step,
                                                 const std::vector<NamedTensor>& tensors,
                                                 absl::Time deadline);

// For decentralized training, after ShareNewestTensors of the rest of the
// state: replaces every floating-point tensor of `tensors` on every member
// by the mean over the members that `held` theirs (newcomers pass false and
// add nothing). Sums are taken in double precision and rounded once, so all
// members end with the same bits. Returns how many members were averaged;
// FAILED_PRECONDITION when none held any; INVALID_ARGUMENT as above.
absl::StatusOr<int> AverageHeldTensors(Communicator& comm, bool held,
                                       const std::vector<NamedTensor>& tensors,
                                       absl::Time deadline);

}  // namespace chorus

#endif  // CHORUS_SDK_ELASTIC_H_
