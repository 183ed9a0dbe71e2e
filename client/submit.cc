// chorus submit SPEC: validate a job spec here, then hand it to the
// coordinator's queue. Prints the new job's id.

#include <iostream>
#include <memory>
#include <string>

#include "client/commands.h"
#include "client/follow.h"
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
  auto wait = std::make_shared<bool>(false);
  auto cancel_on_interrupt = std::make_shared<bool>(false);
  cmd->add_option("spec", *path, "Job spec file (.textproto/.pbtxt, .json, .yaml/.yml).")
      ->required();
  cmd->add_option("--resume_from", *resume_from,
                  "JOB or JOB:STEP whose checkpoint the new job starts from.");
  cmd->add_flag("--json", *json,
                "Print {\"job_id\": ...} instead of the bare id (with --wait: the final Job).");
  cmd->add_flag("--wait", *wait,
                "Follow the job with a progress line until it ends; exit 0 if it succeeded, 1 "
                "if not, 130 on Ctrl-C (the job keeps running unless --cancel_on_interrupt).");
  cmd->add_flag("--cancel_on_interrupt", *cancel_on_interrupt,
                "With --wait: Ctrl-C cancels the job.");
  cmd->callback([path, resume_from, json, wait, cancel_on_interrupt, &global, &exit_code] {
    absl::StatusOr<v1::JobSpec> spec = LoadUserJobSpec(*path);
    if (!spec.ok()) {
      *global.err << "chorus submit: " << spec.status().message() << "\n";
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
    if (*wait) {
      CatchInterrupts();
      *global.err << "chorus submit: queued " << response.job_id() << "\n";
      absl::StatusOr<FollowResult> followed =
          FollowJob(*JobStub(global), global, response.job_id(), *cancel_on_interrupt);
      if (!followed.ok()) {
        exit_code = ReportError("submit", followed.status(), global);
        return;
      }
      const v1::Job& job = followed->job;
      *global.err << "chorus submit: " << job.job_id() << " " << StateName(job.state())
                  << (job.reason().empty() ? "" : ": " + job.reason()) << "\n";
      *global.out << (*json ? ToJson(job) : job.job_id() + "\n");
      exit_code = ExitCodeFor(*followed);
      return;
    }
    if (*json) {
      *global.out << ToJson(response);
    } else {
      *global.out << response.job_id() << "\n";
      *global.err << "chorus submit: queued " << response.job_id() << " (" << spec->name()
                  << "); `chorus status " << response.job_id() << "` follows it\n";
    }
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
