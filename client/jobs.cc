// chorus jobs: the coordinator's jobs, newest first.

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "client/commands.h"
#include "client/rpc.h"
#include "common/grpc_util.h"
#include "common/status_macros.h"

namespace chorus::client {
namespace {

// Jobs a plain `chorus jobs` lists: a screenful, however long the history.
constexpr int kDefaultJobsLimit = 50;

// Up to `limit` jobs (0 = all) of `request`'s states, newest first, asking
// page after page; next_page_token is set when older jobs were left out.
absl::StatusOr<v1::ListJobsResponse> ListJobs(const GlobalOptions& global,
                                              v1::ListJobsRequest request, int limit) {
  v1::ListJobsResponse all;
  // Every page holds at least one job, so a history of N jobs takes at most
  // N pages; the bound only guards against a coordinator that loops.
  for (int page = 0; page < 1'000'000; ++page) {
    request.set_limit(limit == 0 ? 0 : limit - all.jobs_size());
    v1::ListJobsResponse response;
    grpc::ClientContext context;
    SetDeadline(context, global);
    RETURN_IF_ERROR(FromGrpcStatus(JobStub(global)->ListJobs(&context, request, &response)));
    for (v1::Job& job : *response.mutable_jobs()) *all.add_jobs() = std::move(job);
    all.set_next_page_token(response.next_page_token());
    if (response.next_page_token().empty() || response.jobs_size() == 0 ||
        (limit > 0 && all.jobs_size() >= limit)) {
      break;
    }
    request.set_page_token(response.next_page_token());
  }
  return all;
}

// Why each PENDING job of `listed` waits, from the coordinator's queue;
// empty when none is PENDING or the coordinator does not say (an older one).
std::map<std::string, std::string> WaitingReasons(const GlobalOptions& global,
                                                  const v1::ListJobsResponse& listed) {
  std::map<std::string, std::string> reasons;
  const bool any_pending =
      std::any_of(listed.jobs().begin(), listed.jobs().end(),
                  [](const v1::Job& job) { return job.state() == v1::Job::PENDING; });
  if (!any_pending) return reasons;
  absl::StatusOr<v1::GetQueueResponse> queue = GetQueue(global);
  if (!queue.ok()) return reasons;
  for (const v1::QueuedJobInfo& job : queue->jobs()) reasons[job.job_id()] = job.reason();
  return reasons;
}

// The REASON column: why a job ended, or why a PENDING one waits (a job a
// higher-priority one sent back to the queue says by whom first).
std::string Reason(const v1::Job& job, const std::map<std::string, std::string>& waiting) {
  auto it = waiting.find(job.job_id());
  if (it == waiting.end()) return job.reason();
  return job.reason().empty() ? it->second : absl::StrCat(job.reason(), "; ", it->second);
}

}  // namespace

void AddJobsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "jobs",
      "List jobs, newest first, with their owners. With a user token, other users' jobs show "
      "only id, name, owner, state, ranks and times (docs/security.md).");
  auto json = std::make_shared<bool>(false);
  auto state = std::make_shared<std::string>();
  auto limit = std::make_shared<int>(kDefaultJobsLimit);
  cmd->add_flag("--json", *json, "Print the ListJobsResponse as JSON (proto field names).");
  cmd->add_option("--state", *state, "Only jobs in this state.")
      ->check(CLI::IsMember({"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"}));
  cmd->add_option("--limit", *limit,
                  "At most this many jobs, newest first (0 = all, fetched a page at a time).")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->callback([json, state, limit, &global, &exit_code] {
    v1::ListJobsRequest request;
    v1::Job::State wanted;
    if (!state->empty() && v1::Job::State_Parse(*state, &wanted)) request.add_states(wanted);
    absl::StatusOr<v1::ListJobsResponse> listed = ListJobs(global, request, *limit);
    if (!listed.ok()) {
      exit_code = ReportError("jobs", listed.status(), global);
      return;
    }
    const v1::ListJobsResponse& response = *listed;
    if (!*json && !response.next_page_token().empty()) {
      *global.err << "chorus jobs: the newest " << response.jobs_size()
                  << " shown; --limit N shows more, --limit 0 all\n";
    }
    if (*json) {
      *global.out << ToJson(response);
    } else if (response.jobs().empty()) {
      *global.out << "no jobs\n";
    } else {
      *global.out << absl::StrFormat("%-12s %-24s %-12s %-10s %-7s %-19s %s\n", "JOB", "NAME",
                                     "OWNER", "STATE", "RANKS", "SUBMITTED", "REASON");
      const std::map<std::string, std::string> waiting = WaitingReasons(global, response);
      for (const v1::Job& job : response.jobs()) {
        const v1::ResourceSpec& r = job.spec().resources();
        std::string ranks = r.min_ranks() == r.max_ranks()
                                ? std::to_string(r.min_ranks())
                                : absl::StrFormat("%d-%d", r.min_ranks(), r.max_ranks());
        // Without a token file jobs have no owner.
        const std::string owner = job.owner().empty() ? "-" : job.owner();
        *global.out << absl::StrFormat(
            "%-12s %-24s %-12s %-10s %-7s %-19s %s\n", job.job_id(), job.spec().name(), owner,
            StateName(job.state()), ranks, FormatTime(job.submit_time_us()),
            Reason(job, waiting));
      }
    }
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
