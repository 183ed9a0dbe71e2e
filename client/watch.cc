// chorus watch JOB: the job's events (state changes, metrics, diagnosed
// problems) as they happen, until it ends.

#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/commands.h"
#include "client/follow.h"
#include "client/rpc.h"
#include "common/grpc_util.h"

namespace chorus::client {
namespace {

std::string DescribeEvent(const v1::JobEvent& e) {
  std::string what;
  switch (e.kind_case()) {
    case v1::JobEvent::kState:
      what =
          absl::StrCat("state ", StateName(e.state()), e.reason().empty() ? "" : ": ", e.reason());
      break;
    case v1::JobEvent::kMetrics: {
      const v1::Metrics& m = e.metrics();
      what = absl::StrFormat("metrics step %d epoch %d loss %.4f", m.step(), m.epoch(), m.loss());
      if (m.has_eval_loss()) absl::StrAppend(&what, absl::StrFormat(" test loss %.4f", m.eval_loss()));
      if (m.has_eval_accuracy()) {
        absl::StrAppend(&what, absl::StrFormat(" acc %.4f", m.eval_accuracy()));
      }
      absl::StrAppend(&what, absl::StrFormat(" %.0f samples/s", m.samples_per_second()));
      break;
    }
    case v1::JobEvent::kDiagnosis:
      what = absl::StrCat("problem ", v1::Diagnosis::Kind_Name(e.diagnosis().kind()), " ",
                          e.diagnosis().message());
      break;
    case v1::JobEvent::kMessage:
      what = e.message();
      break;
    default:
      what = "(event of a newer kind)";
  }
  return absl::StrCat(FormatTime(e.time_us()), "  #", e.seq(), "  ", what);
}

}  // namespace

void AddWatchCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "watch",
      "Print a job's events - state changes, metrics, diagnosed problems - from the start (or "
      "--after) as they happen, until the job ends. Exit 0 if it succeeded, 1 if not, 130 on "
      "Ctrl-C (the job keeps running).");
  auto job_id = std::make_shared<std::string>();
  auto after = std::make_shared<int64_t>(0);
  auto json = std::make_shared<bool>(false);
  cmd->add_option("job", *job_id, "Job id, e.g. job-000001.")->required();
  cmd->add_option("--after", *after, "Only events after this sequence number.")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", *json, "One JSON object per event (JobEvent, proto field names).");
  cmd->callback([job_id, after, json, &global, &exit_code] {
    CatchInterrupts();
    v1::WatchJobRequest request;
    request.set_job_id(*job_id);
    request.set_after_seq(*after);
    auto stub = JobStub(global);
    grpc::ClientContext context;
    std::atomic<bool> done{false};
    // The stream blocks in Read; Ctrl-C cancels it from here.
    std::thread interrupter([&] {
      while (!done.load()) {
        if (Interrupted()) {
          context.TryCancel();
          return;
        }
        absl::SleepFor(absl::Milliseconds(100));
      }
    });
    auto reader = stub->WatchJob(&context, request);
    v1::JobEvent event;
    v1::Job::State last_state = v1::Job::STATE_UNSPECIFIED;
    while (reader->Read(&event)) {
      if (event.has_state()) last_state = event.state();
      *global.out << (*json ? ToJson(event, /*one_line=*/true) : DescribeEvent(event)) << std::endl;
    }
    grpc::Status status = reader->Finish();
    done.store(true);
    interrupter.join();
    if (Interrupted()) {
      exit_code = 130;
      return;
    }
    if (!status.ok()) {
      exit_code = ReportError("watch", FromGrpcStatus(status), global);
      return;
    }
    if (last_state == v1::Job::STATE_UNSPECIFIED) {
      // Watching from after the final event: ask for the outcome.
      v1::GetJobRequest get;
      get.set_job_id(*job_id);
      v1::Job job;
      grpc::ClientContext get_context;
      SetDeadline(get_context, global);
      if (stub->GetJob(&get_context, get, &job).ok()) last_state = job.state();
    }
    exit_code = last_state == v1::Job::SUCCEEDED ? kExitOk : kExitFailure;
  });
}

}  // namespace chorus::client
