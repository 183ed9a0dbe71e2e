#include "common/metrics_text.h"

#include "absl/strings/str_format.h"

namespace chorus {

std::string EvaluationText(const v1::Metrics& metrics) {
  if (!metrics.has_eval_loss()) return "no evaluation";
  if (!metrics.has_eval_accuracy()) return absl::StrFormat("test loss %.4f", metrics.eval_loss());
  return absl::StrFormat("test accuracy %.4f, test loss %.4f", metrics.eval_accuracy(),
                         metrics.eval_loss());
}

}  // namespace chorus
