// JobResume: which checkpoint a job's ranks start from, through the two
// resolvers the coordinator was configured with (SchedulerOptions): one that
// resolves a job's resume_from ("JOB" or "JOB:STEP") and checks what it
// finds, and one that names a job's newest committed checkpoint without
// reading its files.
//
// Thread-safety: const methods; the resolvers must be safe to call from the
// thread that asks (the Scheduler asks under its lock).
//
// Example:
//   JobResume resume(resolver, newest_committed);
//   std::vector<std::string> skipped;
//   absl::StatusOr<v1::CheckpointManifest> from = resume.ForStart(job, &skipped);
#ifndef CHORUS_COORDINATOR_SCHEDULING_JOB_RESUME_H_
#define CHORUS_COORDINATOR_SCHEDULING_JOB_RESUME_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "chorus/v1/coordinator.pb.h"
#include "coordinator/scheduling/running_job.h"

namespace chorus {

// Note [A generation's checkpoint]
// JoinResponse.resume names the checkpoint a rank starts from. The ranks of
// the first generation load it: the checkpoint the job was submitted to
// resume from, if any. The ranks of a later generation take the newest
// state one of them holds instead, and load the checkpoint only when none
// holds any (every rank that had completed a step was lost, or none had
// completed one yet): the generation then starts over from it, or from the
// seeded initial model without one (Note [Starting over] in
// worker/train/trainer.cc). So that it trains as few steps again as it
// can, a later generation of a built-in trainer job is told the job's own
// newest committed checkpoint, looked up when the generation forms (its
// manifest only, the newest_committed resolver: checksumming a large
// checkpoint under the scheduler's lock at every re-formation would stall
// every heartbeat and join meanwhile; the ranks check what they load), and
// the checkpoint it was submitted to resume from only while it has
// committed none. Every member is answered from that one lookup when the
// rendezvous completes, so all of them start over from the same state; a
// coordinator restart looks it up again (Recover). A program job's ranks
// are told the checkpoint it was submitted with in every generation: what
// to load is its program's choice (Session::resuming()).

class JobResume {
 public:
  // Resolves `resume_from` to the checkpoint it names; unusable checkpoints
  // it skipped go to `skipped`.
  using Resolver = std::function<absl::StatusOr<v1::CheckpointManifest>(
      const std::string& resume_from, std::vector<std::string>* skipped)>;

  // `resolve` empty: no checkpoints are kept (a job with resume_from
  // fails). `newest_committed` empty: `resolve` is asked for it.
  JobResume(Resolver resolve, Resolver newest_committed)
      : resolve_(std::move(resolve)), newest_committed_(std::move(newest_committed)) {}

  // The checkpoint `job` starts from: its resume_from's, or an empty
  // manifest without one. Checkpoints skipped on the way go to `skipped`.
  absl::StatusOr<v1::CheckpointManifest> ForStart(const v1::Job& job,
                                                  std::vector<std::string>* skipped) const;
  // What the ranks of `run`'s current generation are told to resume from
  // (Note [A generation's checkpoint]): for a later generation of the
  // built-in trainer the job's newest committed checkpoint, else
  // run.resume(). Checkpoints skipped on the way are logged.
  v1::CheckpointManifest ForGeneration(const std::string& job_id, const RunningJob& run) const;
  // The step of the job's newest committed checkpoint; 0 if none.
  int64_t NewestStep(const std::string& job_id) const;

 private:
  Resolver resolve_;
  Resolver newest_committed_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SCHEDULING_JOB_RESUME_H_
