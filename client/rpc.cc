#include "client/rpc.h"

#include <iostream>

#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "google/protobuf/util/json_util.h"

namespace chorus::client {

std::unique_ptr<v1::JobService::Stub> JobStub(const GlobalOptions& global) {
  return v1::JobService::NewStub(MakeCoordinatorChannel(global.coordinator));
}

void SetDeadline(grpc::ClientContext& context, const GlobalOptions& global) {
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(global.timeout_seconds)));
}

int ReportError(const std::string& command, const absl::Status& status,
                const GlobalOptions& global) {
  std::cerr << "chorus " << command << ": " << status.message();
  if (status.code() == absl::StatusCode::kUnavailable ||
      status.code() == absl::StatusCode::kDeadlineExceeded) {
    std::cerr << " (coordinator " << global.coordinator
              << "; is it running? `chorus ping` checks, --coordinator picks another)";
  }
  std::cerr << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure;
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.add_whitespace = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string FormatTime(int64_t unix_us) {
  if (unix_us == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMicros(unix_us),
                          absl::LocalTimeZone());
}

std::string StateName(v1::Job::State state) { return v1::Job::State_Name(state); }

}  // namespace chorus::client
