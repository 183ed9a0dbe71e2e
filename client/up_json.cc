#include "client/up_json.h"

#include "absl/strings/str_cat.h"
#include "common/json.h"

namespace chorus::client {

std::string UpJsonLine(const v1::Job& job) {
  const v1::Metrics& m = job.latest_metrics();
  auto it = m.values().find("wall_seconds");
  const double wall_seconds = it == m.values().end() ? 0.0 : it->second;
  return absl::StrCat("{\"job_id\": ", JsonString(job.job_id()),
                      ", \"state\": ", JsonString(v1::Job::State_Name(job.state())),
                      ", \"reason\": ", JsonString(job.reason()),
                      ", \"final_metrics\": {\"test_accuracy\": ", JsonNumber(m.eval_accuracy(), 6),
                      ", \"test_loss\": ", JsonNumber(m.eval_loss(), 6),
                      ", \"train_loss\": ", JsonNumber(m.loss(), 6), ", \"steps\": ", m.step(),
                      ", \"samples_per_second\": ", JsonNumber(m.samples_per_second(), 2),
                      ", \"wall_seconds\": ", JsonNumber(wall_seconds, 3), "}}");
}

}  // namespace chorus::client
