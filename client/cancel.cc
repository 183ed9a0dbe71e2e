// chorus cancel JOB: stop a job; it ends CANCELLED.

#include <iostream>
#include <memory>
#include <string>

#include "client/commands.h"
#include "client/rpc.h"
#include "common/grpc_util.h"

namespace chorus::client {

void AddCancelCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("cancel", "Cancel a job that has not ended.");
  auto job_id = std::make_shared<std::string>();
  auto reason = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("job", *job_id, "Job id, e.g. job-000001.")->required();
  cmd->add_option("--reason", *reason, "Recorded as the job's reason.");
  cmd->add_flag("--json", *json, "Print the cancelled Job as JSON (proto field names).");
  cmd->callback([job_id, reason, json, &global, &exit_code] {
    v1::CancelJobRequest request;
    request.set_job_id(*job_id);
    request.set_reason(*reason);
    v1::CancelJobResponse response;
    grpc::ClientContext context;
    SetDeadline(context, global);
    absl::Status s = FromGrpcStatus(JobStub(global)->CancelJob(&context, request, &response));
    if (!s.ok()) {
      exit_code = ReportError("cancel", s, global);
      return;
    }
    if (*json) {
      *global.out << ToJson(response.job());
    } else {
      *global.out << response.job().job_id() << ": " << StateName(response.job().state()) << " ("
                  << response.job().reason() << ")\n";
    }
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
