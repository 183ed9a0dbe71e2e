#include "coordinator/http/status_page.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/json.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"

namespace chorus {
namespace {

double Seconds(int64_t time_us) { return static_cast<double>(time_us) / 1e6; }

double Value(const v1::Metrics& metrics, const std::string& name) {
  auto it = metrics.values().find(name);
  return it != metrics.values().end() ? it->second : 0;
}

// JSON inside <script>: "</script" would end the element early and "<!--"
// would switch the parser into its comment-like script states. '<', '>' and
// '&' only occur inside JSON strings, where \uXXXX stands for them: the
// result is still valid JSON that parses back to the same text.
std::string ForScript(absl::string_view json) {
  return absl::StrReplaceAll(json, {{"<", "\\u003c"}, {">", "\\u003e"}, {"&", "\\u0026"}});
}

std::string HtmlEscape(absl::string_view text) {
  return absl::StrReplaceAll(
      text, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}, {"'", "&#39;"}});
}

std::string Page(absl::string_view title, absl::string_view kind, absl::string_view body_data,
                 absl::string_view json) {
  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<title>",
      HtmlEscape(title),
      "</title><link rel=\"stylesheet\" href=\"/assets/uplot.css\">"
      "<link rel=\"stylesheet\" href=\"/assets/page.css\"></head>\n<body data-page=\"",
      kind, "\"", body_data,
      "><header><a href=\"/\">Chorus</a> <span id=\"title\"></span>"
      "<span id=\"refreshed\"></span></header><main id=\"main\"></main>\n"
      "<script id=\"initial\" type=\"application/json\">",
      ForScript(json),
      "</script>\n<script src=\"/assets/uplot.js\"></script>"
      "<script src=\"/assets/page.js\"></script></body></html>\n");
}

std::string DiagnosisText(const v1::Diagnosis& d) {
  return absl::StrCat(v1::Diagnosis::Kind_Name(d.kind()), " ", d.message());
}

// The queue in placement order (at most kPageMaxJobs rows).
std::string QueueJson(const v1::GetQueueResponse& queue) {
  std::vector<std::string> rows;
  for (const v1::QueuedJobInfo& job : queue.jobs()) {
    if (static_cast<int>(rows.size()) == kPageMaxJobs) break;
    rows.push_back(absl::StrCat(
        "{\"position\":", rows.size() + 1, ",\"job_id\":", JsonString(job.job_id()),
        ",\"name\":", JsonString(job.name()), ",\"owner\":", JsonString(job.owner()),
        ",\"priority\":", JsonString(v1::JobSpec::Priority_Name(job.priority())),
        ",\"min_ranks\":", job.min_ranks(), ",\"device\":", JsonString(DeviceName(job.device())),
        ",\"reason\":", JsonString(job.reason()),
        ",\"holds_reservation\":", job.holds_reservation() ? "true" : "false", "}"));
  }
  return absl::StrCat("[", absl::StrJoin(rows, ","), "]");
}

// Every user of the snapshot: slots per device, jobs, fair-share usage.
std::string UsersJson(const ClusterSnapshot& snapshot) {
  std::vector<std::string> rows;
  for (const auto& [owner, user] : snapshot.users) {
    std::vector<std::string> slots;
    for (const auto& [device, count] : user.slots_in_use) {
      slots.push_back(absl::StrCat(JsonString(DeviceName(device)), ":", count));
    }
    rows.push_back(absl::StrCat(
        "{\"user\":", JsonString(owner), ",\"slots\":{", absl::StrJoin(slots, ","),
        "},\"running_jobs\":", user.running_jobs, ",\"queued_jobs\":", user.queued_jobs,
        ",\"fair_share_slot_seconds\":", JsonNumber(user.fair_share_slot_seconds, 1), "}"));
  }
  return absl::StrCat("[", absl::StrJoin(rows, ","), "]");
}

}  // namespace

