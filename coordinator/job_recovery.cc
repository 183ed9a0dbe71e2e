#include "coordinator/job_recovery.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace chorus {

RunningJob RecoveredJob(const v1::Job& job, absl::Time until) {
  RunningJob run(job, job.placements_size(), job.generation());
  run.recovering_until = until;
  for (const v1::RankPlacement& placement : job.placements()) {
    RankState rank;
    rank.slot = placement.slot();
    rank.local_rank = placement.local_rank();
    rank.local_world_size = placement.local_world_size();
    rank.state = v1::RankStatus::LOST;
    rank.recover_host = placement.host();
    rank.recover_agent_pid = placement.agent_pid();
    run.rendezvous.MarkJoined(static_cast<int>(run.ranks.size()));
    run.ranks.push_back(std::move(rank));
  }
  return run;
}

std::map<std::string, std::vector<int>> RebindRanks(
    std::map<std::string, RunningJob>& running, const std::string& agent_id,
    const v1::AgentHello& hello, std::vector<std::pair<std::string, int>>* bound) {
  std::map<std::string, std::vector<int>> orphans;
  for (const v1::RunningRank& reported : hello.running()) {
    auto run = running.find(reported.job_id());
    RankState* match = nullptr;
    if (run != running.end() && run->second.generation() == reported.generation()) {
      for (RankState& rank : run->second.ranks) {
        if (rank.agent_id.empty() && rank.recover_host == hello.host() &&
            rank.recover_agent_pid == hello.pid() && rank.slot == reported.slot()) {
          match = &rank;
        }
      }
    }
    if (match == nullptr || reported.slot() < 0 || reported.slot() >= hello.slots()) {
      orphans[reported.job_id()].push_back(reported.slot());
      continue;
    }
    match->agent_id = agent_id;
    match->pid = reported.pid();
    match->state = v1::RankStatus::TRAINING;
    bound->emplace_back(reported.job_id(), reported.slot());
  }
  return orphans;
}

RecoveryProgress CheckRecovery(RunningJob& run, absl::Time now) {
  RecoveryProgress progress;
  if (run.recovering_until == absl::InfinitePast()) return progress;
  const int missing =
      static_cast<int>(std::count_if(run.ranks.begin(), run.ranks.end(),
                                     [](const RankState& rank) { return rank.agent_id.empty(); }));
  if (missing == 0) {
    run.recovering_until = absl::InfinitePast();
    progress.all_back = true;
  } else if (now > run.recovering_until) {
    progress.failure = absl::StrCat(missing, " of ", run.ranks.size(),
                                    " rank(s) did not come back after the coordinator restarted");
  }
  return progress;
}

}  // namespace chorus
