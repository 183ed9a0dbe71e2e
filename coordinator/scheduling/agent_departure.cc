#include "coordinator/scheduling/agent_departure.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace chorus {
namespace {

// Note [Agent reconnect grace] in running_job.h: `run`'s ranks on the lost
// agent become unbound and are awaited for `grace`.
AgentLoss Await(RunningJob& run, const std::string& agent_id, const v1::AgentHello& lost,
                const std::string& lost_what, absl::Duration grace, absl::Time now) {
  const std::vector<int> waiting = run.AwaitAgent(agent_id, lost.host(), lost.pid());
  if (waiting.empty()) return {};  // only departing ranks ran there
  // A job already waiting (after a restart, another lost agent) keeps the
  // later deadline.
  run.AwaitLostAgent(LostAgentWait{agent_id, lost.host(), waiting, grace}, now + grace);
  return {AgentLoss::Kind::kAwait,
          absl::StrCat(lost_what, ", which ran rank(s) ", absl::StrJoin(waiting, ","),
                       "; waiting up to ", absl::FormatDuration(grace), " for it to reconnect")};
}

}  // namespace

AgentLoss OnAgentLost(RunningJob& run, const std::string& agent_id, const v1::AgentHello& hello,
                      absl::Duration reconnect_grace, bool rebinding, absl::Time now) {
  const std::string lost =
      absl::StrCat("lost contact with the agent on ", hello.host(), " (", agent_id, ")");
  // Ranks that had already left with a drain are gone with it.
  run.mutable_leaving().OnAgentGone(agent_id);
  if (run.elastic && rebinding) {
    // Note [An agent back before its stream ended].
    if (run.AwaitAgent(agent_id, hello.host(), hello.pid()).empty()) return {};
    return {AgentLoss::Kind::kRebind, ""};
  }
  if (run.elastic && reconnect_grace > absl::ZeroDuration()) {
    return Await(run, agent_id, hello, lost, std::min(reconnect_grace, kElasticAgentGrace), now);
  }
  if (run.elastic) {
    std::vector<int> there;
    for (size_t rank = 0; rank < run.ranks().size(); ++rank) {
      if (run.ranks()[rank].agent_id == agent_id) there.push_back(static_cast<int>(rank));
    }
    if (there.empty()) return {};
    return {AgentLoss::Kind::kReform,
            absl::StrCat(lost, ", which ran rank(s) ", absl::StrJoin(there, ","))};
  }
  if (reconnect_grace > absl::ZeroDuration()) {
    return Await(run, agent_id, hello, lost, reconnect_grace, now);
  }
  return {AgentLoss::Kind::kFail, absl::StrCat(lost, ", which ran ranks of this job")};
}

std::string GiveUpLostAgents(RunningJob& run) {
  std::vector<std::string> lost;
  for (const LostAgentWait& w : run.wait_cause().lost_agents) {
    std::vector<int> missing;
    for (int rank : w.ranks) {
      // On the agent that is gone, as when the job re-formed at once: the
      // re-formation counts such ranks as lost, not as awaited.
      if (run.GiveUpRank(rank, w.agent_id)) missing.push_back(rank);
    }
    if (missing.empty()) continue;
    lost.push_back(absl::StrCat("lost contact with the agent on ", w.host, " (", w.agent_id,
                                "), which ran rank(s) ", absl::StrJoin(missing, ","),
                                ", and it was not back within ", absl::FormatDuration(w.grace)));
  }
  run.StopAwaiting();
  return absl::StrJoin(lost, "; ");
}

std::string GiveUpUnbound(RunningJob& run, const v1::AgentHello& agent) {
  std::vector<int> gone;
  for (size_t rank = 0; rank < run.ranks().size(); ++rank) {
    const RankState& r = run.ranks()[rank];
    if (r.agent_id.empty() && r.state == v1::RankStatus::LOST && r.recover_host == agent.host() &&
        r.recover_agent_pid == agent.pid()) {
      // The old registration, gone: lost, not awaited.
      run.GiveUpRank(static_cast<int>(rank), agent.agent_id());
      gone.push_back(static_cast<int>(rank));
    }
  }
  if (gone.empty()) return "";
  return absl::StrCat("the agent on ", agent.host(), " connected again without rank(s) ",
                      absl::StrJoin(gone, ","));
}

AgentDrain OnAgentDrained(const RunningJob& run, const std::string& agent_id,
                          const std::string& who) {
  std::vector<int> here;
  for (size_t rank = 0; rank < run.ranks().size(); ++rank) {
    if (run.ranks()[rank].agent_id == agent_id &&
        run.ranks()[rank].state != v1::RankStatus::EXITED) {
      here.push_back(static_cast<int>(rank));
    }
  }
  if (here.empty()) return {};
  if (run.elastic) {
    return {AgentDrain::Kind::kReform,
            absl::StrCat(who, " was drained: rank(s) ", absl::StrJoin(here, ","), " leave")};
  }
  return {AgentDrain::Kind::kStays,
          absl::StrCat(who, " is draining; the job is not elastic: rank(s) ",
                       absl::StrJoin(here, ","), " keep running there until the job ends")};
}

}  // namespace chorus