std::string JobListJson(const StatusPageSources& sources, absl::Time now) {
  std::vector<std::string> rows;
  ClusterSnapshot running;
  sources.scheduler->reads().Snapshot(running, /*max_rank_rows=*/0);
  std::map<std::string, const v1::JobStatus*> by_id;
  for (const v1::JobStatus& s : running.running) by_id[s.job().job_id()] = &s;
  absl::StatusOr<std::vector<v1::Job>> jobs = sources.jobs->List({}, kPageMaxJobs);
  if (!jobs.ok()) LOG(ERROR) << "listing jobs for the status page: " << jobs.status();
  for (const v1::Job& job : jobs.ok() ? *jobs : std::vector<v1::Job>{}) {
    const v1::Metrics& m = job.latest_metrics();
    int64_t step = m.step();
    int diagnoses = 0;
    if (auto it = by_id.find(job.job_id()); it != by_id.end()) {
      step = std::max(step, it->second->rank_summary().max_step());
      diagnoses = it->second->diagnoses_size();
    }
    const double total = Value(m, "total_steps");
    const double progress = total > 0 ? std::min(1.0, static_cast<double>(step) / total) : -1;
    const double eta =
        job.state() == v1::Job::RUNNING && total > 0 && m.step_time_seconds() > 0
            ? std::max(0.0, total - static_cast<double>(step)) * m.step_time_seconds()
            : -1;
    const double age = absl::ToDoubleSeconds(now - absl::FromUnixMicros(job.submit_time_us()));
    rows.push_back(absl::StrCat(
        "{\"job_id\":", JsonString(job.job_id()), ",\"name\":", JsonString(job.spec().name()),
        ",\"owner\":", JsonString(job.owner()),
        ",\"state\":", JsonString(v1::Job::State_Name(job.state())), ",\"step\":", step,
        ",\"total_steps\":", JsonNumber(total, 0), ",\"progress\":", JsonNumber(progress, 4),
        ",\"eta_seconds\":", JsonNumber(eta, 1), ",\"age_seconds\":", JsonNumber(age, 1),
        ",\"samples_per_second\":", JsonNumber(m.samples_per_second(), 1),
        ",\"world_size\":", job.world_size(), ",\"diagnoses\":", diagnoses,
        ",\"reason\":", JsonString(job.reason()), "}"));
  }
  return absl::StrCat("{\"jobs\":[", absl::StrJoin(rows, ","),
                      "],\"queue\":", QueueJson(sources.scheduler->reads().Queue()),
                      ",\"users\":", UsersJson(running), "}");
}

namespace {

// The job's metrics events (thinned to kPageMaxHistory points, the last
// kept) into `history`, and its newest other events into `events`.
void EventsJson(const std::vector<v1::JobEvent>& all, std::vector<std::string>& history,
                std::vector<std::string>& events) {
  std::vector<const v1::JobEvent*> metrics, others;
  for (const v1::JobEvent& e : all) (e.has_metrics() ? metrics : others).push_back(&e);
  const size_t stride = metrics.size() / kPageMaxHistory + 1;
  for (size_t i = 0; i < metrics.size(); ++i) {
    if (i % stride != 0 && i + 1 != metrics.size()) continue;
    const v1::Metrics& m = metrics[i]->metrics();
    history.push_back(absl::StrCat(
        "{\"step\":", m.step(), ",\"time_s\":", JsonNumber(Seconds(metrics[i]->time_us()), 3),
        ",\"loss\":", JsonNumber(m.loss(), 6), ",\"eval_loss\":", JsonNumber(m.eval_loss(), 6),
        ",\"eval_accuracy\":", JsonNumber(m.eval_accuracy(), 6),
        ",\"samples_per_second\":", JsonNumber(m.samples_per_second(), 2), "}"));
  }
  const size_t first = others.size() > kPageMaxEvents ? others.size() - kPageMaxEvents : 0;
  for (size_t i = first; i < others.size(); ++i) {
    const v1::JobEvent& e = *others[i];
    std::string text;
    if (e.has_diagnosis()) {
      text = absl::StrCat("diagnosis: ", DiagnosisText(e.diagnosis()));
    } else if (e.kind_case() == v1::JobEvent::kState) {
      text = absl::StrCat("state ", v1::Job::State_Name(e.state()),
                          e.reason().empty() ? "" : absl::StrCat(": ", e.reason()));
    } else {
      text = e.message();
    }
    events.push_back(absl::StrCat("{\"time_s\":", JsonNumber(Seconds(e.time_us()), 3),
                                  ",\"text\":", JsonString(text), "}"));
  }
}

std::vector<std::string> CheckpointsJson(const StatusPageSources& sources,
                                         const std::string& job_id) {
  std::vector<std::string> checkpoints;
  if (sources.checkpoints == nullptr) return checkpoints;
  absl::StatusOr<std::vector<v1::CheckpointManifest>> list = sources.checkpoints->List(job_id);
  if (!list.ok()) return checkpoints;
  for (const v1::CheckpointManifest& m : *list) {
    int64_t bytes = 0;
    for (const v1::CheckpointFile& f : m.files()) bytes += f.size();
    checkpoints.push_back(absl::StrCat("{\"step\":", m.step(),
                                       ",\"time_s\":", JsonNumber(Seconds(m.commit_time_us()), 3),
                                       ",\"bytes\":", bytes, "}"));
  }
  return checkpoints;
}

// The newest kPageMaxLogLines lines of the job's ranks.
std::vector<std::string> LogsJson(const StatusPageSources& sources, const std::string& job_id) {
  std::vector<std::string> logs;
  v1::GetLogsRequest request;
  request.set_job_id(job_id);
  request.set_tail(true);
  request.set_max_lines(kPageMaxLogLines);
  if (absl::StatusOr<v1::GetLogsResponse> lines = sources.scheduler->reads().GetLogs(request);
      lines.ok()) {
    for (const v1::LogLine& line : lines->lines()) {
      logs.push_back(
          absl::StrCat("{\"rank\":", line.rank(), ",\"text\":", JsonString(line.text()), "}"));
    }
  }
  return logs;
}

}  // namespace

