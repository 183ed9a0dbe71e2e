// chorus coordinators: every coordinator of --coordinator, whether it
// answers, which one leads and since when.

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "client/rpc.h"
#include "common/grpc_util.h"
#include "common/host_port.h"
#include "common/json.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"

namespace chorus::client {
namespace {

using grpc::health::v1::HealthCheckResponse;

// What one coordinator said.
struct Answer {
  std::string address;
  std::string role;            // leader, follower, unreachable, unknown
  std::string leader;          // HOST:PORT of the leader it names; empty if none
  v1::CoordinatorLeader info;  // the leader's own report (role leader)
  std::string detail;          // why unreachable or unknown
};

// The trailing metadata a follower names the leader in ("chorus-leader").
std::string LeaderNamedBy(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto found = trailers.find("chorus-leader");
  if (found == trailers.end()) return "";
  return std::string(found->second.data(), found->second.size());
}

Answer Ask(const std::string& address, absl::Duration timeout) {
  Answer answer;
  answer.address = address;
  std::shared_ptr<grpc::Channel> channel = MakeCoordinatorChannel(address);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(kLeaderHealthService);
  HealthCheckResponse health;
  grpc::ClientContext health_context;
  health_context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  health_context.set_wait_for_ready(true);  // connect within the timeout
  const grpc::Status checked =
      grpc::health::v1::Health::NewStub(channel)->Check(&health_context, request, &health);
  if (checked.error_code() == grpc::StatusCode::NOT_FOUND) {
    answer.role = "unknown";
    answer.detail = "it reports no leadership (a chorus-coordinator older than leader election)";
    return answer;
  }
  if (!checked.ok()) {
    answer.role = "unreachable";
    answer.detail = checked.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                        ? absl::StrCat("no answer within ", absl::FormatDuration(timeout))
                        : checked.error_message();
    return answer;
  }
  answer.role = health.status() == HealthCheckResponse::SERVING ? "leader" : "follower";
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const grpc::Status asked =
      v1::JobService::NewStub(channel)->GetLeader(&context, v1::GetLeaderRequest(), &answer.info);
  if (asked.ok()) {
    answer.leader = answer.info.address().empty() ? address : answer.info.address();
  } else {
    answer.leader = LeaderNamedBy(context);
    if (answer.leader.empty()) answer.detail = asked.error_message();
  }
  return answer;
}

void PrintJson(const std::vector<Answer>& answers, std::ostream& out) {
  out << "{\"coordinators\": [";
  for (size_t i = 0; i < answers.size(); ++i) {
    const Answer& a = answers[i];
    out << (i == 0 ? "" : ", ") << "{\"coordinator\": " << JsonString(a.address)
        << ", \"role\": " << JsonString(a.role) << ", \"leader\": " << JsonString(a.leader);
    if (a.role == "leader") {
      out << ", \"id\": " << JsonString(a.info.id())
          << ", \"http_url\": " << JsonString(a.info.http_url())
          << ", \"since_unix_us\": " << a.info.since_unix_us();
    }
    if (!a.detail.empty()) out << ", \"detail\": " << JsonString(a.detail);
    out << "}";
  }
  out << "]}\n";
}

void PrintTable(const std::vector<Answer>& answers, std::ostream& out) {
  out << absl::StrFormat("%-24s %-12s %-24s %-20s %s\n", "COORDINATOR", "ROLE", "LEADER",
                         "LEADS SINCE", "DETAIL");
  for (const Answer& a : answers) {
    std::string detail = a.detail;
    if (a.role == "leader" && !a.info.id().empty()) detail = absl::StrCat("id ", a.info.id());
    out << absl::StrFormat("%-24s %-12s %-24s %-20s %s\n", a.address, a.role,
                           a.leader.empty() ? "-" : a.leader,
                           a.role == "leader" ? FormatTime(a.info.since_unix_us()) : "-", detail);
  }
}

}  // namespace

void AddCoordinatorsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "coordinators",
      "Ask every coordinator of --coordinator (a:29650,b:29650,...) whether it answers and "
      "which one leads, since when. Exits 0 when exactly one leads and every one that answers "
      "agrees, 1 otherwise.");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json,
                "Print {\"coordinators\": [{\"coordinator\", \"role\", \"leader\", ...}]}.");
  cmd->callback([json, &global, &exit_code] {
    absl::StatusOr<std::vector<HostPort>> list = ParseHostPortList(global.coordinator);
    if (!list.ok()) {
      *global.err << "chorus coordinators: --coordinator: " << list.status().message() << "\n";
      exit_code = kExitBadInput;
      return;
    }
    ConfigureSecurity(global);
    std::vector<Answer> answers(list->size());
    std::vector<std::thread> askers;
    for (size_t i = 0; i < list->size(); ++i) {
      askers.emplace_back([&, i] {
        answers[i] = Ask(FormatHostPort((*list)[i].host, (*list)[i].port),
                         absl::Seconds(global.timeout_seconds));
      });
    }
    for (std::thread& asker : askers) asker.join();
    if (*json) {
      PrintJson(answers, *global.out);
    } else {
      PrintTable(answers, *global.out);
    }
    int leaders = 0;
    bool agree = true;
    std::string leader;
    for (const Answer& a : answers) {
      if (a.role != "leader") continue;
      ++leaders;
      leader = a.leader;
    }
    for (const Answer& a : answers) {
      if ((a.role == "leader" || a.role == "follower") && a.leader != leader) agree = false;
    }
    exit_code = leaders == 1 && agree ? kExitOk : kExitFailure;
  });
}

}  // namespace chorus::client
