#include "coordinator/scheduling/leaving_ranks.h"

namespace chorus {

void LeavingRanks::Yield(const std::string& agent_id, int slot) {
  states_[{agent_id, slot}] = State::kYielding;
}

void LeavingRanks::Depart(const std::string& agent_id, int slot) {
  states_[{agent_id, slot}] = State::kDeparting;
}

void LeavingRanks::OnGenerationBegun(const std::vector<Slot>& left) {
  for (auto it = states_.begin(); it != states_.end();) {
    it = it->second == State::kYielding ? states_.erase(it) : std::next(it);
  }
  for (const Slot& slot : left) states_[slot] = State::kDeparting;
}

bool LeavingRanks::OnExited(const std::string& agent_id, int slot) {
  auto it = states_.find({agent_id, slot});
  if (it == states_.end() || it->second != State::kDeparting) return false;
  states_.erase(it);
  return true;
}

void LeavingRanks::OnAgentGone(const std::string& agent_id) {
  for (auto it = states_.begin(); it != states_.end();) {
    it = it->first.first == agent_id && it->second == State::kDeparting ? states_.erase(it)
                                                                        : std::next(it);
  }
}

bool LeavingRanks::yielding(const std::string& agent_id, int slot) const {
  auto it = states_.find({agent_id, slot});
  return it != states_.end() && it->second == State::kYielding;
}

bool LeavingRanks::departing(const std::string& agent_id, int slot) const {
  auto it = states_.find({agent_id, slot});
  return it != states_.end() && it->second == State::kDeparting;
}

std::vector<LeavingRanks::Slot> LeavingRanks::Departing() const {
  std::vector<Slot> slots;
  for (const auto& [slot, state] : states_) {
    if (state == State::kDeparting) slots.push_back(slot);
  }
  return slots;
}

bool LeavingRanks::DepartingOn(const std::string& agent_id) const {
  for (const auto& [slot, state] : states_) {
    if (slot.first == agent_id && state == State::kDeparting) return true;
  }
  return false;
}

}  // namespace chorus
