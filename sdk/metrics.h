// MetricsReporter: a program's metrics to `chorus watch` and `chorus
// status`, sent with the coordinator's Report RPC as the built-in trainer's
// are (final=false: the supervising chorus-rank sends the final report
// when the program exits). Best effort: one attempt with a deadline; a
// coordinator that cannot be reached costs at most `timeout` and the
// metrics are dropped (the next report carries newer ones).
//
// Thread-safety: Report may be called from any thread.
//
// Example:
//   MetricsReporter metrics(channel, "job-000001", /*generation=*/1, /*rank=*/0);
//   v1::Metrics m;
//   m.set_step(100);
//   m.set_loss(0.42);
//   (*m.mutable_values())["episode_return"] = 17.5;
//   RETURN_IF_ERROR(metrics.Report(m));
#ifndef CHORUS_SDK_METRICS_H_
#define CHORUS_SDK_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace chorus {

class MetricsReporter {
 public:
  MetricsReporter(std::shared_ptr<grpc::Channel> channel, std::string job_id, int64_t generation,
                  int rank, absl::Duration timeout = absl::Seconds(10));

  // Sends `metrics` as this rank's (not final) report. The coordinator's
  // error, with its code, when it refuses or cannot be reached in time.
  absl::Status Report(const v1::Metrics& metrics);

  // Report in two halves, for a caller that sends from a thread of its own
  // (Session::ReportMetrics): the request Report sends for `metrics`, and
  // one attempt to send `request` by `deadline`, with Report's errors.
  // Send may be called from any thread.
  v1::ReportRequest Request(const v1::Metrics& metrics) const;
  absl::Status Send(const v1::ReportRequest& request, absl::Time deadline) const;

 private:
  std::unique_ptr<v1::RankService::Stub> stub_;
  const std::string job_id_;
  const int64_t generation_;
  const int rank_;
  const absl::Duration timeout_;
};

}  // namespace chorus

#endif  // CHORUS_SDK_METRICS_H_
