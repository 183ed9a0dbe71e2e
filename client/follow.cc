#include "client/follow.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/rpc.h"
#include "common/grpc_util.h"

namespace chorus::client {
namespace {

std::atomic<bool> interrupted{false};

void OnInterrupt(int) { interrupted.store(true); }

bool Ended(v1::Job::State state) {
  return state == v1::Job::SUCCEEDED || state == v1::Job::FAILED || state == v1::Job::CANCELLED;
}

}  // namespace

void CatchInterrupts() {
  struct sigaction sa = {};
  sa.sa_handler = OnInterrupt;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool Interrupted() { return interrupted.load(); }

std::string ProgressLine(const v1::Job& job) {
  const v1::Metrics& m = job.latest_metrics();
  if (job.spec().has_program()) {
    // A program says only what it reported through its progress records or
    // the SDK: no zeros for what it never sent.
    std::string line = absl::StrCat(job.job_id(), " ", StateName(job.state()));
    if (m.step() > 0) absl::StrAppend(&line, " step ", m.step());
    if (m.epoch() > 0) absl::StrAppend(&line, " epoch ", m.epoch());
    if (m.loss() != 0) absl::StrAppend(&line, absl::StrFormat(" loss %.4f", m.loss()));
    if (m.has_eval_accuracy())
      absl::StrAppend(&line, absl::StrFormat(" test acc %.4f", m.eval_accuracy()));
    if (m.samples_per_second() > 0)
      absl::StrAppend(&line, absl::StrFormat(" %.0f samples/s", m.samples_per_second()));
    return line;
  }
  auto total = m.values().find("total_steps");
  std::string line =
      absl::StrFormat("%s %s step %d", job.job_id(), StateName(job.state()), m.step());
  if (total != m.values().end()) absl::StrAppend(&line, "/", static_cast<int64_t>(total->second));
  absl::StrAppend(&line, absl::StrFormat(" epoch %d loss %.4f", m.epoch(), m.loss()));
  if (m.has_eval_accuracy())
    absl::StrAppend(&line, absl::StrFormat(" test acc %.4f", m.eval_accuracy()));
  absl::StrAppend(&line, absl::StrFormat(" %.0f samples/s", m.samples_per_second()));
  return line;
}

absl::StatusOr<FollowResult> FollowJob(v1::JobService::Stub& stub, const GlobalOptions& global,
                                       const std::string& job_id, bool cancel_on_interrupt) {
  // Rewrite the line in place only on a terminal (never on an injected stream).
  const bool tty = global.err == &std::cerr && isatty(STDERR_FILENO);
  FollowResult result;
  int64_t last_step = -1;
  v1::Job::State last_state = v1::Job::STATE_UNSPECIFIED;
  while (true) {
    if (Interrupted() && !result.interrupted) {
      result.interrupted = true;
      if (!cancel_on_interrupt) break;
      v1::CancelJobRequest cancel;
      cancel.set_job_id(job_id);
      cancel.set_reason("interrupted (Ctrl-C) by the user following it");
      v1::CancelJobResponse response;
      grpc::ClientContext context;
      SetDeadline(context, global);
      absl::Status s = FromGrpcStatus(stub.CancelJob(&context, cancel, &response));
      if (!s.ok()) *global.err << "could not cancel " << job_id << ": " << s.message() << "\n";
    }
    v1::GetJobRequest get;
    get.set_job_id(job_id);
    grpc::ClientContext context;
    SetDeadline(context, global);
    absl::Status s = FromGrpcStatus(stub.GetJob(&context, get, &result.job));
    if (!s.ok()) return s;
    if (result.job.latest_metrics().step() != last_step || result.job.state() != last_state) {
      last_step = result.job.latest_metrics().step();
      last_state = result.job.state();
      *global.err << (tty ? "\r" : "") << ProgressLine(result.job) << (tty ? "   " : "\n")
                  << std::flush;
    }
    if (Ended(result.job.state())) break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  if (tty) *global.err << "\n";
  return result;
}

int ExitCodeFor(const FollowResult& result) {
  if (result.interrupted) return 130;
  return result.job.state() == v1::Job::SUCCEEDED ? kExitOk : kExitFailure;
}

}  // namespace chorus::client
