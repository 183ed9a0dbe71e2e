// Following a job until it ends, with a progress line, for `chorus up` and
// `chorus submit --wait`.
#ifndef CHORUS_CLIENT_FOLLOW_H_
#define CHORUS_CLIENT_FOLLOW_H_

#include <string>

#include "absl/status/statusor.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "client/commands.h"

namespace chorus::client {

// Catches SIGINT/SIGTERM from now on; Interrupted() reports whether one came.
void CatchInterrupts();
bool Interrupted();

struct FollowResult {
  v1::Job job;  // the job as last seen
  bool interrupted = false;
};

// Polls the job every 250 ms, printing a progress line on global.err whenever
// the step changes (rewritten in place on a terminal), until it ends or the
// user interrupts. On interrupt, cancels the job first if `cancel_on_interrupt`
// and follows it to its end; otherwise returns at once.
absl::StatusOr<FollowResult> FollowJob(v1::JobService::Stub& stub, const GlobalOptions& global,
                                       const std::string& job_id, bool cancel_on_interrupt);

// "job-000001 RUNNING step 120/2340 epoch 0 loss 0.5123 test acc 0.8012 24000 samples/s"
// A program job's line has only what its program reported ("job-000001
// RUNNING step 40 loss 0.5000", or "job-000001 RUNNING" for one that
// reports nothing).
std::string ProgressLine(const v1::Job& job);

// Exit code for a finished job: 0 SUCCEEDED, 1 otherwise; 130 if interrupted.
int ExitCodeFor(const FollowResult& result);

}  // namespace chorus::client

#endif  // CHORUS_CLIENT_FOLLOW_H_
