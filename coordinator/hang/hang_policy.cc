#include "coordinator/hang/hang_policy.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/hang/hang_detector.h"

namespace chorus {

std::string DiagnosisKey(const v1::Diagnosis& d) {
  return absl::StrCat(v1::Diagnosis::Kind_Name(d.kind()), " rank", d.ranks_size() > 1 ? "s " : " ",
                      absl::StrJoin(d.ranks(), ","),
                      d.seq() > 0 ? absl::StrCat(" at #", d.seq()) : "");
}

std::vector<v1::JobEvent> DiagnosisHistory::Update(std::vector<v1::Diagnosis>& current,
                                                   absl::Time now) {
  const int64_t now_us = absl::ToUnixMicros(now);
  std::vector<v1::JobEvent> events;
  std::map<std::string, int64_t> seen;
  for (v1::Diagnosis& d : current) {
    const std::string key = DiagnosisKey(d);
    auto before = seen_us_.find(key);
    const bool is_new = before == seen_us_.end();
    d.set_first_seen_us(is_new ? now_us : before->second);
    seen[key] = d.first_seen_us();
    if (is_new) *events.emplace_back().mutable_diagnosis() = d;
  }
  // Problems that went away become events too ("as they appear and clear").
  for (const auto& [key, since_us] : seen_us_) {
    if (seen.count(key)) continue;
    events.emplace_back().set_message(
        absl::StrCat("cleared: ", key, " (seen for ",
                     absl::StrFormat("%.1f", (now_us - since_us) / 1e6), " s)"));
  }
  seen_us_ = std::move(seen);
  return events;
}

void DiagnosisHistory::Annotate(std::vector<v1::Diagnosis>& current, absl::Time now) const {
  for (v1::Diagnosis& d : current) {
    auto seen = seen_us_.find(DiagnosisKey(d));
    d.set_first_seen_us(seen != seen_us_.end() ? seen->second : absl::ToUnixMicros(now));
  }
}

std::optional<std::string> HangFailure(v1::HangDetectionSpec::Action action,
                                       const std::vector<v1::Diagnosis>& diagnoses) {
  if (action != v1::HangDetectionSpec::ABORT && action != v1::HangDetectionSpec::RESTART)
    return std::nullopt;
  for (const v1::Diagnosis& d : diagnoses) {
    if (IsWarningOnly(d.kind())) continue;
    std::string reason =
        absl::StrCat("hang detection: ", v1::Diagnosis::Kind_Name(d.kind()), " ", d.message());
    if (action == v1::HangDetectionSpec::RESTART) {
      absl::StrAppend(&reason,
                      " (hang_detection.action RESTART needs an elastic block in the job spec "
                      "to re-form the job; without one it fails the job as ABORT does)");
    }
    return reason;
  }
  return std::nullopt;
}

}  // namespace chorus
