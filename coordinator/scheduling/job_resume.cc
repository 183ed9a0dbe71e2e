#include "coordinator/scheduling/job_resume.h"

#include "absl/status/status.h"
#include "glog/logging.h"

namespace chorus {

absl::StatusOr<v1::CheckpointManifest> JobResume::ForStart(
    const v1::Job& job, std::vector<std::string>* skipped) const {
  if (job.resume_from().empty()) return v1::CheckpointManifest();
  if (!resolve_) return absl::UnimplementedError("this coordinator keeps no checkpoints");
  return resolve_(job.resume_from(), skipped);
}

v1::CheckpointManifest JobResume::ForGeneration(const std::string& job_id,
                                                const RunningJob& run) const {
  const Resolver& newest_of = newest_committed_ ? newest_committed_ : resolve_;
  if (run.program || run.generation() <= 1 || !newest_of) return run.resume();
  std::vector<std::string> skipped;
  absl::StatusOr<v1::CheckpointManifest> newest = newest_of(job_id, &skipped);
  for (const std::string& warning : skipped) LOG(WARNING) << job_id << ": " << warning;
  return newest.ok() ? *std::move(newest) : run.resume();
}

int64_t JobResume::NewestStep(const std::string& job_id) const {
  if (!resolve_) return 0;
  std::vector<std::string> skipped;  // placement warns about them, once
  absl::StatusOr<v1::CheckpointManifest> newest = resolve_(job_id, &skipped);
  return newest.ok() ? newest->step() : 0;
}

}  // namespace chorus
