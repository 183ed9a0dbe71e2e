// chorus checkpoints JOB: a job's committed checkpoints.
// chorus checkpoint JOB [--wait]: ask a running job to checkpoint now.
// chorus export JOB [--step N] -o FILE: a checkpoint's model as a state dict
// that Python's torch.load reads; with --torchscript, for a TorchScript job,
// the trained module that torch.jit.load reads.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/download.h"
#include "checkpoint/layout.h"
#include "client/commands.h"
#include "client/rpc.h"
#include "common/grpc_util.h"
#include "common/paths.h"

extern char** environ;

namespace chorus::client {
namespace {

// Runs chorus-script-export (installed beside the worker binaries) to put
// `state_path`'s weights into `module_path` and save the result at `output`.
absl::Status WriteTrainedModule(const std::string& module_path, const std::string& state_path,
                                const std::string& output) {
  const std::string exporter = CompanionBinary(ExecutableDir(), "chorus-script-export", "worker");
  if (access(exporter.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        exporter, " is missing; build it with `bazel build //worker:chorus-script-export`"));
  }
  std::vector<std::string> args = {exporter,   "--module", module_path, "--state",
                                   state_path, "--output", output};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, exporter.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", exporter));
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::FailedPreconditionError(
        "writing the TorchScript module failed (see the message above)");
  }
  return absl::OkStatus();
}

struct ExportOptions {
  std::string job_id;
  int64_t step = 0;  // 0: the newest usable checkpoint
  int rank = 0;
  std::string output;
  bool torchscript = false;
};

// The TorchScript module job `job_id` trained (model.torchscript.path of its
// spec); FAILED_PRECONDITION if it trained another kind of model.
absl::StatusOr<std::string> TorchScriptModulePath(const std::string& job_id,
                                                  const GlobalOptions& global) {
  v1::GetJobRequest get;
  get.set_job_id(job_id);
  v1::Job job;
  grpc::ClientContext context;
  SetDeadline(context, global);
  absl::Status s = FromGrpcStatus(JobStub(global)->GetJob(&context, get, &job));
  if (!s.ok()) return s;
  if (!job.spec().model().has_torchscript()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id,
                     " did not train a TorchScript model (model.torchscript in its spec); "
                     "export without --torchscript writes its state dict"));
  }
  return job.spec().model().torchscript().path();
}

// chorus export: downloads the checkpoint's model file and writes it (or,
// with --torchscript, the module with its weights) to the output through a
// temporary file. Returns the exit code.
int RunExport(const ExportOptions& options, const GlobalOptions& global) {
  std::string module_path;
  if (options.torchscript) {
    absl::StatusOr<std::string> found = TorchScriptModulePath(options.job_id, global);
    if (!found.ok()) return ReportError("export", found.status(), global);
    module_path = *found;
  }
  auto stub = v1::CheckpointService::NewStub(CoordinatorChannel(global));
  absl::StatusOr<std::string> bytes =
      DownloadCheckpointFile(*stub, options.job_id, options.step, ModelFileName(options.rank),
                             absl::Seconds(std::max(60.0, global.timeout_seconds)));
  if (!bytes.ok()) return ReportError("export", bytes.status(), global);
  const std::string path = UserPath(options.output);
  const std::string tmp = path + (options.torchscript ? ".state.tmp" : ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << *bytes;
    if (!out) {
      *global.err << "chorus export: cannot write " << path << "\n";
      return kExitFailure;
    }
  }
  if (options.torchscript) {
    absl::Status s = WriteTrainedModule(module_path, tmp, path);
    std::remove(tmp.c_str());
    if (!s.ok()) return ReportError("export", s, global);
    *global.err << "chorus export: wrote " << path << " (" << module_path
                << " with the checkpoint's weights; torch.jit.load reads it)\n";
    return kExitOk;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    *global.err << "chorus export: cannot write " << path << "\n";
    return kExitFailure;
  }
  *global.err << "chorus export: wrote " << path << " (" << bytes->size()
              << " bytes; torch.load reads it)\n";
  return kExitOk;
}

}  // namespace

void AddCheckpointsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd =
      app.add_subcommand("checkpoints", "List a job's committed checkpoints, oldest first.");
  auto job_id = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("job", *job_id, "Job id, e.g. job-000001.")->required();
  cmd->add_flag("--json", *json, "Print the ListCheckpointsResponse as JSON (proto field names).");
  cmd->callback([job_id, json, &global, &exit_code] {
    v1::ListCheckpointsRequest request;
    request.set_job_id(*job_id);
    v1::ListCheckpointsResponse response;
    grpc::ClientContext context;
    SetDeadline(context, global);
    absl::Status s = FromGrpcStatus(JobStub(global)->ListCheckpoints(&context, request, &response));
    if (!s.ok()) {
      exit_code = ReportError("checkpoints", s, global);
      return;
    }
    if (*json) {
      *global.out << ToJson(response);
    } else if (response.checkpoints().empty()) {
      *global.out << *job_id << " has no checkpoints\n";
    } else {
      *global.out << absl::StrFormat("%-10s %-20s %-6s %-12s %s\n", "STEP", "COMMITTED", "RANKS",
                                     "SIZE", "FILES");
      for (const v1::CheckpointManifest& m : response.checkpoints()) {
        int64_t bytes = 0;
        std::string files;
        for (const v1::CheckpointFile& f : m.files()) {
          bytes += f.size();
          files += (files.empty() ? "" : ",") + f.name();
        }
        // storage SHARED_DIR: where the files are.
        if (!m.directory().empty()) files += "  in " + m.directory();
        *global.out << absl::StrFormat("%-10d %-20s %-6d %-12s %s\n", m.step(),
                                       FormatTime(m.commit_time_us()), m.world_size(),
                                       absl::StrFormat("%.1f MB", bytes / 1048576.0), files);
      }
    }
    exit_code = kExitOk;
  });
}

void AddExportCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "export",
      "Write a checkpoint's model (parameters and buffers by name) to FILE; in Python, "
      "torch.load(FILE) returns the state dict. With --torchscript (TorchScript jobs), FILE is "
      "the trained module instead: torch.jit.load(FILE).");
  auto options = std::make_shared<ExportOptions>();
  cmd->add_option("job", options->job_id, "Job id, e.g. job-000001.")->required();
  cmd->add_option("--step", options->step, "Checkpoint step (default: the newest usable one).")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--rank", options->rank,
                  "Per-rank checkpoints (checkpoint.per_rank): whose model to write (default 0).")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("-o,--output", options->output, "File to write.")->required();
  cmd->add_flag("--torchscript", options->torchscript,
                "Write the job's TorchScript module (model.torchscript.path of its spec) with the "
                "checkpoint's weights; torch.jit.load reads it.");
  cmd->callback([options, &global, &exit_code] { exit_code = RunExport(*options, global); });
}

void AddCheckpointCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("checkpoint",
                                     "Ask a running job to checkpoint now (besides "
                                     "checkpoint.every_steps): DDP jobs take it at the end "
                                     "of the step rank 0 is in, decentralized jobs within 10 steps "
                                     "(their ranks agree on the step). "
                                     "An upload still running is waited for, not skipped.");
  auto job_id = std::make_shared<std::string>();
  auto wait = std::make_shared<bool>(false);
  auto wait_seconds = std::make_shared<double>(120);
  cmd->add_option("job", *job_id, "Job id, e.g. job-000001.")->required();
  cmd->add_flag("--wait", *wait, "Wait until the new checkpoint is committed; print its step.");
  cmd->add_option("--wait_seconds", *wait_seconds, "How long --wait waits (default 120).")
      ->check(CLI::PositiveNumber);
  cmd->callback([job_id, wait, wait_seconds, &global, &exit_code] {
    v1::CheckpointJobRequest request;
    request.set_job_id(*job_id);
    v1::CheckpointJobResponse response;
    {
      grpc::ClientContext context;
      SetDeadline(context, global);
      absl::Status s = FromGrpcStatus(JobStub(global)->CheckpointJob(&context, request, &response));
      if (!s.ok()) {
        exit_code = ReportError("checkpoint", s, global);
        return;
      }
    }
    *global.out << *job_id << ": checkpoint requested (ranks at step " << response.step()
                << "; newest committed: "
                << (response.newest_checkpoint_step() > 0
                        ? absl::StrCat("step ", response.newest_checkpoint_step())
                        : std::string("none"))
                << ")\n";
    if (!*wait) {
      exit_code = kExitOk;
      return;
    }
    global.out->flush();
    const absl::Time deadline = absl::Now() + absl::Seconds(*wait_seconds);
    while (absl::Now() < deadline) {
      v1::ListCheckpointsRequest list_request;
      list_request.set_job_id(*job_id);
      v1::ListCheckpointsResponse list;
      grpc::ClientContext context;
      SetDeadline(context, global);
      absl::Status s =
          FromGrpcStatus(JobStub(global)->ListCheckpoints(&context, list_request, &list));
      if (!s.ok()) {
        exit_code = ReportError("checkpoint", s, global);
        return;
      }
      for (const v1::CheckpointManifest& m : list.checkpoints()) {
        if (m.step() > response.newest_checkpoint_step() && m.step() >= response.step()) {
          *global.out << *job_id << ": checkpoint at step " << m.step() << " committed\n";
          exit_code = kExitOk;
          return;
        }
      }
      v1::GetJobRequest get;
      get.set_job_id(*job_id);
      v1::Job job;
      grpc::ClientContext job_context;
      SetDeadline(job_context, global);
      if (FromGrpcStatus(JobStub(global)->GetJob(&job_context, get, &job)).ok() &&
          (job.state() == v1::Job::SUCCEEDED || job.state() == v1::Job::FAILED ||
           job.state() == v1::Job::CANCELLED)) {
        *global.err << "chorus checkpoint: " << *job_id << " ended (" << StateName(job.state())
                    << ") before a new checkpoint was committed\n";
        exit_code = kExitFailure;
        return;
      }
      absl::SleepFor(absl::Milliseconds(250));
    }
    *global.err << "chorus checkpoint: no new checkpoint of " << *job_id << " committed within "
                << *wait_seconds << " s\n";
    exit_code = kExitFailure;
  });
}

}  // namespace chorus::client
