#include "coordinator/scheduling/staged_growth.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace chorus {

const std::vector<StagedNewcomer>& StagedGrowth::newcomers() const {
  static const std::vector<StagedNewcomer>* const kNone = new std::vector<StagedNewcomer>();
  return growth_.has_value() ? growth_->newcomers : *kNone;
}

void StagedGrowth::Start(int64_t generation, int world_size, std::string cause,
                         std::vector<StagedNewcomer> newcomers, absl::Time now,
                         absl::Duration wait) {
  CHECK(!growth_.has_value()) << "a growth is staged already";
  growth_ = StagedGrowthState{generation,           world_size, std::move(cause),
                              std::move(newcomers), now + wait, wait};
}

StagedGrowth::JoinOutcome StagedGrowth::OnJoin(const std::string& agent_id, int slot,
                                               int64_t generation, bool starts_program_first,
                                               bool change_requested) {
  JoinOutcome outcome;
  if (!growth_.has_value() || generation != growth_->generation) return outcome;
  std::vector<StagedNewcomer>& newcomers = growth_->newcomers;
  auto newcomer = std::find_if(newcomers.begin(), newcomers.end(), [&](const StagedNewcomer& n) {
    return n.slot.agent_id == agent_id && n.slot.slot == slot;
  });
  if (newcomer == newcomers.end()) return outcome;
  if (starts_program_first) {
    outcome.kind = JoinOutcome::kStartsProgram;
  } else {
    outcome.kind = JoinOutcome::kUp;
    newcomer->up = true;
    const bool all_up = std::all_of(newcomers.begin(), newcomers.end(),
                                    [](const StagedNewcomer& n) { return n.up; });
    outcome.request_change = all_up && !change_requested;
  }
  outcome.newcomer = *newcomer;
  return outcome;
}

std::optional<StagedGrowth::Actions> StagedGrowth::OnExited(const std::string& agent_id, int slot,
                                                            bool change_requested) {
  if (!growth_.has_value()) return std::nullopt;
  std::vector<StagedNewcomer>& newcomers = growth_->newcomers;
  auto gone = std::find_if(newcomers.begin(), newcomers.end(), [&](const StagedNewcomer& n) {
    return n.slot.agent_id == agent_id && n.slot.slot == slot;
  });
  if (gone == newcomers.end()) return std::nullopt;
  newcomers.erase(gone);
  Actions actions;
  if (!change_requested || newcomers.empty()) {
    actions = Drop("another newcomer of the growth exited");
  }
  actions.freed.emplace_back(agent_id, slot);
  return actions;
}

StagedGrowth::Actions StagedGrowth::OnTick(absl::Time now, bool change_requested) {
  if (!growth_.has_value() || change_requested || now < growth_->deadline) return Actions();
  return Drop(absl::StrCat("not up within elastic.wait_seconds ",
                           absl::ToInt64Seconds(growth_->wait), " s"));
}

StagedGrowth::Actions StagedGrowth::OnGenerationBegun(const std::vector<RankSlot>& next_ranks) {
  if (!growth_.has_value()) return Actions();
  std::vector<std::pair<std::string, int>> adopted;
  std::vector<StagedNewcomer> left;
  for (const StagedNewcomer& n : growth_->newcomers) {
    const bool taken = std::any_of(next_ranks.begin(), next_ranks.end(), [&](const RankSlot& r) {
      return r.agent_id == n.slot.agent_id && r.slot == n.slot.slot;
    });
    if (taken) {
      adopted.emplace_back(n.slot.agent_id, n.slot.slot);
    } else {
      left.push_back(n);
    }
  }
  growth_->newcomers = std::move(left);
  Actions actions = Drop("the next generation does not take them");
  actions.adopted = std::move(adopted);
  return actions;
}

StagedGrowth::Actions StagedGrowth::Drop(const std::string& why) {
  Actions actions;
  if (!growth_.has_value()) return actions;
  for (const StagedNewcomer& n : growth_->newcomers) {
    actions.stop[n.slot.agent_id].push_back(n.slot.slot);
  }
  if (!actions.stop.empty())
    actions.stop_reason = absl::StrCat("staged newcomer(s) stopped: ", why);
  growth_.reset();
  return actions;
}

std::vector<AgentSlots> StagedGrowth::SlotsFirst(const AgentRegistry& agents,
                                                 std::vector<AgentSlots> free) const {
  if (!growth_.has_value()) return free;
  std::vector<AgentSlots> staged;
  for (const StagedNewcomer& n : growth_->newcomers) {
    const AgentRegistry::Agent* agent = agents.Find(n.slot.agent_id);
    if (agent == nullptr || agent->draining) continue;  // not taken: stopped
    auto same = std::find_if(staged.begin(), staged.end(),
                             [&](const AgentSlots& a) { return a.agent_id == n.slot.agent_id; });
    if (same == staged.end()) {
      same = staged.insert(staged.end(), AgentSlots{});
      same->agent_id = n.slot.agent_id;
      same->device = agent->hello.device();
      same->memory_bytes = agent->hello.memory_bytes();
      same->host = agent->hello.host();
      same->total_slots = static_cast<int>(agent->busy.size());
    }
    same->free_slots.push_back(n.slot.slot);
  }
  for (AgentSlots& a : staged) std::sort(a.free_slots.begin(), a.free_slots.end());
  staged.insert(staged.end(), std::make_move_iterator(free.begin()),
                std::make_move_iterator(free.end()));
  return staged;
}

}  // namespace chorus
