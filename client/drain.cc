// chorus drain AGENT: planned removal of a node agent (docs/elastic.md).

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/commands.h"
#include "client/rpc.h"
#include "common/grpc_util.h"

namespace chorus::client {

std::string FormatAgent(const v1::AgentInfo& agent) {
  std::string out = absl::StrCat(agent.agent_id(), " (", agent.host(),
                                 "): ", v1::AgentInfo::State_Name(agent.state()), ", ",
                                 agent.busy_slots(), " of ", agent.slots(), " slot(s) busy");
  if (!agent.jobs().empty()) absl::StrAppend(&out, ", jobs ", absl::StrJoin(agent.jobs(), ","));
  if (agent.state() == v1::AgentInfo::DRAINED)
    absl::StrAppend(&out, " - no rank runs there; the agent can be stopped");
  return out;
}

void AddDrainCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "drain",
      "Drain a node agent: it takes no new ranks; every elastic job with ranks on it re-forms "
      "without them at its next step boundary (no step is lost; not counted as a restart); "
      "other jobs keep their ranks there until they end. Prints the agent's state: DRAINING "
      "while ranks still run on it, DRAINED once none does. There is no undo: restart the "
      "agent to offer its slots again.");
  auto agent = std::make_shared<std::string>();
  auto wait = std::make_shared<double>(0);
  auto json = std::make_shared<bool>(false);
  cmd->add_option("agent", *agent, "Agent id (agent-N, see `chorus agents`) or its host name.")
      ->required();
  cmd->add_option("--wait", *wait,
                  "Wait up to this many seconds for the agent to be DRAINED; exit 1 if it is "
                  "not by then (0 = do not wait).")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", *json, "Print the agent's AgentInfo as JSON (proto field names).");
  cmd->callback([agent, wait, json, &global, &exit_code] {
    v1::DrainAgentRequest request;
    request.set_agent(*agent);
    const absl::Time until = absl::Now() + absl::Seconds(*wait);
    v1::DrainAgentResponse response;
    for (;;) {
      grpc::ClientContext context;
      SetDeadline(context, global);
      absl::Status s = FromGrpcStatus(JobStub(global)->DrainAgent(&context, request, &response));
      if (!s.ok()) {
        exit_code = ReportError("drain", s, global);
        return;
      }
      if (response.agent().state() == v1::AgentInfo::DRAINED || absl::Now() >= until) break;
      absl::SleepFor(absl::Milliseconds(500));
    }
    if (*json) {
      *global.out << ToJson(response.agent());
    } else {
      *global.out << FormatAgent(response.agent()) << "\n";
    }
    const bool waited_in_vain = *wait > 0 && response.agent().state() != v1::AgentInfo::DRAINED;
    if (waited_in_vain) {
      *global.err << "chorus drain: " << response.agent().agent_id() << " is not drained after "
                  << *wait << " s\n";
    }
    exit_code = waited_in_vain ? kExitFailure : kExitOk;
  });
}

void AddAgentsCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "agents", "List the connected node agents: slots, state (ACTIVE, DRAINING, DRAINED), jobs.");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print the ListAgentsResponse as JSON (proto field names).");
  cmd->callback([json, &global, &exit_code] {
    v1::ListAgentsResponse response;
    grpc::ClientContext context;
    SetDeadline(context, global);
    absl::Status s =
        FromGrpcStatus(JobStub(global)->ListAgents(&context, v1::ListAgentsRequest(), &response));
    if (!s.ok()) {
      exit_code = ReportError("agents", s, global);
      return;
    }
    if (*json) {
      *global.out << ToJson(response);
    } else if (response.agents().empty()) {
      *global.out << "no agents\n";
    } else {
      for (const v1::AgentInfo& a : response.agents()) *global.out << FormatAgent(a) << "\n";
    }
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
