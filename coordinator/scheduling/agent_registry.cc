#include "coordinator/scheduling/agent_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace chorus {

absl::StatusOr<std::string> AgentRegistry::Add(const v1::AgentHello& hello, AgentSender send) {
  if (hello.slots() < 1 || hello.slots() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("agent hello: slots must be in [1, 1024], got ", hello.slots()));
  }
  // The host names the agent in status rows and labels metrics series: a
  // host name as DNS allows it (at most 253 characters), printable.
  const std::string& host = hello.host();
  if (host.size() > 253 || std::any_of(host.begin(), host.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
      })) {
    return absl::InvalidArgumentError(
        absl::StrCat("agent hello: host must be at most 253 printable characters, got ",
                     host.size(), " bytes; start the agent with --host NAME"));
  }
  std::string id = absl::StrCat("agent-", next_agent_);
  Agent& agent = agents_[id];
  agent.hello = hello;
  if (agent.hello.device() == v1::ResourceSpec::DEVICE_UNSPECIFIED)
    agent.hello.set_device(v1::ResourceSpec::CPU);
  agent.send = std::move(send);
  agent.busy.assign(hello.slots(), false);
  agent.order = next_agent_++;
  return id;
}

bool AgentRegistry::Remove(const std::string& agent_id) { return agents_.erase(agent_id) > 0; }

const AgentRegistry::Agent* AgentRegistry::Find(const std::string& agent_id) const {
  auto it = agents_.find(agent_id);
  return it == agents_.end() ? nullptr : &it->second;
}

void AgentRegistry::SetBusy(const std::string& agent_id, int slot, bool busy) {
  auto it = agents_.find(agent_id);
  if (it == agents_.end() || slot < 0 || slot >= static_cast<int>(it->second.busy.size())) return;
  it->second.busy[slot] = busy;
}

bool AgentRegistry::SetDraining(const std::string& agent_id) {
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return false;
  it->second.draining = true;
  return true;
}

void AgentRegistry::Heard(const std::string& agent_id, absl::Time at, double cpu_pressure) {
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return;
  it->second.heard_at = at;
  it->second.cpu_pressure = cpu_pressure;
}

std::optional<std::string> AgentRegistry::StillOpen(const v1::AgentHello& hello) const {
  if (hello.pid() == 0 || hello.agent_id().empty()) return std::nullopt;
  const Agent* agent = Find(hello.agent_id());
  if (agent == nullptr || agent->hello.host() != hello.host() ||
      agent->hello.pid() != hello.pid()) {
    return std::nullopt;
  }
  return hello.agent_id();
}

std::vector<std::string> AgentRegistry::Ids() const {
  std::vector<std::pair<int64_t, std::string>> in_order;
  for (const auto& [id, agent] : agents_) in_order.emplace_back(agent.order, id);
  std::sort(in_order.begin(), in_order.end());
  std::vector<std::string> ids;
  for (auto& [order, id] : in_order) ids.push_back(std::move(id));
  return ids;
}

absl::StatusOr<std::string> AgentRegistry::Resolve(const std::string& name) const {
  if (agents_.count(name) > 0) return name;
  std::vector<std::string> with_host;
  std::vector<std::string> known;
  for (const std::string& id : Ids()) {
    const std::string& host = agents_.at(id).hello.host();
    if (host == name) with_host.push_back(id);
    known.push_back(absl::StrCat(id, " (", host, ")"));
  }
  if (with_host.size() == 1) return with_host.front();
  if (with_host.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(with_host.size(), " agents run on host \"", name,
                                                   "\": name one by its id (",
                                                   absl::StrJoin(with_host, ", "), ")"));
  }
  return absl::NotFoundError(absl::StrCat("no agent \"", name, "\"; connected agents: ",
                                          known.empty() ? "none" : absl::StrJoin(known, ", ")));
}

std::vector<AgentSlots> AgentRegistry::FreeSlots() const {
  std::vector<const std::pair<const std::string, Agent>*> in_order;
  for (const auto& entry : agents_) in_order.push_back(&entry);
  std::sort(in_order.begin(), in_order.end(),
            [](const auto* a, const auto* b) { return a->second.order < b->second.order; });
  std::vector<AgentSlots> free;
  for (const auto* entry : in_order) {
    if (entry->second.draining) continue;
    AgentSlots& slots = free.emplace_back();
    slots.agent_id = entry->first;
    slots.device = entry->second.hello.device();
    slots.memory_bytes = entry->second.hello.memory_bytes();
    slots.host = entry->second.hello.host();
    slots.total_slots = static_cast<int>(entry->second.busy.size());
    for (int s = 0; s < static_cast<int>(entry->second.busy.size()); ++s) {
      if (!entry->second.busy[s]) slots.free_slots.push_back(s);
    }
  }
  return free;
}

std::map<v1::ResourceSpec::Device, AgentRegistry::SlotCount> AgentRegistry::SlotsByDevice() const {
  std::map<v1::ResourceSpec::Device, SlotCount> out;
  for (const auto& [id, agent] : agents_) {
    SlotCount& count = out[agent.hello.device()];
    for (bool busy : agent.busy) ++(busy ? count.used : count.free);
  }
  return out;
}

int AgentRegistry::free_slots() const {
  int free = 0;
  for (const auto& [id, agent] : agents_) {
    if (agent.draining) continue;
    free += static_cast<int>(std::count(agent.busy.begin(), agent.busy.end(), false));
  }
  return free;
}

v1::CoordinatorMessage StopRanksMessage(const std::string& job_id, const std::vector<int>& slots,
                                        const std::string& reason) {
  v1::CoordinatorMessage m;
  m.mutable_stop()->set_job_id(job_id);
  for (int slot : slots) m.mutable_stop()->add_slots(slot);
  m.mutable_stop()->set_grace_seconds(10);
  m.mutable_stop()->set_reason(reason);
  return m;
}

}  // namespace chorus
