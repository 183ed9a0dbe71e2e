// How a job's evaluation reads in one line, for the rank's last log line and
// `chorus up`'s summary: "test accuracy 0.8891, test loss 0.3120", "test loss
// 1.2034" for a model without classes, or "no evaluation" when the job did
// not evaluate (eval.disabled, or no test split) — never zeros that look
// like results.
//
// Thread-safety: a plain function.
//
// Example:
//   std::cerr << job_id << ": done, " << EvaluationText(metrics) << "\n";
#ifndef CHORUS_COMMON_METRICS_TEXT_H_
#define CHORUS_COMMON_METRICS_TEXT_H_

#include <string>

#include "chorus/v1/coordinator.pb.h"

namespace chorus {

std::string EvaluationText(const v1::Metrics& metrics);

}  // namespace chorus

#endif  // CHORUS_COMMON_METRICS_TEXT_H_
