// chorus submit SPEC: validate a job spec here, then hand it to the
// coordinator's queue. Prints the new job's id.

#include <iostream>
#include <memory>
#include <string>

#include "client/commands.h"
#include "client/rpc.h"
#include "common/grpc_util.h"
#include "common/job_spec.h"

namespace chorus::client {

void AddSubmitCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "submit", "Validate a job spec and queue it on the coordinator; prints the job id.");
  auto path = std::make_shared<std::string>();
  auto resume_from = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("spec", *path, "Job spec file (.textproto/.pbtxt, .json, .yaml/.yml).")->required();
  cmd->add_option("--resume_from", *resume_from,
                  "JOB or JOB:STEP whose checkpoint the new job starts from.");
  cmd->add_flag("--json", *json, "Print {\"job_id\": ...} instead of the bare id.");
  cmd->callback([path, resume_from, json, &global, &exit_code] {
    absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(*path);
    if (!spec.ok()) {
      std::cerr << "chorus submit: " << spec.status().message() << "\n";
      exit_code = kExitBadInput;
      return;
    }
    v1::SubmitJobRequest request;
    *request.mutable_spec() = *spec;
    request.set_resume_from(*resume_from);
    v1::SubmitJobResponse response;
    grpc::ClientContext context;
    SetDeadline(context, global);
    absl::Status s = FromGrpcStatus(JobStub(global)->SubmitJob(&context, request, &response));
    if (!s.ok()) {
      exit_code = ReportError("submit", s, global);
      return;
    }
    if (*json) {
      std::cout << ToJson(response);
    } else {
      std::cout << response.job_id() << "\n";
      std::cerr << "chorus submit: queued " << response.job_id() << " (" << spec->name()
                << "); `chorus status " << response.job_id() << "` follows it\n";
    }
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
