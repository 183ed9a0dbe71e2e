#include "coordinator/http/status_routes.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/json.h"
#include "coordinator/http/status_page.h"

namespace chorus {
namespace {

HttpResponse Asset(const char* content_type, const char* body) {
  return HttpResponse{200, content_type, body};
}

// The job id of "/jobs/ID" or "/api/jobs/ID" (after `prefix`); empty when
// the path has more segments.
std::string JobIdAfter(const std::string& path, absl::string_view prefix) {
  std::string id = path.substr(prefix.size());
  return id.find('/') == std::string::npos ? id : "";
}

// The rank rows a job page asks for: ?rank_offset=N&rank_limit=M (a
// limit of 0, missing or unreadable: kDefaultStatusRankRows).
std::pair<int, int> RankRows(const HttpRequest& request) {
  int offset = 0, limit = 0;
  if (auto it = request.params.find("rank_offset"); it != request.params.end()) {
    if (!absl::SimpleAtoi(it->second, &offset)) offset = 0;
  }
  if (auto it = request.params.find("rank_limit"); it != request.params.end()) {
    if (!absl::SimpleAtoi(it->second, &limit)) limit = 0;
  }
  return {std::max(0, offset), limit > 0 ? limit : kDefaultStatusRankRows};
}

}  // namespace

ClusterSnapshot TakeSnapshot(const StatusSources& sources) {
  ClusterSnapshot snapshot;
  snapshot.jobs_by_state = sources.jobs->CountByState();
  sources.scheduler->reads().Snapshot(snapshot, sources.metrics->max_rank_series());
  snapshot.failed = sources.jobs->NewestFailed(sources.metrics->max_failed_series());
  return snapshot;
}

std::vector<HttpRoute> StatusRoutes(const StatusSources& sources) {
  const StatusPageSources page{sources.jobs, sources.scheduler, sources.checkpoints};
  std::vector<HttpRoute> routes;
  routes.push_back({"/metrics", false, [sources](const HttpRequest&) {
                      HttpResponse response;
                      response.content_type = "text/plain; version=0.0.4; charset=utf-8";
                      response.body = sources.metrics->Render(TakeSnapshot(sources));
                      if (sources.extra_metrics) response.body += sources.extra_metrics();
                      return response;
                    }});
  routes.push_back({"/", false, [page](const HttpRequest&) {
                      return HttpResponse{200, kHtml, JobListHtml(JobListJson(page, absl::Now()))};
                    }});
  routes.push_back({"/api/jobs", false, [page](const HttpRequest&) {
                      return HttpResponse{200, kJson, JobListJson(page, absl::Now())};
                    }});
  routes.push_back(
      {"/api/jobs/", true, [page](const HttpRequest& request) {
         const std::string id = JobIdAfter(request.path, "/api/jobs/");
         const auto [offset, limit] = RankRows(request);
         absl::StatusOr<std::string> json = JobPageJson(page, id, absl::Now(), offset, limit);
         if (!json.ok()) {
           return HttpResponse{404, kJson,
                               absl::StrCat("{\"error\":", JsonString("no job " + id), "}")};
         }
         return HttpResponse{200, kJson, *std::move(json)};
       }});
  routes.push_back(
      {"/jobs/", true, [page](const HttpRequest& request) {
         const std::string id = JobIdAfter(request.path, "/jobs/");
         const auto [offset, limit] = RankRows(request);
         absl::StatusOr<std::string> json = JobPageJson(page, id, absl::Now(), offset, limit);
         if (!json.ok()) {
           return HttpResponse{
               404, kHtml,
               NotFoundHtml(absl::StrCat("There is no job \"", id, "\" on this coordinator."))};
         }
         return HttpResponse{200, kHtml, JobPageHtml(id, *json)};
       }});
  routes.push_back({"/assets/page.js", false, [](const HttpRequest&) {
                      return Asset("text/javascript; charset=utf-8", kStatusPageJs);
                    }});
  routes.push_back({"/assets/page.css", false, [](const HttpRequest&) {
                      return Asset("text/css; charset=utf-8", kStatusPageCss);
                    }});
  routes.push_back({"/assets/uplot.js", false, [](const HttpRequest&) {
                      return Asset("text/javascript; charset=utf-8", kUplotJs);
                    }});
  routes.push_back({"/assets/uplot.css", false, [](const HttpRequest&) {
                      return Asset("text/css; charset=utf-8", kUplotCss);
                    }});
  return routes;
}

}  // namespace chorus
