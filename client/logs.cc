// chorus logs JOB: what the job's rank processes printed, as relayed by their
// agents; --follow keeps printing until the job ends.

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/commands.h"
#include "client/follow.h"
#include "client/rpc.h"
#include "common/grpc_util.h"

namespace chorus::client {

void AddLogsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "logs",
      "Print what a job's rank processes wrote to stdout/stderr, each line prefixed with its "
      "rank. The coordinator keeps the newest 20000 lines of each job.");
  auto job_id = std::make_shared<std::string>();
  auto rank = std::make_shared<int>(-1);
  auto follow = std::make_shared<bool>(false);
  auto tail = std::make_shared<int>(0);
  auto json = std::make_shared<bool>(false);
  cmd->add_option("job", *job_id, "Job id, e.g. job-000001.")->required();
  cmd->add_option("--rank", *rank, "Only this rank's lines.")->check(CLI::NonNegativeNumber);
  cmd->add_option("--tail", *tail, "Start with only the last N lines (0 = all kept).")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("-f,--follow", *follow,
                "Keep printing new lines until the job ends (Ctrl-C stops following; exit 130).");
  cmd->add_flag("--json", *json, "One JSON object per line (LogLine, proto field names).");
  cmd->callback([job_id, rank, follow, tail, json, &global, &exit_code] {
    if (*follow) CatchInterrupts();
    auto stub = JobStub(global);
    v1::GetLogsRequest request;
    request.set_job_id(*job_id);
    if (*rank >= 0) request.set_rank(*rank);
    if (*tail > 0) {
      request.set_max_lines(*tail);
      request.set_tail(true);
    }
    // Bounded: a follow ends with the job, and every poll has a deadline.
    while (true) {
      v1::GetLogsResponse response;
      grpc::ClientContext context;
      SetDeadline(context, global);
      absl::Status s = FromGrpcStatus(stub->GetLogs(&context, request, &response));
      if (!s.ok()) {
        exit_code = ReportError("logs", s, global);
        return;
      }
      if (request.after_seq() == 0 && response.dropped() > 0 && !request.tail()) {
        *global.err << "chorus logs: " << response.dropped()
                    << " older line(s) of this job were not kept\n";
      }
      for (const v1::LogLine& line : response.lines()) {
        if (*json) {
          *global.out << ToJson(line, /*one_line=*/true) << "\n";
        } else if (line.rank() >= 0) {
          *global.out << absl::StrFormat("[rank %d] %s\n", line.rank(), line.text());
        } else {
          *global.out << absl::StrFormat("[slot %d] %s\n", line.slot(), line.text());
        }
      }
      global.out->flush();
      request.set_after_seq(response.next_seq());
      request.set_tail(false);
      request.set_max_lines(0);
      const bool more_now = response.lines_size() > 0 && !response.complete();
      if (!*follow || (response.complete() && response.lines().empty())) break;
      if (!more_now) {
        for (int i = 0; i < 5 && !Interrupted(); ++i) absl::SleepFor(absl::Milliseconds(100));
      }
      if (Interrupted()) {
        exit_code = 130;
        return;
      }
    }
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
