// chorus queue: the PENDING jobs in the order the coordinator will place
// them, with owner, priority and why each waits (docs/scheduling.md).

#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "client/commands.h"
#include "client/rpc.h"
#include "common/grpc_util.h"

namespace chorus::client {

absl::StatusOr<v1::GetQueueResponse> GetQueue(const GlobalOptions& global) {
  v1::GetQueueResponse response;
  grpc::ClientContext context;
  SetDeadline(context, global);
  absl::Status s =
      FromGrpcStatus(JobStub(global)->GetQueue(&context, v1::GetQueueRequest(), &response));
  if (!s.ok()) return s;
  return response;
}

std::string FormatQueue(const v1::GetQueueResponse& queue) {
  if (queue.jobs().empty()) return "no queued jobs\n";
  std::string out = absl::StrFormat("%-4s %-12s %-20s %-12s %-8s %-6s %-19s %s\n", "#", "JOB",
                                    "NAME", "OWNER", "PRIORITY", "RANKS", "SUBMITTED", "REASON");
  int position = 0;
  for (const v1::QueuedJobInfo& job : queue.jobs()) {
    absl::StrAppendFormat(
        &out, "%-4d %-12s %-20s %-12s %-8s %-6s %-19s %s\n", ++position, job.job_id(), job.name(),
        job.owner().empty() ? "-" : job.owner(),
        job.priority() == v1::JobSpec::PRIORITY_UNSPECIFIED
            ? "NORMAL"
            : v1::JobSpec::Priority_Name(job.priority()),
        absl::StrCat(job.min_ranks(), " ", v1::ResourceSpec::Device_Name(job.device())),
        FormatTime(job.submit_time_us()), job.reason());
  }
  out +=
      "No start times are estimated: jobs do not declare how long they run "
      "(docs/scheduling.md).\n";
  return out;
}

void AddQueueCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "queue",
      "List the queued jobs in the order the coordinator places them (priority, then the user "
      "with the least recent usage, then submission), with why each waits.");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print the GetQueueResponse as JSON (proto field names).");
  cmd->callback([json, &global, &exit_code] {
    absl::StatusOr<v1::GetQueueResponse> queue = GetQueue(global);
    if (!queue.ok()) {
      exit_code = ReportError("queue", queue.status(), global);
      return;
    }
    *global.out << (*json ? ToJson(*queue) : FormatQueue(*queue));
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