absl::StatusOr<std::string> JobPageJson(const StatusPageSources& sources, const std::string& job_id,
                                        absl::Time now, int rank_offset, int rank_limit) {
  absl::StatusOr<v1::JobStatus> status = sources.jobs->Status(job_id);
  if (!status.ok()) return status.status();
  status->mutable_job()->clear_placements();  // the rows say where ranks run
  StatusRows rows;
  rows.offset = rank_offset;
  rows.limit = rank_limit;
  sources.scheduler->reads().FillStatus(job_id, *status, rows);
  // The spec is the user's to read with `chorus status`; the page needs its name.
  v1::JobSpec spec = status->job().spec();
  status->mutable_job()->clear_spec();
  status->mutable_job()->mutable_spec()->set_name(spec.name());
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string status_json;
  if (!google::protobuf::util::MessageToJsonString(*status, &status_json, options).ok()) {
    return absl::InternalError(absl::StrCat("job ", job_id, ": cannot write its status as JSON"));
  }
  std::vector<std::string> history, events;
  if (absl::StatusOr<std::vector<v1::JobEvent>> all = sources.jobs->Events(job_id, 0); all.ok()) {
    EventsJson(*all, history, events);
  }
  return absl::StrCat("{\"status\":", status_json,
                      ",\"now_s\":", JsonNumber(absl::ToDoubleSeconds(now - absl::UnixEpoch()), 3),
                      ",\"history\":[", absl::StrJoin(history, ","), "],\"events\":[",
                      absl::StrJoin(events, ","), "],\"checkpoints\":[",
                      absl::StrJoin(CheckpointsJson(sources, job_id), ","), "],\"logs\":[",
                      absl::StrJoin(LogsJson(sources, job_id), ","), "]}");
}

std::string JobListHtml(absl::string_view json) { return Page("Chorus jobs", "jobs", "", json); }

std::string JobPageHtml(const std::string& job_id, absl::string_view json) {
  return Page(absl::StrCat(job_id, " - Chorus"), "job",
              absl::StrCat(" data-job=\"", HtmlEscape(job_id), "\""), json);
}

std::string NotFoundHtml(absl::string_view what) {
  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Not found - "
      "Chorus</title><link rel=\"stylesheet\" href=\"/assets/page.css\"></head><body>"
      "<header><a href=\"/\">Chorus</a></header><main><h1>Not found</h1><p id=\"not-found\">",
      HtmlEscape(what), "</p><p><a href=\"/\">All jobs</a></p></main></body></html>\n");
}

}  // namespace chorus
