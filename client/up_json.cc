#include "client/up_json.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/json.h"

namespace chorus::client {
namespace {

// The job's own measure if it sent one, else the coordinator's: start to end.
double WallSeconds(const v1::Job& job) {
  const v1::Metrics& m = job.latest_metrics();
  auto it = m.values().find("wall_seconds");
  if (it != m.values().end()) return it->second;
  if (job.start_time_us() > 0 && job.end_time_us() > job.start_time_us())
    return static_cast<double>(job.end_time_us() - job.start_time_us()) / 1e6;
  return 0.0;
}

// A program job's final_metrics: only what its program reported (zero is
// "never reported"), then wall_seconds when known.
std::string ProgramMetrics(const v1::Job& job) {
  const v1::Metrics& m = job.latest_metrics();
  std::string out;
  auto add = [&out](absl::string_view name, const std::string& value) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", "\"", name, "\": ", value);
  };
  if (m.has_eval_accuracy()) add("test_accuracy", JsonNumber(m.eval_accuracy(), 6));
  if (m.has_eval_loss()) add("test_loss", JsonNumber(m.eval_loss(), 6));
  if (m.loss() != 0) add("train_loss", JsonNumber(m.loss(), 6));
  if (m.step() > 0) add("steps", absl::StrCat(m.step()));
  if (m.samples_per_second() != 0) add("samples_per_second", JsonNumber(m.samples_per_second(), 2));
  const double wall_seconds = WallSeconds(job);
  if (wall_seconds > 0) add("wall_seconds", JsonNumber(wall_seconds, 3));
  return absl::StrCat("{", out, "}");
}

}  // namespace

std::string UpJsonLine(const v1::Job& job) {
  const v1::Metrics& m = job.latest_metrics();
  const std::string head =
      absl::StrCat("{\"job_id\": ", JsonString(job.job_id()),
                   ", \"state\": ", JsonString(v1::Job::State_Name(job.state())),
                   ", \"reason\": ", JsonString(job.reason()), ", \"final_metrics\": ");
  if (job.spec().has_program()) return absl::StrCat(head, ProgramMetrics(job), "}");
  // null where the job did not evaluate (eval.disabled, no test split).
  auto eval = [](bool has, double value) { return has ? JsonNumber(value, 6) : "null"; };
  // The reporting rank's peak resident memory, when its trainer measured it.
  auto peak = m.values().find("peak_rss_bytes");
  return absl::StrCat(
      head, "{\"test_accuracy\": ", eval(m.has_eval_accuracy(), m.eval_accuracy()),
      ", \"test_loss\": ", eval(m.has_eval_loss(), m.eval_loss()),
      ", \"train_loss\": ", JsonNumber(m.loss(), 6), ", \"steps\": ", m.step(),
      ", \"samples_per_second\": ", JsonNumber(m.samples_per_second(), 2),
      ", \"wall_seconds\": ", JsonNumber(WallSeconds(job), 3),
      peak == m.values().end()
          ? ""
          : absl::StrCat(", \"peak_rss_bytes\": ", static_cast<int64_t>(peak->second)),
      "}}");
}

}  // namespace chorus::client
