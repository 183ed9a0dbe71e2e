// chorus top JOB: the job's per-rank table (step, phase, time in phase,
// heartbeat age, compute and wait per step, how long the others waited for
// each rank), redrawn in the terminal every --interval seconds until the
// job ends, --iterations are done or Ctrl-C. A diagnosed rank is marked and
// its diagnosis printed under the table.

#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/commands.h"
#include "client/follow.h"
#include "client/rpc.h"
#include "common/grpc_util.h"

namespace chorus::client {

std::string FormatTop(const v1::JobStatus& status) {
  const v1::Job& job = status.job();
  std::string out =
      absl::StrCat(job.job_id(), " (", job.spec().name(), "): ", StateName(job.state()),
                   ", generation ", job.generation(), ", world size ", job.world_size(), "\n");
  if (!job.reason().empty()) absl::StrAppend(&out, "  reason: ", job.reason(), "\n");
  if (!status.pending_reason().empty()) {
    absl::StrAppend(&out, "  waiting: ", status.pending_reason(), "\n");
  }
  std::map<int, std::string> culprit;
  for (const v1::Diagnosis& d : status.diagnoses()) {
    for (int rank : d.ranks()) culprit.emplace(rank, v1::Diagnosis::Kind_Name(d.kind()));
  }
  if (!status.ranks().empty()) {
    absl::StrAppend(&out, absl::StrFormat("%-5s %-16s %-9s %8s %-11s %8s %9s %9s %9s %9s %10s\n",
                                          "RANK", "HOST", "STATE", "STEP", "PHASE", "IN_PHASE",
                                          "HEARTBEAT", "COMPUTE", "WAIT", "OTHERS", "SAMPLES/S"));
  }
  for (const v1::RankStatus& r : status.ranks()) {
    auto it = culprit.find(r.rank());
    absl::StrAppend(
        &out,
        absl::StrFormat("%-5d %-16s %-9s %8d %-11s %7.1fs %8.1fs %8.3fs %8.3fs %8.3fs %10.1f%s\n",
                        r.rank(), r.host(), v1::RankStatus::State_Name(r.state()), r.step(),
                        v1::Phase_Name(r.phase()), r.phase_seconds(), r.heartbeat_age_seconds(),
                        r.compute_seconds(), r.comm_wait_seconds(), r.caused_wait_seconds(),
                        r.samples_per_second(),
                        it != culprit.end() ? absl::StrCat("  <- ", it->second) : ""));
  }
  for (const v1::Diagnosis& d : status.diagnoses()) {
    absl::StrAppend(&out, v1::Diagnosis::Kind_Name(d.kind()), " ", d.message(), "\n");
  }
  if (!status.ranks().empty()) {
    absl::StrAppend(&out,
                    "COMPUTE and WAIT are per step; OTHERS: how long the other ranks waited for "
                    "this one per step.\n");
  }
  return out;
}

void AddTopCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd =
      app.add_subcommand("top", "Watch a job's ranks live: step, phase, compute and wait times.");
  auto job_id = std::make_shared<std::string>();
  auto interval = std::make_shared<double>(2.0);
  auto iterations = std::make_shared<int>(0);
  auto once = std::make_shared<bool>(false);
  cmd->add_option("job", *job_id, "Job id, e.g. job-000001.")->required();
  cmd->add_option("--interval", *interval, "Seconds between refreshes.")
      ->check(CLI::Range(0.2, 3600.0))
      ->capture_default_str();
  cmd->add_option("--iterations", *iterations,
                  "Stop after this many refreshes (0: until the job ends or Ctrl-C).")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--once", *once, "Print the table once, without clearing the screen, and exit.");
  cmd->callback([job_id, interval, iterations, once, &global, &exit_code] {
    const bool redraw = !*once && global.out == &std::cout && isatty(STDOUT_FILENO);
    const int rounds = *once ? 1 : *iterations;
    CatchInterrupts();
    auto stub = JobStub(global);
    for (int round = 1; !Interrupted(); ++round) {
      v1::GetJobStatusRequest request;
      request.set_job_id(*job_id);
      v1::JobStatus status;
      grpc::ClientContext context;
      SetDeadline(context, global);
      absl::Status s = FromGrpcStatus(stub->GetJobStatus(&context, request, &status));
      if (!s.ok()) {
        exit_code = ReportError("top", s, global);
        return;
      }
      // Home and clear, then the table: one write, so it does not flicker.
      *global.out << (redraw ? "\x1b[H\x1b[2J" : "") << FormatTop(status) << std::flush;
      const bool ended = status.job().state() == v1::Job::SUCCEEDED ||
                         status.job().state() == v1::Job::FAILED ||
                         status.job().state() == v1::Job::CANCELLED;
      if (ended || (rounds > 0 && round >= rounds)) break;
      if (!redraw) *global.out << "\n";
      const absl::Time next = absl::Now() + absl::Seconds(*interval);
      while (!Interrupted() && absl::Now() < next) absl::SleepFor(absl::Milliseconds(50));
    }
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
