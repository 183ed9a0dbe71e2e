// chorus whoami: the user and role the coordinator takes this CLI's token for.

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/rpc.h"
#include "common/grpc_util.h"

namespace chorus::client {
namespace {

// "alice (user)", "anonymous (admin: ...)", "the credential of job-000003 (job)".
std::string Describe(const v1::WhoAmIResponse& me) {
  if (!me.tokens_required()) {
    return absl::StrCat("anonymous (", me.role(), ": this coordinator has no token file)");
  }
  if (!me.job_id().empty()) {
    return absl::StrCat("the credential of ", me.job_id(), " (", me.role(), ")");
  }
  return absl::StrCat(me.user(), " (", me.role(), ")");
}

}  // namespace

void AddWhoamiCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "whoami",
      "Print the user and role the coordinator takes this CLI's token for (--token_file, "
      "CHORUS_TOKEN or CHORUS_TOKEN_FILE): \"alice (user)\", or \"anonymous (admin: this "
      "coordinator has no token file)\".");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print the WhoAmIResponse as JSON (proto field names).");
  cmd->callback([json, &global, &exit_code] {
    v1::WhoAmIResponse me;
    grpc::ClientContext context;
    SetDeadline(context, global);
    absl::Status s = FromGrpcStatus(JobStub(global)->WhoAmI(&context, v1::WhoAmIRequest(), &me));
    if (!s.ok()) {
      exit_code = ReportError("whoami", s, global);
      return;
    }
    *global.out << (*json ? ToJson(me) : Describe(me) + "\n");
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
