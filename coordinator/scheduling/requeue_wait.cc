#include "coordinator/scheduling/requeue_wait.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace chorus {

void RequeueWait::Begin(std::string cause, int64_t reported_step, int64_t newest_checkpoint,
                        absl::Time now, absl::Duration timeout) {
  CHECK(!wait_.has_value()) << "the job waits for its checkpoint already";
  RequeueWaitState& wait = wait_.emplace();
  wait.cause = std::move(cause);
  wait.reported_step = reported_step;
  wait.target_step = std::max(reported_step, newest_checkpoint + 1);
  wait.deadline = now + timeout;
  wait.timeout = timeout;
}

std::optional<RequeueWait::Due> RequeueWait::OnTick(int64_t newest_checkpoint, absl::Time now) {
  if (!wait_.has_value()) return std::nullopt;
  const bool committed = newest_checkpoint >= wait_->target_step;
  if (!committed && now < wait_->deadline) return std::nullopt;
  const std::string resumes = newest_checkpoint > 0
                                  ? absl::StrCat("resumes from step ", newest_checkpoint)
                                  : std::string("starts from scratch");
  Due due;
  due.resume_step = newest_checkpoint;
  due.reason = absl::StrCat(wait_->cause, "; ", resumes);
  if (!committed) {
    due.warning =
        absl::StrCat("warning: the checkpoint asked for (step ", wait_->target_step,
                     " or later) did not commit within ", absl::FormatDuration(wait_->timeout),
                     "; the job goes back to the queue anyway and ", resumes, ", losing ",
                     std::max<int64_t>(0, wait_->reported_step - newest_checkpoint), " step(s)");
  }
  wait_.reset();
  return due;
}

}  // namespace chorus
