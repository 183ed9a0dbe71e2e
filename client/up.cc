// chorus up --local N SPEC: everything on this machine — a coordinator (on a
// temporary state directory unless --state_dir), one node agent with N slots,
// the job, its progress, and a clean teardown. Exits with the job's result.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "client/follow.h"
#include "client/rpc.h"
#include "client/up_json.h"
#include "common/grpc_util.h"
#include "common/job_spec.h"
#include "common/memory_estimate.h"
#include "common/metrics_text.h"
#include "common/paths.h"

extern char** environ;

namespace chorus::client {
namespace {

pid_t Spawn(const std::vector<std::string>& args, const std::string& log_path) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// SIGTERM, then SIGKILL if it has not exited within `grace`.
void Terminate(pid_t pid, absl::Duration grace) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  while (absl::Now() < deadline) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

}  // namespace

void AddUpCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "up",
      "Run a job entirely on this machine: a coordinator, one node agent with --local slots, the "
      "job and its progress; then tear everything down. Exits 0 if the job succeeded, 1 if not, "
      "130 on Ctrl-C (which cancels the job).");
  auto local = std::make_shared<int>(0);
  auto path = std::make_shared<std::string>();
  auto state_dir = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("--local", *local, "Rank slots of the local agent.")
      ->required()
      ->check(CLI::Range(1, 256));
  cmd->add_option("spec", *path, "Job spec file.")->required();
  cmd->add_option("--state_dir", *state_dir,
                  "Coordinator state directory (default: a temporary one, removed after).");
  cmd->add_flag("--json", *json, "End with the final job as one JSON line.");
  auto resume_from = std::make_shared<std::string>();
  cmd->add_option(
      "--resume_from", *resume_from,
      "JOB or JOB:STEP: start from that job's checkpoint (with --state_dir of the run that "
      "wrote it).");
  cmd->callback([local, path, state_dir, json, resume_from, &global, &exit_code] {
    absl::StatusOr<v1::JobSpec> spec = LoadUserJobSpec(*path);
    if (!spec.ok()) {
      *global.err << "chorus up: " << spec.status().message() << "\n";
      exit_code = kExitBadInput;
      return;
    }
    if (spec->resources().device() == v1::ResourceSpec::CUDA) {
      *global.err << "chorus up: " << *path << ": resources.device is CUDA, but chorus up "
                  << "--local starts CPU agents; run a coordinator and node agents started "
                     "with `chorus-worker --device cuda` (docs/gpu.md), or set "
                     "resources.device: CPU\n";
      exit_code = kExitBadInput;
      return;
    }
    if (spec->resources().min_ranks() > *local) {
      *global.err << "chorus up: the job needs resources.min_ranks = "
                  << spec->resources().min_ranks() << " slots; --local gives " << *local << "\n";
      exit_code = kExitBadInput;
      return;
    }
    // The local agent offers this machine's memory; a job it cannot hold
    // would wait for ever (the estimate is the one placement uses).
    if (const int64_t here = MachineMemoryBytes(); here > 0) {
      const RankMemoryEstimate memory = EstimateRankMemory(*spec);
      const int64_t fit = here / std::max<int64_t>(1, memory.total_bytes());
      if (fit < spec->resources().min_ranks()) {
        *global.err << "chorus up: job spec: "
                    << (fit == 0
                            ? absl::StrCat(memory.field, ": ",
                                           RankMemoryMessage(memory, static_cast<double>(here),
                                                             "of memory on this machine"))
                            : absl::StrCat("resources.min_ranks: ", spec->resources().min_ranks(),
                                           " ranks of ", memory.ToString(), " do not fit in ",
                                           FormatBytes(static_cast<double>(here)),
                                           " of memory on this machine (", fit, " do)"))
                    << "\n";
        exit_code = kExitBadInput;
        return;
      }
    }
    const std::string bin = ExecutableDir();
    const std::string coordinator_bin = CompanionBinary(bin, "chorus-coordinator", "coordinator");
    const std::string worker_bin = CompanionBinary(bin, "chorus-worker", "worker");
    for (const std::string& b : {coordinator_bin, worker_bin}) {
      if (access(b.c_str(), X_OK) != 0) {
        *global.err << "chorus up: " << b << " is missing; build it with `bazel build "
                    << "//coordinator:chorus-coordinator //worker:chorus-worker`\n";
        exit_code = kExitFailure;
        return;
      }
    }
    bool temporary = state_dir->empty();
    std::string dir = UserPath(*state_dir);
    if (temporary) {
      char tmpl[] = "/tmp/chorus-up-XXXXXX";
      if (mkdtemp(tmpl) == nullptr) {
        *global.err << "chorus up: cannot create a temporary state directory\n";
        exit_code = kExitFailure;
        return;
      }
      dir = tmpl;
    }
    std::filesystem::create_directories(dir);
    const std::string port_file = dir + "/port";
    std::remove(port_file.c_str());

    CatchInterrupts();

    // The HTTP port (metrics, status page) is written before the gRPC port.
    pid_t coordinator =
        Spawn({coordinator_bin, "--listen", "127.0.0.1:0", "--state_dir", dir + "/state",
               "--port_file", port_file, "--http_port_file", dir + "/http_port"},
              dir + "/coordinator.log");
    std::string port;
    for (int i = 0; i < 300 && port.empty() && !Interrupted(); ++i) {
      std::ifstream in(port_file);
      std::getline(in, port);
      if (port.empty()) absl::SleepFor(absl::Milliseconds(50));
    }
    pid_t worker = -1;
    std::unique_ptr<v1::JobService::Stub> stub;
    auto teardown = [&] {
      // Our idle connection goes first: a stopping coordinator waits for its
      // clients to close, and an idle client channel may not notice for
      // seconds.
      stub.reset();
      Terminate(worker, absl::Seconds(15));
      Terminate(coordinator, absl::Seconds(10));
      if (temporary) std::filesystem::remove_all(dir);
    };
    if (port.empty()) {
      *global.err << "chorus up: the coordinator did not start; see " << dir
                  << "/coordinator.log\n";
      temporary = false;  // keep the log
      teardown();
      exit_code = kExitFailure;
      return;
    }
    GlobalOptions local_global = global;
    local_global.coordinator = "127.0.0.1:" + port;
    local_global.channel = nullptr;  // talk to the coordinator started here
    worker = Spawn(
        {worker_bin, "--coordinator", local_global.coordinator, "--slots", std::to_string(*local),
         "--threads_per_rank", std::to_string(spec->resources().threads_per_rank())},
        dir + "/worker.log");

    stub = JobStub(local_global);
    v1::SubmitJobRequest submit;
    *submit.mutable_spec() = *spec;
    submit.set_resume_from(*resume_from);
    v1::SubmitJobResponse submitted;
    {
      grpc::ClientContext context;
      SetDeadline(context, local_global);
      absl::Status s = FromGrpcStatus(stub->SubmitJob(&context, submit, &submitted));
      if (!s.ok()) {
        exit_code = ReportError("up", s, local_global);
        teardown();
        return;
      }
    }
    *global.err << "chorus up: " << submitted.job_id() << " on " << *local
                << " local slot(s); logs in " << dir << "\n";
    absl::StatusOr<FollowResult> followed =
        FollowJob(*stub, local_global, submitted.job_id(), /*cancel_on_interrupt=*/true);
    if (!followed.ok()) {
      exit_code = ReportError("up", followed.status(), local_global);
      teardown();
      return;
    }
    const v1::Job& job = followed->job;
    const v1::Metrics& m = job.latest_metrics();
    *global.err << "chorus up: " << job.job_id() << " " << StateName(job.state()) << ": "
                << job.reason();
    if (job.state() == v1::Job::SUCCEEDED && !spec->has_program()) {
      *global.err << "; " << EvaluationText(m) << " after " << m.step() << " steps";
    }
    *global.err << "\n";
    if (job.state() == v1::Job::FAILED) temporary = false;  // keep the logs for a look
    teardown();
    if (*json) *global.out << UpJsonLine(job) << std::endl;
    exit_code = ExitCodeFor(*followed);
  });
}

}  // namespace chorus::client
