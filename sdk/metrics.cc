#include "chorus/metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"

namespace chorus {

MetricsReporter::MetricsReporter(std::shared_ptr<grpc::Channel> channel, std::string job_id,
                                 int64_t generation, int rank, absl::Duration timeout)
    : stub_(v1::RankService::NewStub(channel)),
      job_id_(std::move(job_id)),
      generation_(generation),
      rank_(rank),
      timeout_(timeout) {}

absl::Status MetricsReporter::Report(const v1::Metrics& metrics) {
  return Send(Request(metrics), absl::Now() + timeout_);
}

v1::ReportRequest MetricsReporter::Request(const v1::Metrics& metrics) const {
  v1::ReportRequest request;
  request.set_job_id(job_id_);
  request.set_generation(generation_);
  request.set_rank(rank_);
  *request.mutable_metrics() = metrics;
  request.set_final(false);
  request.set_success(true);
  return request;
}

absl::Status MetricsReporter::Send(const v1::ReportRequest& request, absl::Time deadline) const {
  v1::ReportResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  absl::Status s = FromGrpcStatus(stub_->Report(&context, request, &response));
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("reporting metrics of step ", request.metrics().step(),
                                     " to the coordinator: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace chorus
