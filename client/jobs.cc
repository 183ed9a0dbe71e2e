// chorus jobs: the coordinator's jobs, newest first.

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "client/commands.h"
#include "client/rpc.h"
#include "common/grpc_util.h"

namespace chorus::client {

void AddJobsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("jobs", "List jobs, newest first.");
  auto json = std::make_shared<bool>(false);
  auto state = std::make_shared<std::string>();
  auto limit = std::make_shared<int>(0);
  cmd->add_flag("--json", *json, "Print the ListJobsResponse as JSON (proto field names).");
  cmd->add_option("--state", *state, "Only jobs in this state.")
      ->check(CLI::IsMember({"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"}));
  cmd->add_option("--limit", *limit, "At most this many jobs (0 = all).")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([json, state, limit, &global, &exit_code] {
    v1::ListJobsRequest request;
    v1::Job::State wanted;
    if (!state->empty() && v1::Job::State_Parse(*state, &wanted)) request.add_states(wanted);
    request.set_limit(*limit);
    v1::ListJobsResponse response;
    grpc::ClientContext context;
    SetDeadline(context, global);
    absl::Status s = FromGrpcStatus(JobStub(global)->ListJobs(&context, request, &response));
    if (!s.ok()) {
      exit_code = ReportError("jobs", s, global);
      return;
    }
    if (*json) {
      *global.out << ToJson(response);
    } else if (response.jobs().empty()) {
      *global.out << "no jobs\n";
    } else {
      *global.out << absl::StrFormat("%-12s %-24s %-10s %-7s %-19s %s\n", "JOB", "NAME", "STATE",
                                     "RANKS", "SUBMITTED", "REASON");
      for (const v1::Job& job : response.jobs()) {
        const v1::ResourceSpec& r = job.spec().resources();
        std::string ranks = r.min_ranks() == r.max_ranks()
                                ? std::to_string(r.min_ranks())
                                : absl::StrFormat("%d-%d", r.min_ranks(), r.max_ranks());
        *global.out << absl::StrFormat("%-12s %-24s %-10s %-7s %-19s %s\n", job.job_id(),
                                       job.spec().name(), StateName(job.state()), ranks,
                                       FormatTime(job.submit_time_us()), job.reason());
      }
    }
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
